"""The store's database: the engine, sessions and transactions, and the database clock.

Every aggregate module of the store (`auth`, `work_items`, `fencing`, `events`, `attempts`, `leases`,
`artifacts`) builds on this class; `crewwork.store.store.Store` puts them together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from sqlalchemy import event, select, text
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

T = TypeVar("T")
log = logging.getLogger(__name__)


PING_AFTER_IDLE_S = 1.0
"""`pre_ping`: a pooled connection is tested before use only when it was last returned this long ago."""


def _test_on_checkout(engine: AsyncEngine, *, ping: bool) -> None:
    """Every pooled PostgreSQL connection is looked at before use: one the driver already knows is closed (the server
    ended it: a restart, a failover, `pg_terminate_backend`) is discarded and another checked out, at no cost (a flag
    in the driver, no round trip). Without this, a read that drew it failed ("connection is closed") whenever it had
    been returned less than `PING_AFTER_IDLE_S` ago (tests/reliability/test_faults.py, under load).

    `ping` (the API): SQLAlchemy's `pool_pre_ping`, but only for a connection idle for `PING_AFTER_IDLE_S` or more.
    The stock one tests every checkout, and asyncpg's test is a transaction of its own (BEGIN, a statement, ROLLBACK:
    three round trips) before every statement, the API's one-round-trip autocommit statements included: that was a
    quarter of the API's busy samples under load (py-spy, bench/trace.py --profile api). A connection back in the
    pool less than a second ago, and not known closed, is very likely alive; if the database died in that second,
    the autocommit statements and the transactions that had not begun run once more on a fresh connection
    (`Database.transaction`, `_autocommit`), and another read fails as any call does while the store is unreachable
    (the API answers 503)."""
    pool = engine.sync_engine.pool

    @event.listens_for(pool, "checkin")
    def _returned(_dbapi: Any, record: Any) -> None:
        record.info["returned_at"] = time.monotonic()

    @event.listens_for(pool, "checkout")
    def _checked_out(dbapi: Any, record: Any, _proxy: Any) -> None:
        if dbapi.driver_connection.is_closed():
            # The pool discards this connection and checks out another (a fresh one if needs be).
            raise DisconnectionError("pooled connection was closed by the server")
        returned = record.info.get("returned_at")
        if not ping or (returned is not None and time.monotonic() - returned < PING_AFTER_IDLE_S):
            return
        try:
            dbapi.ping()
        except Exception as exc:
            raise DisconnectionError(f"pooled connection failed its test: {exc}") from exc


_UNAVAILABLE_ERRORS = frozenset({"CannotConnectNowError", "ConnectionDoesNotExistError", "AdminShutdownError"})
_UNAVAILABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
"""admin_shutdown, crash_shutdown, cannot_connect_now (the server is starting up, in recovery or shutting down)."""


def older_schema(exc: BaseException, function: str, migration: str) -> StoreError | None:
    """The error to raise when `exc` says the server-side function `function` does not exist: the store was not
    upgraded to `migration` (what `crewwork db upgrade` applies); None for any other error."""
    if function in str(exc) and "does not exist" in str(exc):
        return StoreError(
            f"the database schema is older than this release: run `crewwork db upgrade` (migration {migration} adds "
            f"the function {function}), or set CREWWORK_STORE_SERVER_WRITES=false"
        )
    return None


def driver_disconnect(exc: BaseException, connection: Any) -> bool:
    """Whether an error the asyncpg driver raised (`Database.driver_scalar`) means its connection is gone: then it is
    discarded, not returned to the pool."""
    return connection.is_closed() or isinstance(exc, OSError) or type(exc).__name__ in _UNAVAILABLE_ERRORS


def unavailable(exc: BaseException) -> bool:
    """Whether `exc`, raised while opening a connection, says the database cannot be reached right now (refused,
    reset, starting up or shutting down): a connection that was never established cannot have done anything."""
    if isinstance(exc, OSError):  # asyncpg raises ConnectionRefusedError & co. unwrapped
        return True
    if type(exc).__name__ in _UNAVAILABLE_ERRORS or getattr(exc, "sqlstate", None) in _UNAVAILABLE_SQLSTATES:
        return True  # the driver's own error (`Database.driver_scalar`)
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        # SQLAlchemy's asyncpg adapter wraps the driver's error in its own generic `Error` class (so its name says
        # nothing): the driver's error is its cause, and the SQLSTATE is on both. A server that is still starting up
        # or recovering answers 57P03 ("the database system is starting up" / "not yet accepting connections") for
        # a moment after it listens again: that is a restart still under way, not a failure.
        for err in (exc.orig, getattr(exc.orig, "__cause__", None)):
            if err is None:
                continue
            if isinstance(err, OSError) or type(err).__name__ in _UNAVAILABLE_ERRORS:
                return True
            if getattr(err, "sqlstate", None) in _UNAVAILABLE_SQLSTATES:
                return True
    return False


def store_unreachable(exc: BaseException) -> bool:
    """Whether an error a store call raised says the database cannot be reached right now (the caller may retry):
    a connection refused or reset, or a database error `unavailable` recognises."""
    return isinstance(exc, ConnectionError) or (isinstance(exc, DBAPIError) and unavailable(exc)) or _driver_down(exc)


def _driver_down(exc: BaseException) -> bool:
    """An asyncpg error (`Database.driver_scalar`) that says the database cannot be reached right now."""
    return type(exc).__module__.startswith("asyncpg") and unavailable(exc)


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
        pool_size: int = 20,
        echo: bool = False,
        pre_ping: bool = True,
        unavailable_wait_s: float = 0.0,
        server_writes: bool = True,
        driver_writes: bool = True,
    ) -> None:
        """`pre_ping` (the API) tests a pooled connection before use when it sat idle a second or more
        (`_test_on_checkout`); `pre_ping=False` (the worker pools) only discards one the driver knows is closed; a
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
            # No overflow: an overflow connection is closed when it is returned to a full pool, so a burst of
            # concurrent writes (a hundred admissions at once) opened and closed one per transaction - a backend
            # started, a handshake and every statement prepared again: 35 connections per 100 task items in
            # bench/overhead.py. Connections are opened lazily up to `pool_size` and then kept; the most a process
            # holds (20 by default) is what pool_size + overflow allowed before.
            kwargs.update(pool_size=pool_size, max_overflow=0, pool_pre_ping=False, pool_recycle=1800)
        self.engine: AsyncEngine = create_async_engine(url, **kwargs)
        if not self.is_sqlite:
            _test_on_checkout(self.engine, ping=pre_ping)
        if self.is_sqlite:
            _configure_sqlite(self.engine)
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self._autocommit_engine = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self.server_writes = server_writes and not self.is_sqlite
        """PostgreSQL: fenced writes run as one call of a server-side function (migration 0008) instead of one round
        trip per statement (crewwork/store/fencing/rule.py). `server_writes=False` (the setting
        `CREWWORK_STORE_SERVER_WRITES`) runs the Python path, which SQLite always runs (docs/performance.md, "Fourth
        round")."""
        self.driver_writes = self.server_writes and driver_writes
        """PostgreSQL: the server-side fenced write is sent on the pooled connection's driver (`driver_scalar`), not
        through SQLAlchemy's execution layers (the setting `CREWWORK_STORE_DRIVER_WRITES`; docs/performance.md)."""

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

    async def autocommit_scalar(self, stmt: Any, params: dict[str, Any]) -> Any:
        """Execute one statement outside an explicit transaction (a single statement is its own, atomic one) and
        return its scalar: one round trip, no `BEGIN`/`COMMIT`. Waits for an unreachable database like `session`.

        A pooled connection found dead on first use (`connection_invalidated`) runs the statement once more on a
        fresh connection. The statement can only have run already if the server committed it and died before its
        answer; for a fenced write that is the same scheduled attempt writing twice at one rank, which the fence
        accepts as it accepts a local activity re-run (crewwork/store/fencing/rule.py)."""
        return await self._autocommit(stmt, params, lambda result: result.scalar_one())

    async def autocommit_first(self, stmt: Any, params: dict[str, Any] | None = None) -> Any:
        """Like `autocommit_scalar`, returning the statement's first row (or None): a read that needs no
        transaction of its own (one round trip instead of `BEGIN`, the statement and the end of the transaction)."""
        return await self._autocommit(stmt, params or {}, lambda result: result.first())

    async def _autocommit(self, stmt: Any, params: dict[str, Any], fetch: Callable[[Any], Any]) -> Any:
        for attempt in (1, 2):
            try:
                async with self._autocommit_connection() as conn:
                    return fetch(await conn.execute(stmt, params))
            except DBAPIError as exc:
                if attempt == 1 and exc.connection_invalidated:
                    continue
                raise
        raise AssertionError("unreachable")

    async def driver_scalar(self, sql: str, *args: Any) -> Any:
        """PostgreSQL: run one statement (`$1`-style parameters) straight on a pooled connection's asyncpg driver,
        outside a transaction, and return its scalar: `autocommit_scalar` without SQLAlchemy's execution layers.

        For the hottest statement, the fenced write (four per `task` item): through SQLAlchemy's `Connection` one call
        cost ~390 us of the caller's CPU, on the driver with the pool's checkout ~150 us (`bench/trace.py`; the
        driver's own round trip ~85 us). The connection comes from the same pool (the same checkout test, the same
        bound on connections) and goes back to it with no transaction open. The same contract as
        `autocommit_scalar`: waits for an unreachable database, and a pooled connection found dead runs the statement
        once more on a fresh one. An error from the driver is raised as the driver raised it; `unavailable` and
        `store_unreachable` know its connection errors."""
        for attempt in (1, 2):
            proxied = await self._driver_checkout()
            try:
                return await proxied.driver_connection.fetchval(sql, *args)
            except Exception as exc:
                if driver_disconnect(exc, proxied.driver_connection):
                    proxied.invalidate(exc)
                    if attempt == 1:
                        continue
                raise
            # Cancelled mid-statement (the caller's activity was cancelled): the driver asks the server to cancel the
            # statement and the connection goes back to the pool usable. Closing it instead would leave the backend
            # to run the statement once the lock it waits for is released, behind the caller's back
            # (tests/store/test_store_server_write_attacks.py).
            finally:
                proxied.close()
        raise AssertionError("unreachable")

    async def _driver_checkout(self) -> Any:
        return await self._opened(self.engine.raw_connection)

    @asynccontextmanager
    async def _autocommit_connection(self) -> AsyncIterator[Any]:
        async def start() -> Any:
            conn = self._autocommit_engine.connect()
            await conn.start()
            return conn

        conn = await self._opened(start)
        try:
            yield conn
        finally:
            await conn.close()

    async def _opened(self, open_connection: Callable[[], Awaitable[T]]) -> T:
        """`open_connection()`, waiting with backoff (bounded by `unavailable_wait_s`) while the database cannot be
        reached: nothing has run on a connection that was never opened, so waiting is always safe."""
        deadline = time.monotonic() + self.unavailable_wait_s
        delay = 0.1
        while True:
            try:
                return await open_connection()
            except (OSError, DBAPIError) as exc:
                remaining = deadline - time.monotonic()
                if self.unavailable_wait_s <= 0 or not unavailable(exc) or remaining <= 0:
                    raise
                pause = min(delay, remaining)
                log.warning("the store is unreachable (%s); retrying in %.1fs", type(exc).__name__, pause)
                await asyncio.sleep(pause)
                delay = min(delay * 2, 2.0)

    def built_once(self, key: Hashable, build: Callable[[], T]) -> T:
        """What `build` returns (a statement), built on first use and kept for this store's life: for the statements
        of the hot paths, building a SQLAlchemy statement and its cache key per call cost more CPU than the round
        trips they save (py-spy, bench/trace.py)."""
        built: dict[Hashable, Any] = self.__dict__.setdefault("_built_once", {})
        if key not in built:
            built[key] = build()
        return built[key]  # type: ignore[no-any-return]

    async def any_row(self, key: Hashable, build: Callable[[], Any]) -> bool:
        """Whether the read `build()` (a select of one indexed column with LIMIT 1, built once under `key`) finds a
        row: one round trip outside a transaction. The work queues polled by every API process (the webhook outbox,
        the forge and error intakes) ask this before they claim: with nothing due (nearly always), a claim is a
        transaction of three round trips with a row lock; an idle API process spent ~6.5 ms of CPU a second on the
        outbox alone, ~4 with this first (/proc over 30 s idle)."""
        stmt = self.built_once(key, build)
        if self.is_sqlite:
            async with self.session() as s:
                return (await s.execute(stmt)).first() is not None
        return await self.autocommit_first(stmt) is not None

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
