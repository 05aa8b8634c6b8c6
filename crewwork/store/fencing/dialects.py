"""What differs between databases on the Python path of the fenced write (reference.py): SQLite and PostgreSQL as
subclasses of it, one rule written once."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.store.fencing import sql
from crewwork.store.fencing.reference import PythonWrites
from crewwork.store.tables import WorkItem


class SqliteWrites(PythonWrites):
    """SQLite: no DML in a CTE, so an event is a statement of its own (in process: no round trip to save)."""

    def with_event(self, stmt: Any) -> Any:
        return stmt

    async def execute_with_event(
        self, s: AsyncSession, stmt: Any, params: dict[str, Any], event: dict[str, Any], *, ready: bool = False
    ) -> Any:
        conn = await s.connection()
        result = await conn.execute(stmt, params)
        await conn.execute(sql.EVENT_INSERT, event)
        return result

    def attempt_count_at_least(self, number: int) -> Any:
        return func.max(WorkItem.attempt_count, number)

    def insert(self, table: Any) -> Any:
        return sqlite.insert(table)


class PostgresWrites(PythonWrites):
    """PostgreSQL, statement by statement (`CREWWORK_STORE_SERVER_WRITES=false`): an event is appended by the
    statement it goes with, as a data-modifying CTE (`sql.EVENT_CTE`)."""

    def with_event(self, stmt: Any) -> Any:
        return stmt.add_cte(sql.EVENT_CTE)

    async def execute_with_event(
        self, s: AsyncSession, stmt: Any, params: dict[str, Any], event: dict[str, Any], *, ready: bool = False
    ) -> Any:
        conn = await s.connection()
        if not ready:
            stmt = stmt.add_cte(sql.EVENT_CTE)
        return await conn.execute(stmt, {**params, **{f"ev_{k}": v for k, v in event.items()}})

    def attempt_count_at_least(self, number: int) -> Any:
        return func.greatest(WorkItem.attempt_count, number)

    def insert(self, table: Any) -> Any:
        return postgresql.insert(table)
