"""The store's database: the engine, sessions and transactions, and the database clock.

Every aggregate module of the store (`auth`, `work_items`, `fencing`, `events`, `attempts`, `leases`,
`artifacts`) builds on this class; `crewwork.store.store.Store` puts them together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from sqlalchemy import event, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

T = TypeVar("T")
log = logging.getLogger(__name__)


def unavailable(exc: BaseException) -> bool:
    """Whether `exc`, raised while opening a connection, says the database cannot be reached right now (refused,
    reset, starting up or shutting down): a connection that was never established cannot have done anything."""
    if isinstance(exc, OSError):  # asyncpg raises ConnectionRefusedError & co. unwrapped
        return True
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        orig = type(exc.orig).__name__ if exc.orig is not None else ""
        return orig in {"CannotConnectNowError", "ConnectionDoesNotExistError", "AdminShutdownError"} or isinstance(
            exc.orig, OSError
        )
    return False


class StoreError(RuntimeError):
    pass


class NotFound(StoreError):
    pass


class Database:
    """One engine per process. PostgreSQL (asyncpg) is canonical; SQLite (aiosqlite) is the embedded default."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        echo: bool = False,
        pre_ping: bool = True,
        unavailable_wait_s: float = 0.0,
    ) -> None:
        """`pre_ping=False` (the worker pools) skips the round trip that tests each pooled connection before use; a
        transaction whose first statement finds its connection dead is then run once more on a fresh connection
        (`transaction`), and other calls fail into their activity's retry policy.

        `unavailable_wait_s` (the worker pools: CREWWORK_STORE_UNAVAILABLE_WAIT_S): for that long, a session that
        cannot open its connection (the database restarting, failing over, refusing connections) waits for it with
        backoff instead of failing. Nothing has run on a connection that was never opened, so waiting is always
        safe; it keeps a database restart of a few seconds from spending an agent run's bounded retries."""
        self.url = url
        self.unavailable_wait_s = unavailable_wait_s
        self.is_sqlite = url.startswith("sqlite")
        kwargs: dict[str, Any] = {"echo": echo}
        if self.is_sqlite:
            kwargs["connect_args"] = {"timeout": 30}
        else:
            kwargs.update(pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=pre_ping, pool_recycle=1800)
        self.engine: AsyncEngine = create_async_engine(url, **kwargs)
        if self.is_sqlite:
            _configure_sqlite(self.engine)
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)

    async def close(self) -> None:
        await self.engine.dispose()

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """A session in a transaction, committed when the block ends (rolled back on an exception)."""
        if self.unavailable_wait_s <= 0 or self.is_sqlite:
            async with self._sessions() as s, s.begin():
                yield s
            return
        async with self._sessions() as s:
            await self._connect(s)  # begins the transaction on an open connection
            try:
                yield s
            except BaseException:
                await s.rollback()
                raise
            await s.commit()

    async def _connect(self, s: AsyncSession) -> None:
        """Open the session's connection now, waiting (bounded) while the database is unreachable."""
        deadline = time.monotonic() + self.unavailable_wait_s
        delay = 0.1
        while True:
            try:
                await s.connection()
                return
            except (OSError, DBAPIError) as exc:
                remaining = deadline - time.monotonic()
                if not unavailable(exc) or remaining <= 0:
                    raise
                pause = min(delay, remaining)
                log.warning("the store is unreachable (%s); retrying in %.1fs", type(exc).__name__, pause)
                await s.rollback()
                await asyncio.sleep(pause)
                delay = min(delay * 2, 2.0)

    async def transaction(self, body: Callable[[AsyncSession, Callable[[], None]], Awaitable[T]]) -> T:
        """Run `body(session, started)` in a transaction. If the connection is found dead before `body` calls
        `started()` (after its first statement succeeded), nothing of it can have happened, and it runs once more on
        a fresh connection: a pooled connection that PostgreSQL closed (restart, pg_terminate_backend) costs a retry
        here instead of a round trip per checkout (pre-ping) or a failed activity attempt."""
        for attempt in (1, 2):
            begun = False

            def started() -> None:
                nonlocal begun
                begun = True

            try:
                async with self.session() as s:
                    return await body(s, started)
            except DBAPIError as exc:
                if attempt == 1 and not begun and exc.connection_invalidated:
                    continue
                raise
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ clock

    def now_sql(self) -> Any:
        """The database clock as epoch seconds (float). Leases and timestamps never use a worker's clock."""
        if self.is_sqlite:
            return text("((julianday('now') - 2440587.5) * 86400.0)")
        return text("extract(epoch from clock_timestamp())::float8")

    async def now(self, s: AsyncSession) -> float:
        return float((await s.execute(select(self.now_sql()))).scalar_one())

    async def db_now(self) -> float:
        async with self.session() as s:
            return await self.now(s)


def _configure_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, open transactions, so that we can open them IMMEDIATE: a writer takes the
        # database write lock before it reads a fencing mark, making check-then-write atomic.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
