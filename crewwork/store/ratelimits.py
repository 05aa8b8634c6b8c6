"""Rate-limit buckets shared by every API process: one row per bucket, charged by one atomic upsert.

Each bucket is a GCRA token bucket (the generic cell rate algorithm: a token bucket kept as a single number, the
*theoretical arrival time* `tat`, the moment the bucket would be full again). With rate r per second and burst b, a
request at time t is allowed when `max(tat, t) + 1/r - t <= b/r`, and then moves `tat` to `max(tat, t) + 1/r`; a
refused request leaves `tat` alone, so hammering a full bucket does not push its refill further out. The check and
the update are one `INSERT ... ON CONFLICT DO UPDATE ... RETURNING` statement, so concurrent API processes (and
concurrent requests in one) never both take the last token. Time is the database's clock, never a process's.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Float, case, delete, func, literal_column
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement

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

    async def charge_rate_limit(self, key: str, *, rate_per_s: float, burst: float) -> Charge:
        """Take one token from bucket `key` (created full on first use)."""
        interval = 1.0 / rate_per_s
        now = self._statement_now()
        ins = (sqlite.insert if self.is_sqlite else postgresql.insert)(RateLimit).values(
            key=key, tat=now + interval, checked_at=now, allowed=True
        )
        t = ins.excluded.checked_at
        start = (func.max if self.is_sqlite else func.greatest)(RateLimit.tat, t)
        # The slack absorbs float rounding at epoch magnitudes (a full bucket sits exactly on the boundary).
        allowed = start + interval - t <= burst * interval + EPSILON_S
        stmt = ins.on_conflict_do_update(
            index_elements=[RateLimit.key],
            set_={"tat": case((allowed, start + interval), else_=RateLimit.tat), "checked_at": t, "allowed": allowed},
        ).returning(RateLimit.tat, RateLimit.checked_at, RateLimit.allowed)
        async with self.session() as s:
            conn = await s.connection()
            if not self.is_sqlite:
                # A charge lost in a crash only forgives one request: no need to wait for the WAL flush (which
                # would triple the cost of every API request).
                await conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
            tat, checked_at, ok = (await conn.execute(stmt)).one()
            RateLimitStore._charges += 1
            if RateLimitStore._charges % PRUNE_EVERY == 0:
                await conn.execute(delete(RateLimit).where(RateLimit.tat < checked_at))
        if ok:
            return Charge(True, 0.0)
        # Allowed again once max(tat, t) + interval - t <= burst * interval, i.e. after this wait:
        return Charge(False, max(0.001, float(tat) + interval - float(checked_at) - burst * interval))
