"""A database restart under the worker pools: a store call waits (bounded) for PostgreSQL to accept connections
again instead of failing into the activity's few retries. Real server, really stopped and started."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from crewwork.store.engine import Database, unavailable
from tests.soak import privatepg

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def pg():
    ok, why = privatepg.available()
    if not ok:
        pytest.skip(why)
    with privatepg.private_postgres() as server:
        yield server


async def _one(db: Database) -> int:
    async with db.session() as s:
        return await db.now(s) > 0 and 1


async def test_a_session_waits_for_a_restarting_database(pg: privatepg.PrivatePostgres) -> None:
    db = Database(pg.url, pre_ping=False, unavailable_wait_s=30)
    restarted = threading.Timer(3.0, pg.start)
    try:
        assert await _one(db) == 1
        pg.stop("immediate")
        restarted.start()
        t0 = time.monotonic()
        # The pooled connection died with the server: the next call finds it dead, the pool is invalidated, and
        # the retry then waits for the server (refusing connections, then starting up) instead of failing.
        errors: list[BaseException] = []
        for _ in range(2):
            try:
                assert await _one(db) == 1
                break
            except Exception as exc:  # the one call that met the dead pooled connection
                errors.append(exc)
        else:
            pytest.fail(f"the store never came back: {errors!r}")
        assert len(errors) <= 1 and all(unavailable(e) for e in errors), errors
        waited = time.monotonic() - t0
        restarted.join()
        assert waited >= 2.0, "the call returned before the server was back: it did not wait"
    finally:
        # Never stop the server under a start still waiting (its pg_ctl would then report a failed start).
        restarted.cancel()
        if restarted.is_alive():
            restarted.join()
        await db.close()


async def test_without_the_wait_a_down_database_fails_at_once(pg: privatepg.PrivatePostgres) -> None:
    db = Database(pg.url, unavailable_wait_s=0)
    try:
        pg.stop("immediate")
        t0 = time.monotonic()
        with pytest.raises(OSError):
            await _one(db)
        assert time.monotonic() - t0 < 5
    finally:
        pg.start()
        await db.close()


async def test_the_wait_is_bounded(pg: privatepg.PrivatePostgres) -> None:
    db = Database(pg.url, unavailable_wait_s=1.5)
    try:
        pg.stop("immediate")
        t0 = time.monotonic()
        with pytest.raises(OSError):
            await _one(db)
        assert 1.0 <= time.monotonic() - t0 < 10
    finally:
        pg.start()
        await db.close()


async def test_a_session_waits_for_a_server_that_listens_but_is_not_accepting_connections_yet(
    pg: privatepg.PrivatePostgres,
) -> None:
    """A restarting server listens before it accepts connections: while it replays its WAL it answers 57P03 ("the
    database system is starting up" / "not yet accepting connections"). That is the restart still under way, to be
    waited for like a refused connection; here the server stays in that state (a standby without hot standby) until
    it is promoted."""
    pg.stop("fast")
    pg.start_in_recovery()
    db = Database(pg.url, pre_ping=False, unavailable_wait_s=30)
    promoted = threading.Timer(1.0, pg.promote)
    try:
        promoted.start()
        assert await _one(db) == 1
    finally:
        promoted.cancel()
        if promoted.is_alive():
            promoted.join()
        await db.close()


def test_a_never_started_server_is_not_waited_for_beyond_the_bound() -> None:
    db = Database("postgresql+asyncpg://postgres@127.0.0.1:1/none", unavailable_wait_s=0.5)
    with pytest.raises(OSError):
        asyncio.run(_one(db))
