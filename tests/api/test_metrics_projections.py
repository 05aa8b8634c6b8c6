"""The store's projections on /metrics: from a snapshot, so a scrape storm does not become a query storm.
Real stores (SQLite and PostgreSQL); the queries are counted with SQLAlchemy's own statement events."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy.engine import make_url

from crewwork.observability.metrics import StoreProjections
from crewwork.store.store import Store
from tests.conftest import statements_sent


class CountingStore(Store):
    """A real store that counts how often the projections ask it."""

    calls = 0

    async def store_counts(self):  # type: ignore[no-untyped-def]
        self.calls += 1
        return await super().store_counts()


async def test_scrapes_within_the_refresh_interval_reuse_one_snapshot(any_store: Store) -> None:
    with statements_sent(any_store, containing="count(") as queries:
        projections = StoreProjections(any_store, refresh_s=3600)
        registry = CollectorRegistry()
        registry.register(projections)
        for _ in range(30):
            await projections.refresh()
            text = generate_latest(registry).decode()
        per_snapshot = len(queries)
        assert per_snapshot > 0
        assert "# TYPE crewwork_work_items gauge" in text and "crewwork_model_tokens" in text
        await projections.refresh()
        assert len(queries) == per_snapshot, "a scrape inside the interval queried the store again"


async def test_a_stale_snapshot_is_refreshed(any_store: Store) -> None:
    with statements_sent(any_store, containing="count(") as queries:
        projections = StoreProjections(any_store, refresh_s=0)
        await projections.refresh()
        first = len(queries)
        await projections.refresh()
        assert len(queries) == 2 * first


@pytest.mark.postgres
async def test_a_failing_store_keeps_the_last_snapshot(pg_url: str) -> None:
    store = Store(pg_url)
    projections = StoreProjections(store, refresh_s=0)
    registry = CollectorRegistry()
    registry.register(projections)
    await projections.refresh()
    before = generate_latest(registry).decode()
    await store.close()
    broken = CountingStore(make_url(pg_url).set(port=1).render_as_string(hide_password=False))  # nothing listens
    projections.store = broken
    await projections.refresh()  # logs and keeps the last snapshot
    assert generate_latest(registry).decode() == before
    tries = broken.calls
    projections.refresh_s = 3600
    await projections.refresh()  # a failed try counts as the interval's: no retry on every scrape
    assert broken.calls == tries == 1
    await broken.close()


async def test_nothing_is_exported_before_the_first_snapshot(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    registry = CollectorRegistry()
    registry.register(StoreProjections(store, refresh_s=60))
    assert "crewwork_work_items" not in generate_latest(registry).decode()
    await store.close()
