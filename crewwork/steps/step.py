"""What every step shares: the item reference its input carries, its policy (`Step`), and what an activity error
means for the work item (`outcome`).

Imported by workflow code: deterministic, no I/O (the retry policies and timeouts are named constants; docs/
reliability.md has the table and why)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Generic, TypeVar

from pydantic import BaseModel
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, RetryState, is_cancelled_exception

from crewwork.models.pools import Pool
from crewwork.steps.errors import BAD_INPUT, ITEM_FAILURES, NON_RETRYABLE

CONTROL_TIMEOUT = timedelta(seconds=30)
CONTROL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=8,
    non_retryable_error_types=list(NON_RETRYABLE),
)
"""Store writes, leases, landing: short, and retried quickly for a database or network blip."""
EXECUTION_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
    non_retryable_error_types=list(NON_RETRYABLE),
)
"""Agent runs and validations: a few tries, for infrastructure faults (a killed pool, a sandbox that failed)."""
EXECUTION_HEARTBEAT = timedelta(seconds=10)
"""How long an agent run or validation may go unheard before Temporal times the attempt out and schedules another."""
HEARTBEAT_THROTTLE = timedelta(seconds=3)
"""The longest a worker holds back an attempt's heartbeats (Worker's `max_heartbeat_throttle_interval`).

The SDK otherwise sends at most one heartbeat per 0.8 x the heartbeat timeout: with 10 s, Temporal heard a live attempt
every 8 s and timed it out if one heartbeat was 2 s late, which a loaded host does (a validation retried while it was
still running, CI of 2026-12-04). Measured with a dev server (heartbeat every 2 s, timeout 10 s): gaps of 8 s by
default, 3 s with this cap, so a late heartbeat has 7 s of slack. The price is one heartbeat RPC per running attempt
every 3 s instead of 8."""

I = TypeVar("I", bound=BaseModel)  # noqa: E741
R = TypeVar("R")


class ItemRef(BaseModel):
    work_item_id: str
    tenant_id: str
    step: int
    """The workflow's number for this activity call: writes rank by (step, Temporal attempt)."""


class WriteOutcome(BaseModel):
    ok: bool
    stale: bool = False


class Dead(Exception):
    """Infrastructure retries are exhausted: the item ends `dead` with the last error."""


class Failed(Exception):
    """The repository or the landing refused the item (ITEM_FAILURES): the item ends `failed` with the message."""


@dataclass(frozen=True)
class Step(Generic[I, R]):
    """One activity of the lifecycle and how the workflow calls it."""

    name: str
    """The activity's name in Temporal (and in every recorded history: never renamed)."""
    input: type[I]
    result: type[R] | None
    """The result's type (None: the activity returns nothing)."""
    pool: Pool | None = "control"
    """The pool whose task queue runs it; None: the calling workflow's own task queue."""
    local: bool = False
    """A short store write, run as a local activity of the workflow: no task-queue round trip, fewer events."""
    start_to_close: timedelta | Callable[[I], timedelta] = CONTROL_TIMEOUT
    """A fixed timeout, or one computed from the input (a validation's budget)."""
    heartbeat: timedelta | None = None
    retry: RetryPolicy = field(default_factory=lambda: CONTROL_RETRY)
    dead: str = "{what} failed after retries: {cause}"
    """The reason the item ends `dead` with when retries are exhausted (`what`, `cause`, `tries` filled in)."""
    bad_input: str | None = None
    """The reason for a BadInput error, when the step names it apart from other failures."""

    def timeout(self, inp: I) -> timedelta:
        return self.start_to_close(inp) if callable(self.start_to_close) else self.start_to_close


def outcome(step: Step, exc: ActivityError, what: str) -> BaseException:
    """What a step's failure (retries exhausted, or an error no retry fixes) means for the work item:

    1. the workflow was cancelled while the step ran: that cancellation, to reach `run`'s handler (`cancelled`);
    2. the repository or the landing refused (ITEM_FAILURES): `Failed`, naming the remote's message;
    3. the input is unusable, where the step says so (`bad_input`): `Dead` with that reason;
    4. anything else: `Dead` with the step's reason and the last error."""
    if is_cancelled_exception(exc):
        return asyncio.CancelledError(str(exc))
    for cur in _chain(exc):
        if isinstance(cur, ApplicationError) and cur.type in ITEM_FAILURES:
            return Failed(f"{what}: {cur.type}: {cur.message}")
    fill = {"what": what, "cause": cause(exc), "tries": tries(exc, step.retry)}
    if step.bad_input is not None and any(
        isinstance(cur, ApplicationError) and cur.type == BAD_INPUT for cur in _chain(exc)
    ):
        return Dead(step.bad_input.format(**fill))
    return Dead(step.dead.format(**fill))


def cause(exc: BaseException) -> str:
    msg = str(exc)
    for cur in _chain(exc):
        if isinstance(cur, ApplicationError):
            return f"{cur.type or 'error'}: {cur.message}"
        msg = str(cur) or msg
    return msg


def tries(exc: ActivityError, retry: RetryPolicy) -> str:
    if exc.retry_state == RetryState.MAXIMUM_ATTEMPTS_REACHED:
        return f" after {retry.maximum_attempts} tries"
    return ""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    cur: BaseException | None = exc
    while cur is not None:
        yield cur
        cur = cur.__cause__
