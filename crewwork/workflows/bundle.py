"""EvidenceBundleWorkflow: sign one attempt's evidence on request, in the control pool (which alone holds the
signing key). One activity; started by the API (`POST /v1/work-items/{id}/evidence-bundle?attempt=N`).

Deterministic code only."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from crewwork.models import ArtifactRef
    from crewwork.steps.bundle import SIGN_ATTEMPT_BUNDLE, AttemptBundleInput
    from crewwork.workflows.calls import execute


def bundle_workflow_id(work_item_id: str, attempt: int) -> str:
    return f"evidence-bundle-{work_item_id}-{attempt}"


@workflow.defn(name="EvidenceBundleWorkflow")
class EvidenceBundleWorkflow:
    @workflow.run
    async def run(self, inp: AttemptBundleInput) -> ArtifactRef:
        return await execute(SIGN_ATTEMPT_BUNDLE, inp)
