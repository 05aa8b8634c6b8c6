"""One attempt's validation: the captured diff applied to the base tree, protected paths put back, the repository's
own tests (and, where declared, preview probes) run in a fresh sandbox, the evidence graded by a pure function (the
activity: crewwork/steps/validate/activity.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from crewwork.models import (
    ArtifactRef,
    CheckSpec,
    DiffStats,
    EnvironmentSpec,
    SandboxSpec,
    ValidationOutcome,
    ValidationSpec,
)
from crewwork.steps.step import EXECUTION_HEARTBEAT, EXECUTION_RETRY, ItemRef, Step

VALIDATE_MARGIN = timedelta(minutes=2)


class ValidateInput(ItemRef):
    attempt: int
    repo_path: str
    base_commit: str
    validation: ValidationSpec
    sandbox: SandboxSpec
    diff_ref: ArtifactRef | None = None
    diff_stats: DiffStats | None = None
    review_comment: str | None = None
    environment: EnvironmentSpec | None = None
    """The repository's environment (resolved at submission): setup, interpreter, setup network and secrets."""


def validation_budget_s(validation: ValidationSpec, environment: EnvironmentSpec | None) -> float:
    """Start-to-close budget of one validation: its run, each setup command, the environment's setup, the preview,
    and the baseline and reruns when asked for."""
    total = validation.timeout_s * (1 + len(validation.setup))
    if environment is not None:
        total += environment.setup_timeout_s * (len(environment.setup) + (1 if environment.python else 0))
    if validation.preview is not None:
        total += validation.preview.lifetime_s
    if validation.baseline != "off":
        # The baseline on the base commit and the reruns of the change's tree (crewwork.validation.baseline).
        total += validation.timeout_s * (1 + validation.flaky_reruns)
    # The checks run beside the tests; counted after them, so a slow check never starves the budget.
    return total + checks_budget_s(validation, environment)


def check_environment(spec: CheckSpec, item: EnvironmentSpec | None) -> EnvironmentSpec | None:
    """The environment `spec` runs in: the item's, with the check's interpreter and setup where it names them."""
    if spec.environment is None:
        return item
    base = item or EnvironmentSpec()
    update: dict[str, Any] = {}
    if spec.environment.python is not None:
        update["python"] = spec.environment.python
    if spec.environment.setup is not None:
        update["setup"] = spec.environment.setup
    return base.model_copy(update=update)


def checks_budget_s(validation: ValidationSpec, environment: EnvironmentSpec | None) -> float:
    """Wall-clock the checks may add to a validation: their runs (and own setups) in waves of `check_parallel`."""
    if not validation.checks:
        return 0.0
    each = []
    for c in validation.checks:
        # With a baseline, a failing check runs once more on the base commit.
        t = (c.timeout_s or validation.timeout_s) * (2 if validation.baseline != "off" else 1)
        env = check_environment(c, environment) if c.environment is not None else None
        if env is not None:
            # Its own prepared environment: its setup and validation.setup, each under setup_timeout_s.
            t += env.setup_timeout_s * (len(env.setup) + len(validation.setup) + (1 if env.python else 0))
        each.append(t)
    waves = -(-len(each) // validation.check_parallel)
    return max(each) * waves


def _timeout(inp: ValidateInput) -> timedelta:
    return timedelta(seconds=validation_budget_s(inp.validation, inp.environment)) + VALIDATE_MARGIN


VALIDATE = Step(
    "validate_change",
    ValidateInput,
    ValidationOutcome,
    pool="validate",
    start_to_close=_timeout,
    heartbeat=EXECUTION_HEARTBEAT,
    retry=EXECUTION_RETRY,
    dead="validation failed{tries}: {cause}",
)
