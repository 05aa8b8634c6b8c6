"""What the invariant checker (tests/invariants.py) reads: a snapshot of work items with their events, attempt
records and workspace lease grants, as frozen values.

Everything is read in one session, so the items, events, attempts and leases are of one moment as far as the database
gives one (the checker runs after the fact, when nothing is writing)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from crewwork.store.engine import Database
from crewwork.store.leases import WORKSPACE_PREFIX
from crewwork.store.tables import Attempt, Event, Lease, LeaseHistory, WorkItem


@dataclass(frozen=True)
class AuditItem:
    id: str
    kind: str
    state: str
    fence_rank: int
    """The item's mark: the highest rank accepted (`Rank.encode`)."""
    state_rank: int | None
    """The rank of the write that stored the current state."""
    result_rank: int | None
    """The rank of the write that stored the result (None: no result stored)."""
    has_result: bool
    repo_url: str | None
    delivery_branch: str | None
    landed_commit: str | None


@dataclass(frozen=True)
class AuditEvent:
    id: int
    work_item_id: str
    type: str
    data: Mapping[str, Any]
    rank: int | None
    """The rank of the write that left the event (None: not a fenced write's)."""


@dataclass(frozen=True)
class AuditAttempt:
    work_item_id: str
    number: int
    agent: Mapping[str, Any] | None
    """The agent outcome recorded with the attempt (its `diff_ref` names the diff)."""


@dataclass(frozen=True)
class LeaseGrant:
    """One grant of a lease, from the lease history."""

    key: str
    holder: str
    token: int
    acquired_at: float
    ended_at: float | None


@dataclass(frozen=True)
class HeldLease:
    """A lease held now."""

    key: str
    holder: str
    token: int


@dataclass(frozen=True)
class AuditSnapshot:
    items: Mapping[str, AuditItem]
    """By id."""
    missing: tuple[str, ...]
    """Asked-for ids that are not in the store, sorted."""
    events: tuple[AuditEvent, ...]
    """The items' events, in commit order (by id)."""
    attempts: tuple[AuditAttempt, ...]
    grants: tuple[LeaseGrant, ...]
    """Every grant of each workspace key the items acquired (`workspace_acquired` events), in order of record."""
    held: tuple[HeldLease, ...]
    """Every workspace lease held now, whoever holds it."""


class AuditStore(Database):
    async def audit_snapshot(self, work_item_ids: list[str] | None = None) -> AuditSnapshot:
        """The records of `work_item_ids` (default: every work item in the store)."""
        async with self.session() as s:
            q = select(WorkItem)
            if work_item_ids is not None:
                q = q.where(WorkItem.id.in_(work_item_ids))
            items = {w.id: _item(w) for w in (await s.scalars(q)).all()}
            wids = list(items)
            events = [
                AuditEvent(e.id, e.work_item_id, e.type, e.data, e.rank)
                for e in (await s.scalars(select(Event).where(Event.work_item_id.in_(wids)).order_by(Event.id))).all()
            ]
            attempts = [
                AuditAttempt(a.work_item_id, a.number, a.agent)
                for a in (await s.scalars(select(Attempt).where(Attempt.work_item_id.in_(wids)))).all()
            ]
            ws_keys = sorted(
                {str(e.data.get("key")) for e in events if e.type == "workspace_acquired" and e.data.get("key")}
            )
            history = await s.scalars(
                select(LeaseHistory).where(LeaseHistory.key.in_(ws_keys)).order_by(LeaseHistory.id)
            )
            grants = [LeaseGrant(h.key, h.holder, h.token, h.acquired_at, h.ended_at) for h in history.all()]
            leases = await s.scalars(select(Lease).where(Lease.key.startswith(WORKSPACE_PREFIX, autoescape=True)))
            held = [HeldLease(x.key, x.holder, x.token) for x in leases.all()]
        missing = sorted(set(work_item_ids) - set(items)) if work_item_ids is not None else []
        return AuditSnapshot(items, tuple(missing), tuple(events), tuple(attempts), tuple(grants), tuple(held))


def _item(w: WorkItem) -> AuditItem:
    return AuditItem(
        id=w.id,
        kind=w.kind,
        state=w.state,
        fence_rank=w.fence_rank,
        state_rank=w.state_rank,
        result_rank=w.result_rank,
        has_result=w.result is not None,
        repo_url=w.repo_url,
        delivery_branch=w.delivery_branch,
        landed_commit=w.landed_commit,
    )
