"""One attempt's validation: the captured diff applied to the base tree, protected paths put back, the repository's
own tests (and, where declared, preview probes) run in a fresh sandbox, the evidence graded by a pure function (the
activity: crewwork/steps/validate/activity.py).

    contract.py  what the workflow sees: the step's input and result models and its `Step` policy
    activity.py  the activity, a plain function of explicit ports (loaded by the pools only)
    extra_runs.py  the baseline on the base commit and the flaky reruns (validation.baseline)
    check_runs.py  the named checks (validation.checks), each in its own sandbox beside the tests
    setup.py     the plan a repository's environment is prepared with
    output.py    how much of a run's output the evidence carries
"""

from __future__ import annotations

from crewwork.steps.validate.contract import (
    VALIDATE,
    VALIDATE_MARGIN,
    ValidateInput,
    validation_budget_s,
)

__all__ = [
    "VALIDATE",
    "VALIDATE_MARGIN",
    "ValidateInput",
    "validation_budget_s",
]
