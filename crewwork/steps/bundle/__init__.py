"""One attempt's signed evidence bundle, on request (EvidenceBundleWorkflow; a landed change's is signed by the land
step itself). The signing key stays in the control pool (the activity: crewwork/steps/bundle/activity.py).

    contract.py  what the workflow sees: the step's input and result models and its `Step` policy
    activity.py  the activity, a plain function of explicit ports (loaded by the pools only)
"""

from __future__ import annotations

from crewwork.steps.bundle.contract import (
    SIGN_ATTEMPT_BUNDLE,
    AttemptBundleInput,
)

__all__ = [
    "SIGN_ATTEMPT_BUNDLE",
    "AttemptBundleInput",
]
