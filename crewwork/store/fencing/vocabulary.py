"""The fencing rules' vocabulary, shared by every path of the fenced write (crewwork/store/fencing/rule.py): ranks in
Temporal's scheduling order, the values a write is made of (`FencedWrite`: who writes what item at which rank;
`StateChange`; `AttemptRecord`), what a write returns, what an accepted write is given, admissions.

The values are built once, where a write starts (an attempt's `AttemptWriter` in crewwork/steps/attempt.py, the
reconciler, the admission at submission), and travel unchanged through every path: their untrusted text is made
storable when they are built (`without_nul`), and what a write records of them is masked by the one method that
says what it records (`StateChange.event`, `StateChange.webhook_payload`, `AttemptRecord.columns`,
`FencedWrite.event`), which both paths call."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from crewwork.boundary.masking import mask_secrets, without_nul
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
    """What `record_attempt` stores for one attempt (agent and validation as JSON-ready dicts), with no NUL nor lone
    surrogate in any string once built (`without_nul`)."""

    number: int
    verdict: str
    reason: str
    cause: str | None = None
    fingerprint: str | None = None
    agent: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("verdict", "reason", "cause", "fingerprint", "agent", "validation"):
            object.__setattr__(self, name, without_nul(getattr(self, name)))

    def columns(self) -> dict[str, Any]:
        """The attempt row's columns this record sets, secrets masked in what the agent and validation reported."""
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "cause": self.cause,
            "fingerprint": self.fingerprint,
            "agent": mask_secrets(self.agent) if self.agent else None,
            "validation": mask_secrets(self.validation) if self.validation else None,
        }

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
class FencedWrite:
    """Who writes, to which work item, at which rank: what every fenced write presents. `writer` names the writer in
    events (`<activity>#<attempt>`), made storable when built."""

    work_item_id: str
    tenant_id: str
    rank: Rank
    writer: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "writer", without_nul(self.writer))

    def event(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """An event's data as this write records it (`fenced_event`): storable, with the writer, secrets masked."""
        return mask_secrets({**without_nul(dict(data)), "writer": self.writer})


@dataclass(frozen=True)
class StateChange:
    """A fenced state change: built once where the write starts, carried unchanged through every path of the store
    (crewwork/store/fencing/reference.py, and server_side.py on PostgreSQL). Its text is made storable when it is
    built.

    `fields`: other columns of the item's row it sets (a result, a delivery). `event_data`: more for its
    `state_changed` event. `max_in_flight`/`hand_off_cap`: when the change takes the item out of the in-flight
    states, its place goes to the tenant's first queued items in the same write (at most `hand_off_cap` of them).
    `attempt`: an attempt record written first in the same write (a `task` item's last attempt, with its result)."""

    write: FencedWrite
    state: WorkItemState
    reason: str | None = None
    fields: dict[str, Any] | None = None
    event_data: dict[str, Any] | None = None
    max_in_flight: int | None = None
    hand_off_cap: int = 0
    attempt: AttemptRecord | None = None

    def __post_init__(self) -> None:
        for name in ("reason", "fields", "event_data"):
            object.__setattr__(self, name, without_nul(getattr(self, name)))

    @property
    def hands_off(self) -> bool:
        """The change may free a place to hand on (it leaves the in-flight states, and hand-offs are asked for)."""
        return self.max_in_flight is not None and self.hand_off_cap > 0 and self.state.value not in IN_FLIGHT_STATES

    def event(self) -> dict[str, Any]:
        """The `state_changed` event's data, secrets masked."""
        return mask_secrets(
            {
                "state": self.state.value,
                "reason": self.reason or "",
                "writer": self.write.writer,
                **(self.event_data or {}),
            }
        )

    def webhook_payload(self, occurred_at: float | None = None) -> dict[str, Any]:
        """The `work_item.state_changed` webhook's payload, secrets masked (`occurred_at`: the database clock, which
        the server-side path adds itself)."""
        head: dict[str, Any] = {
            "work_item_id": self.write.work_item_id,
            "state": self.state.value,
            "reason": self.reason or "",
        }
        if occurred_at is not None:
            head["occurred_at"] = occurred_at
        return mask_secrets({**head, **delivery(self.fields)})


@dataclass(frozen=True)
class Admission:
    admitted: bool
    queued_position: int | None = None
    """1-based place among the tenant's queued items when not admitted (the in-flight limit is reached)."""
    in_flight: int = 0
    fingerprints: list[str | None] = field(default_factory=list)


@dataclass(frozen=True)
class HandedOff:
    """A queued item admitted by the transaction of the item whose place it took (`hand_off` in reference.py)."""

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
