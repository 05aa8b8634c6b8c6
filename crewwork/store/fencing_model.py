"""The fencing rules' vocabulary, shared by every implementation of the fenced write (crewwork/store/fencing.py):
ranks in Temporal's scheduling order, what a write returns, what an accepted write is given, attempt records and
admissions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from crewwork.masking import without_nul
from crewwork.models import WorkItemState

T = TypeVar("T")
U = TypeVar("U")

TERMINAL_STATES = [s.value for s in WorkItemState if s.terminal]

# States that hold a share of the pools: what a tenant's in-flight limit counts. An item awaiting review holds
# nothing (a person may take days), and a queued or submitted one is waiting for exactly this.
IN_FLIGHT_STATES = (
    WorkItemState.admitted.value,
    WorkItemState.running.value,
    WorkItemState.validating.value,
    WorkItemState.landing.value,
)


@dataclass(frozen=True, order=True)
class Rank:
    """When Temporal scheduled a write: the workflow's step number, then the activity's attempt (from 1)."""

    step: int
    attempt: int

    SPAN: ClassVar[int] = 1_000_000
    """Attempts per step the integer encoding leaves room for (retry policies allow at most a handful)."""

    def __post_init__(self) -> None:
        if self.step < 0 or not 0 <= self.attempt < self.SPAN:
            raise ValueError(f"rank out of range: step {self.step}, attempt {self.attempt}")

    def encode(self) -> int:
        """One integer that orders like the pair (stored in `fence_rank`, `events.rank`, `attempts.rank`)."""
        return self.step * self.SPAN + self.attempt

    @classmethod
    def decode(cls, value: int) -> Rank:
        return cls(value // cls.SPAN, value % cls.SPAN)

    def as_dict(self) -> dict[str, int]:
        return {"step": self.step, "attempt": self.attempt}

    def __str__(self) -> str:
        return f"step {self.step} attempt {self.attempt}"


SUBMISSION = Rank(0, 0)
"""The rank of the API's insert of a submitted item: below every step the workflow schedules."""


@dataclass
class WriteResult(Generic[T]):
    ok: bool
    """False when the write was rejected (nothing was changed)."""
    value: T | None = None
    current: Rank | None = None
    """The item's highest accepted rank when the write was checked."""
    closed: bool = False
    """Rejected because the work item is already terminal."""
    missing: bool = False
    """Rejected because the work item is not in the store."""
    state: str | None = None
    """The work item's state when the write was checked (before it was applied)."""

    @property
    def stale(self) -> bool:
        return not self.ok

    def carrying(self, value: U | None) -> WriteResult[U]:
        """The same outcome with another value (a server-side write's results, decoded)."""
        return WriteResult(
            ok=self.ok, value=value, current=self.current, closed=self.closed, missing=self.missing, state=self.state
        )


@dataclass
class Accepted:
    """What an accepted write's `apply` gets: the database clock and the rank it writes with."""

    now: float
    rank: Rank
    mark_raised: bool = field(default=False)
    """Set once the item row's `fence_rank` has been raised to `rank` in this transaction (by `change_state`)."""
    state: str = ""
    """The item's state when its row was locked (before this write)."""
    created_at: float = 0.0
    """When the item was submitted (its place in its tenant's queue)."""


@dataclass(frozen=True)
class AttemptRecord:
    """What `record_attempt` stores for one attempt (agent and validation as JSON-ready dicts)."""

    number: int
    verdict: str
    reason: str
    cause: str | None = None
    fingerprint: str | None = None
    agent: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None

    def clean(self) -> AttemptRecord:
        """This record with no NUL nor lone surrogate in any string (`without_nul`)."""
        return AttemptRecord(
            number=self.number,
            verdict=without_nul(self.verdict),
            reason=without_nul(self.reason),
            cause=without_nul(self.cause),
            fingerprint=without_nul(self.fingerprint),
            agent=without_nul(self.agent),
            validation=without_nul(self.validation),
        )

    def event_data(self) -> dict[str, Any]:
        """The `attempt_recorded` event's data."""
        diff_ref = ((self.agent or {}).get("diff_ref") or {}).get("id")
        return {
            "number": self.number,
            "verdict": self.verdict,
            "reason": self.reason,
            "cause": self.cause,
            "diff_ref": diff_ref,
        }


@dataclass(frozen=True)
class Admission:
    admitted: bool
    queued_position: int | None = None
    """1-based place among the tenant's queued items when not admitted (the in-flight limit is reached)."""
    in_flight: int = 0
    fingerprints: list[str | None] = field(default_factory=list)


@dataclass(frozen=True)
class HandedOff:
    """A queued item admitted by the transaction of the item whose place it took (`hand_off` in crewwork/store/fencing_python.py)."""

    work_item_id: str
    workflow_id: str


def delivery(fields: dict[str, Any] | None) -> dict[str, Any]:
    """Where a landed change went (branch, commit, pull request), for the webhook of the state change that says so."""
    if not fields:
        return {}
    result = fields.get("result") if isinstance(fields.get("result"), dict) else {}
    out = {
        "delivery_branch": fields.get("delivery_branch"),
        "landed_commit": fields.get("landed_commit"),
        "pull_request_url": (result or {}).get("pull_request_url"),
    }
    return {k: v for k, v in out.items() if v}
