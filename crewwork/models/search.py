"""The search attributes of WorkItemWorkflow (what the Temporal Web UI filters work items on). Here, below every
package that starts a workflow (the API's service, the hand-off, the reconciler), so none of them needs to import the
workflow package; crewwork.workflows.policies re-exports them for workflow code."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

SA_STATE = SearchAttributeKey.for_keyword("CrewworkState")
SA_KIND = SearchAttributeKey.for_keyword("CrewworkKind")
SA_TENANT = SearchAttributeKey.for_keyword("CrewworkTenant")
SA_REPO = SearchAttributeKey.for_keyword("CrewworkRepo")
