"""One attempt's validation: the captured diff applied to the base tree, protected paths put back, the repository's
own tests (and, where declared, preview probes) run in a fresh sandbox, the evidence graded by a pure function (the
activity: crewwork/steps/validate/activity.py)."""

from __future__ import annotations

from datetime import timedelta

from crewwork.models import ArtifactRef, DiffStats, EnvironmentSpec, SandboxSpec, ValidationOutcome, ValidationSpec
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
    return total


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
