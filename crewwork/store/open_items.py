"""Open work items, oldest first: what the reconciler (crewwork/admission/reconcile.py) walks, a batch per pass, through the
partial index `ix_work_items_open` (migration 0009)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, text, tuple_

from crewwork.store.engine import Database
from crewwork.store.tables import OPEN_ITEMS, WorkItem


@dataclass(frozen=True)
class OpenItem:
    """A work item that is not terminal yet, as the reconciler needs it."""

    id: str
    tenant_id: str
    workflow_id: str
    state: str
    created_at: float
    """Submission time (database clock): with `id`, the item's place in the walk."""
    mock: bool


def open_items_query(horizon: float, after: tuple[float, str] | None, batch: int) -> Any:
    """The next `batch` open items submitted up to `horizon`, after `after` (submission time, id), oldest first."""
    t = WorkItem
    q = (
        select(t.id, t.tenant_id, t.workflow_id, t.state, t.created_at, t.mock)
        # The partial index's own condition, as text: SQLite uses a partial index only for a query whose WHERE
        # names its condition in literals (bound parameters it cannot match).
        .where(text(OPEN_ITEMS), t.created_at <= horizon)
        .order_by(t.created_at, t.id)
        .limit(batch)
    )
    if after is not None:
        q = q.where(tuple_(t.created_at, t.id) > tuple_(*after))
    return q


class OpenItemStore(Database):
    async def open_items(self, horizon: float, after: tuple[float, str] | None, batch: int) -> list[OpenItem]:
        """`open_items_query`'s items."""
        async with self.session() as s:
            rows = (await s.execute(open_items_query(horizon, after, batch))).all()
        return [OpenItem(r.id, r.tenant_id, r.workflow_id, r.state, r.created_at, bool(r.mock)) for r in rows]

    async def admitted_unstarted(self, before: float, max_rank: int, limit: int) -> list[OpenItem]:
        """Items admitted before their workflow started (crewwork/admission/starts.py: state `admitted`, fence mark at most
        `max_rank`, so no workflow wrote them) whose admission was written before `before` (database clock), oldest
        first: the reconciler's check for a start that was lost, without waiting for its minimum age."""
        t = WorkItem
        q = (
            select(t.id, t.tenant_id, t.workflow_id, t.state, t.created_at, t.mock)
            .where(text(OPEN_ITEMS), t.state == "admitted", t.fence_rank <= max_rank, t.updated_at <= before)
            .order_by(t.updated_at, t.id)
            .limit(limit)
        )
        async with self.session() as s:
            rows = (await s.execute(q)).all()
        return [OpenItem(r.id, r.tenant_id, r.workflow_id, r.state, r.created_at, bool(r.mock)) for r in rows]
