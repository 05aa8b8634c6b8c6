"""The repair loop's carried state and the small pure helpers of WorkItemWorkflow. Workflow code: deterministic."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, RetryState, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from crewwork.activities.errors import ITEM_FAILURES
    from crewwork.limits import LoopState
    from crewwork.models import AgentOutcome, AttemptSummary, LoopCarry, WorkItemInput
    from crewwork.workflows.policies import EXECUTION_RETRY


class Dead(Exception):
    """Infrastructure retries are exhausted: the item ends `dead` with the last error."""


class Failed(Exception):
    """The repository or the landing refused the item (ITEM_FAILURES): the item ends `failed` with the message."""


@dataclass
class Workspace:
    key: str
    grant: int | None


@dataclass
class RepairLoop:
    """The repair loop's state: what carries over to the next attempt, and to the next run."""

    attempt: int
    started_at_s: float
    diagnostics: str | None = None
    review_comment: str | None = None
    tokens: int = 0
    cost: float = 0.0
    mock: bool = False
    fingerprints: list[str | None] = field(default_factory=list)

    def spent(self, outcome: AgentOutcome) -> None:
        self.mock = self.mock or outcome.mock
        self.tokens += outcome.tokens_used
        self.cost += outcome.cost_usd

    def failed(self, diagnostics: str) -> None:
        self.attempt += 1
        self.diagnostics = diagnostics
        self.review_comment = None

    def carry(self) -> LoopCarry:
        """What the next run starts from when this one continues as new."""
        return LoopCarry(
            next_attempt=self.attempt,
            diagnostics_ref=self.diagnostics,
            review_comment=self.review_comment,
            started_at_s=self.started_at_s,
            tokens_used=self.tokens,
            cost_usd=self.cost,
        )

    def changes_requested(self, comment: str | None) -> None:
        self.attempt += 1
        self.diagnostics = None
        self.review_comment = comment
        # A reviewer's "no" is not a same-cause failure: it breaks any run the breaker counts.
        self.fingerprints.append(None)

    def state(self, now_s: float) -> LoopState:
        return LoopState(
            attempts_made=self.attempt - 1,
            now_s=now_s,
            started_at_s=self.started_at_s,
            tokens_used=self.tokens,
            cost_usd=self.cost,
            fingerprints=tuple(self.fingerprints),
        )


def slim(summary: AttemptSummary) -> AttemptSummary:
    """The status query keeps summaries small: no test lists or diagnostics."""
    s = summary.model_copy(deep=True)
    if s.validation is not None:
        s.validation.tests = s.validation.tests[:20]
        s.validation.diagnostics = None
    return s


def commit_message(inp: WorkItemInput, attempt: int) -> str:
    title = (inp.spec.instruction or "change").strip().splitlines()[0][:72]
    return (
        f"{title}\n\ncrewwork work item {inp.work_item_id}, validated on attempt {attempt}.\n"
        f"Crewwork-Work-Item: {inp.work_item_id}\n"
    )


def cause(exc: BaseException) -> str:
    cur: BaseException | None = exc
    msg = str(exc)
    while cur is not None:
        if isinstance(cur, ApplicationError):
            return f"{cur.type or 'error'}: {cur.message}"
        msg = str(cur) or msg
        cur = cur.__cause__
    return msg


def tries(exc: ActivityError) -> str:
    if exc.retry_state == RetryState.MAXIMUM_ATTEMPTS_REACHED:
        return f" after {EXECUTION_RETRY.maximum_attempts} tries"
    return ""


def reraise_cancellation(exc: ActivityError) -> None:
    """A cancelled workflow sees its running activity fail with a cancelled cause: that is the cancellation itself,
    not an infrastructure failure, so it must reach `run`'s cancellation handler (ending `cancelled`, not `dead`)."""
    if is_cancelled_exception(exc):
        raise asyncio.CancelledError(str(exc)) from exc


def has_type(exc: BaseException, type_: str) -> bool:
    cur: BaseException | None = exc
    while cur is not None:
        if isinstance(cur, ApplicationError) and cur.type == type_:
            return True
        cur = cur.__cause__
    return False


def raise_item_failure(exc: BaseException, step: str) -> None:
    """An ITEM_FAILURES error (the repository or the landing refused) ends the item `failed`, never `dead`."""
    cur: BaseException | None = exc
    while cur is not None:
        if isinstance(cur, ApplicationError) and cur.type in ITEM_FAILURES:
            raise Failed(f"{step}: {cur.type}: {cur.message}") from exc
        cur = cur.__cause__


def validation_budget_s(inp: WorkItemInput) -> float:
    """Start-to-close budget of one validation: its run, each setup command, and the environment's setup."""
    v = inp.spec.validation
    assert v is not None
    total = v.timeout_s * (1 + len(v.setup))
    env = inp.spec.environment
    if env is not None:
        total += env.setup_timeout_s * (len(env.setup) + (1 if env.python else 0))
    return total
