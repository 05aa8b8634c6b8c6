"""The reconciler's query of open items (crewwork/store/open_items.py) and its partial index (migration 0009)."""

from __future__ import annotations

import re

from sqlalchemy import text

from crewwork.models import TERMINAL_STATES
from crewwork.store.open_items import open_items_query
from crewwork.store.store import Store
from crewwork.store.tables import OPEN_ITEMS


def test_the_index_condition_names_every_terminal_state() -> None:
    assert set(re.findall(r"'([a-z_]+)'", OPEN_ITEMS)) == {s.value for s in TERMINAL_STATES}


async def test_sqlite_reads_the_open_items_through_the_partial_index(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    try:
        for after in (None, (1.0, "wi_x")):
            q = open_items_query(1e12, after, 100)
            sql = str(q.compile(store.engine.sync_engine, compile_kwargs={"literal_binds": True}))
            async with store.engine.connect() as conn:
                plan = " | ".join(str(r[-1]) for r in (await conn.execute(text(f"EXPLAIN QUERY PLAN {sql}"))).all())
            assert "ix_work_items_open" in plan and "TEMP B-TREE" not in plan, plan
    finally:
        await store.close()
