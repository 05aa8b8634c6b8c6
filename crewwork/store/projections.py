"""Aggregate projections of the store for the metrics scrape: counts by state, verdict, event type and delivery
status, and the model tokens recorded by attempts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select

from crewwork.store.engine import Database
from crewwork.store.tables import Attempt, Event, OutboxMessage, WorkItem


@dataclass
class StoreCounts:
    work_items: dict[tuple[str, str], int] = field(default_factory=dict)
    """(state, kind) -> items"""
    attempts: dict[tuple[str, str], int] = field(default_factory=dict)
    """(verdict, cause or "") -> attempts"""
    events: dict[str, int] = field(default_factory=dict)
    outbox: dict[str, int] = field(default_factory=dict)
    model_tokens: int = 0


class ProjectionStore(Database):
    async def store_counts(self) -> StoreCounts:
        out = StoreCounts()
        if self.is_sqlite:
            tokens: Any = func.json_extract(Attempt.agent, "$.tokens_used")
        else:
            tokens = Attempt.agent.op("->>")("tokens_used")
        async with self.session() as s:
            q1 = select(WorkItem.state, WorkItem.kind, func.count()).group_by(WorkItem.state, WorkItem.kind)
            out.work_items = {(str(a), str(b)): int(c) for a, b, c in (await s.execute(q1)).all()}
            q2 = select(Attempt.verdict, Attempt.cause, func.count()).group_by(Attempt.verdict, Attempt.cause)
            out.attempts = {(str(a), str(b or "")): int(c) for a, b, c in (await s.execute(q2)).all()}
            q3 = select(Event.type, func.count()).group_by(Event.type)
            out.events = {str(a): int(c) for a, c in (await s.execute(q3)).all()}
            q4 = select(OutboxMessage.status, func.count()).group_by(OutboxMessage.status)
            out.outbox = {str(a): int(c) for a, c in (await s.execute(q4)).all()}
            for (value,) in (await s.execute(select(tokens).where(Attempt.agent.is_not(None)))).all():
                try:
                    out.model_tokens += int(float(value or 0))
                except (TypeError, ValueError):
                    continue
        return out
