"""Rate-limit buckets shared by every API process: one row per bucket, charged by one atomic upsert.

Each bucket is a GCRA token bucket (the generic cell rate algorithm: a token bucket kept as a single number, the
*theoretical arrival time* `tat`, the moment the bucket would be full again). With rate r per second and burst b, a
request at time t is allowed when `max(tat, t) + 1/r - t <= b/r`, and then moves `tat` to `max(tat, t) + 1/r`; a
refused request leaves `tat` alone, so hammering a full bucket does not push its refill further out. `t` is the
later of the charge's own time and the bucket's last charge (a bucket's clock never goes back). The check and
the update are one `INSERT ... ON CONFLICT DO UPDATE ... RETURNING` statement, so concurrent API processes (and
concurrent requests in one) never both take the last token. Time is the database's clock, never a process's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Float, String, bindparam, case, delete, func, literal, literal_column, select, true
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement

from crewwork.store.auth import Principal, hash_api_key, key_lookup, principal_of
from crewwork.store.engine import Database
from crewwork.store.tables import RateLimit

EPSILON_S = 1e-5
PRUNE_EVERY = 1000
"""Every this many charges a process deletes the buckets that have refilled completely (they equal no row)."""


@dataclass(frozen=True)
class Charge:
    allowed: bool
    retry_after_s: float
    """0 when allowed, else the seconds until the bucket has a token again."""


class RateLimitStore(Database):
    _charges = 0

    def _statement_now(self) -> ColumnElement[float]:
        # One value per statement (unlike the store's `now_sql`, which is the clock at each evaluation).
        if self.is_sqlite:
            return literal_column("((julianday('now') - 2440587.5) * 86400.0)", Float)
        return literal_column("extract(epoch from statement_timestamp())::float8", Float)

    def _charge_statement(self) -> Any:
        """The charge as one statement, every value a bound parameter (`key`, `interval`, `burst`): built once per
        store. Built per call, its construction and cache key were most of the charge's CPU in the API (py-spy,
        bench/trace.py --profile api: 22% of the API's busy samples were this charge)."""
        return self.built_once("charge", self._build_charge_statement)

    def _build_charge_statement(self) -> Any:
        key = bindparam("key", type_=String)
        interval = bindparam("interval", type_=Float)
        burst = bindparam("burst", type_=Float)
        now = self._statement_now()
        ins: Any
        if self.is_sqlite:
            ins = sqlite.insert(RateLimit).values(key=key, tat=now + interval, checked_at=now, allowed=True)
        else:
            ins = _unflushed_insert(select(key, now + interval, now, true()))
        return _upserted(ins, interval, burst, sqlite_dialect=self.is_sqlite)

    def _key_charge_statement(self) -> Any:
        """PostgreSQL: an API key's lookup by its hash and the charge of its bucket (`key:<id>`, only for a key that
        is not revoked) as one statement: a data-modifying CTE, so one round trip per authenticated request instead
        of two. Every value a bound parameter (`digest`, `interval`, `burst`); built once per store."""
        return self.built_once("key_charge", self._build_key_charge_statement)

    def _build_key_charge_statement(self) -> Any:
        digest = bindparam("digest", type_=String)
        interval = bindparam("interval", type_=Float)
        burst = bindparam("burst", type_=Float)
        now = self._statement_now()
        key = key_lookup(digest).cte("api_key")
        ins = _unflushed_insert(
            select(literal("key:", String) + key.c.id, now + interval, now, true()).where(key.c.revoked_at.is_(None)),
            key,
        )
        charge = _upserted(ins, interval, burst, sqlite_dialect=False).cte("charge")
        return select(
            key.c.id,
            key.c.tenant_id,
            key.c.key_hash,
            key.c.scopes,
            key.c.revoked_at,
            charge.c.tat,
            charge.c.checked_at,
            charge.c.allowed,
        ).select_from(key.outerjoin(charge, true()))

    async def authenticate_and_charge(
        self, plain: str, *, rate_per_s: float, burst: float
    ) -> tuple[Principal | None, Charge | None]:
        """The principal of API key `plain` (None: unknown or revoked) and, for a live key, one token taken from its
        bucket `key:<key id>`. On PostgreSQL one statement (`_key_charge_statement`); on SQLite, which cannot put an
        INSERT in a CTE, the lookup and then the charge."""
        digest = hash_api_key(plain)
        if self.is_sqlite:
            key = await self.autocommit_first(key_lookup(digest))
            principal = None if key is None else principal_of(*key, digest=digest)
            if principal is None:
                return None, None
            return principal, await self.charge_rate_limit(
                f"key:{principal.key_id}", rate_per_s=rate_per_s, burst=burst
            )
        interval = 1.0 / rate_per_s
        row = await self.autocommit_first(
            self._key_charge_statement(), {"digest": digest, "interval": interval, "burst": float(burst)}
        )
        if row is None:
            return None, None
        principal = principal_of(*row[:5], digest=digest)
        if principal is None:
            return None, None
        tat, checked_at, ok = row[5:]
        return principal, await self._charged(tat, checked_at, ok, interval, float(burst))

    async def charge_rate_limit(self, key: str, *, rate_per_s: float, burst: float) -> Charge:
        """Take one token from bucket `key` (created full on first use)."""
        interval = 1.0 / rate_per_s
        stmt = self._charge_statement()
        params = {"key": key, "interval": interval, "burst": float(burst)}
        if self.is_sqlite:
            async with self.session() as s:
                tat, checked_at, ok = (await s.execute(stmt, params)).one()
        else:
            tat, checked_at, ok = await self.autocommit_first(stmt, params)
        return await self._charged(tat, checked_at, ok, interval, float(burst))

    async def _charged(self, tat: float, checked_at: float, ok: bool, interval: float, burst: float) -> Charge:
        """A charge's answer from the bucket's row after it; every `PRUNE_EVERY` charges, full buckets are deleted."""
        RateLimitStore._charges += 1
        if RateLimitStore._charges % PRUNE_EVERY == 0:
            async with self.session() as s:
                await s.execute(delete(RateLimit).where(RateLimit.tat < checked_at))
        if ok:
            return Charge(True, 0.0)
        # Allowed again once max(tat, t) + interval - t <= burst * interval, i.e. after this wait:
        return Charge(False, max(0.001, float(tat) + interval - float(checked_at) - burst * interval))


def _unflushed_insert(rows: Any, source: Any = None) -> Any:
    """PostgreSQL: the charge's INSERT of `rows` (key, tat, checked_at, allowed; selected from `source` when given)
    in a transaction that does not wait for the WAL flush. A charge lost in a crash only forgives one request. set_config(..., true) lasts until the end
    of the statement's own (implicit) transaction, so its commit does not wait, and the charge is one round trip
    (BEGIN, SET LOCAL, the upsert and COMMIT were four, on every request)."""
    no_flush = select(func.set_config("synchronous_commit", "off", True).label("no_flush")).subquery()
    return postgresql.insert(RateLimit).from_select(
        ["key", "tat", "checked_at", "allowed"],
        rows.select_from(no_flush) if source is None else rows.select_from(source).join(no_flush, true()),
    )


def _upserted(ins: Any, interval: Any, burst: Any, *, sqlite_dialect: bool) -> Any:
    """The GCRA update of a bucket's row on `ins`, the charge's INSERT (a new bucket is created full, less one
    token), returning the row after it."""
    # A bucket's clock never goes back: a charge whose statement started before the last charge of the row
    # (PostgreSQL stamps a statement when it arrives, before it waits for the row's lock) acts at that charge's
    # time. Otherwise it could be refused where the later-stamped charge just after it is allowed, and be told
    # to retry in the moment between their stamps instead of the interval.
    greatest = func.max if sqlite_dialect else func.greatest
    t = greatest(ins.excluded.checked_at, RateLimit.checked_at)
    start = greatest(RateLimit.tat, t)
    # The slack absorbs float rounding at epoch magnitudes (a full bucket sits exactly on the boundary).
    allowed = start + interval - t <= burst * interval + EPSILON_S
    return ins.on_conflict_do_update(
        index_elements=[RateLimit.key],
        set_={"tat": case((allowed, start + interval), else_=RateLimit.tat), "checked_at": t, "allowed": allowed},
    ).returning(RateLimit.tat, RateLimit.checked_at, RateLimit.allowed)
