"""One attempt's signed evidence bundle, on request (EvidenceBundleWorkflow; a landed change's is signed by the land
step itself). The signing key stays in the control pool (the activity: crewwork/steps/bundle/activity.py)."""

from __future__ import annotations

from pydantic import BaseModel

from crewwork.models import ArtifactRef
from crewwork.steps.step import Step


class AttemptBundleInput(BaseModel):
    """Sign one attempt's evidence on request (EvidenceBundleWorkflow -> sign_attempt_bundle)."""

    work_item_id: str
    tenant_id: str
    attempt: int


SIGN_ATTEMPT_BUNDLE = Step("sign_attempt_bundle", AttemptBundleInput, ArtifactRef, pool=None)
