"""Timeouts, retry policies and search attributes of WorkItemWorkflow (docs/reliability.md has the table and why).

Workflow code: constants only, deterministic."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from crewwork.activities.errors import NON_RETRYABLE

CONTROL_TIMEOUT = timedelta(seconds=30)
CONTROL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=8,
    non_retryable_error_types=list(NON_RETRYABLE),
)
EXECUTION_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
    non_retryable_error_types=list(NON_RETRYABLE),
)
"""Agent runs and validations: a few tries, for infrastructure faults (a killed pool, a sandbox that failed)."""
AGENT_START_TO_CLOSE = timedelta(minutes=30)
EXECUTION_HEARTBEAT = timedelta(seconds=10)
VALIDATE_MARGIN = timedelta(minutes=2)
QUEUE_POLL = timedelta(seconds=20)
QUEUE_POLL_MAX = timedelta(seconds=120)
"""A queued item is admitted by the write of the item whose place it takes (`FencingStore.hand_off`) and told so by
the `admitted` signal; it re-runs admission on this backoff timer only as a fallback: for a signal that was lost
(the control process died between the write and the signal), or places freed without a hand-off (the operator
raised the limit). So it is long: at 5 s doubling to 30 s, on a loaded machine where a queue wait is half a minute,
the timers still gave a queued item 1.2 extra workflow tasks and admission transactions (bench/trace.py)."""
WORKSPACE_POLL = timedelta(seconds=2)
WORKSPACE_POLL_MAX = timedelta(seconds=30)
WORKSPACE_LEASE_TTL_S = 600.0
REVIEW_LEASE_TTL_S = 3600.0
REVIEW_RENEW_EVERY = timedelta(minutes=20)
"""While awaiting review, the workspace lease is renewed this often (well inside its TTL), for as long as a review
may take (30 days by default) in a few thousand history events."""
ATTEMPTS_PER_RUN = 20
"""Attempts per workflow run before continue-as-new (Temporal may suggest it sooner)."""

SA_STATE = SearchAttributeKey.for_keyword("CrewworkState")
SA_KIND = SearchAttributeKey.for_keyword("CrewworkKind")
SA_TENANT = SearchAttributeKey.for_keyword("CrewworkTenant")
SA_REPO = SearchAttributeKey.for_keyword("CrewworkRepo")
