"""Workspace leases: at most one work item at a time works on a repository's target branch.

A lease is a row with holder, grant number and expiry on the database clock, renewed by the holder; every grant and
its end is kept in `lease_history`, so exclusivity can be checked after the fact (tests/invariants.py). Grant
numbers come from a per-key counter (`fences`), so later grants of a key always number higher. Leases give
liveness and exclusion only: who may *write* a work item's state is decided by fencing (crewwork.store.fencing)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.store.engine import Database
from crewwork.store.tables import Fence, Lease, LeaseHistory
from crewwork.store.views import StoredLease, first_view, select_view

WORKSPACE_PREFIX = "ws:"


def workspace_lease_key(repo: str, branch: str) -> str:
    return f"{WORKSPACE_PREFIX}{repo}#{branch}"


class LeaseStore(Database):
    def _grant_counter(self) -> object:
        ins = (sqlite.insert if self.is_sqlite else postgresql.insert)(Fence).values(
            key=bindparam("fence_key"), token=1
        )
        return ins.on_conflict_do_update(index_elements=[Fence.key], set_={"token": Fence.token + 1}).returning(
            Fence.token
        )

    async def _next_grant(self, s: AsyncSession, key: str) -> int:
        conn = await s.connection()
        return int((await conn.execute(self._grant_counter(), {"fence_key": key})).scalar_one())  # type: ignore[call-overload]

    async def acquire_lease(self, key: str, holder: str, ttl_s: float) -> tuple[int | None, str | None]:
        """Take the lease on `key` for `holder` if it is free, expired, or already `holder`'s. Returns (grant, None)
        or (None, current holder)."""
        async with self.session() as s:
            # The counter row's lock serialises concurrent acquirers of the same key.
            grant = await self._next_grant(s, key)
            row = await s.scalar(select(Lease).where(Lease.key == key).with_for_update())
            # The clock is read after the locks are granted: read before, an acquirer that waited for a release's
            # commit recorded a grant starting before that release's end (lease_history overlapping by the wait;
            # the chaos soak's lease_exclusive check saw 31 us of it), and judged expiry by a time already past.
            now = await self.now(s)
            if row is not None and row.holder != holder and row.expires_at > now:
                return None, row.holder  # the grant number is simply never used: numbers need only increase
            if row is not None:
                await s.execute(
                    update(LeaseHistory)
                    .where(LeaseHistory.key == key, LeaseHistory.token == row.token, LeaseHistory.ended_at.is_(None))
                    .values(
                        ended_at=min(now, row.expires_at),
                        end_reason="regranted" if row.expires_at > now else "expired",
                    )
                )
                row.holder, row.token, row.acquired_at, row.expires_at = holder, grant, now, now + ttl_s
            else:
                s.add(Lease(key=key, holder=holder, token=grant, acquired_at=now, expires_at=now + ttl_s))
            s.add(LeaseHistory(key=key, holder=holder, token=grant, acquired_at=now))
            return grant, None

    async def renew_lease(self, key: str, grant: int, ttl_s: float) -> bool:
        """Extend the lease if `grant` still holds it. False means it was lost."""
        async with self.session() as s:
            now = await self.now(s)
            res = await s.execute(
                update(Lease)
                .where(Lease.key == key, Lease.token == grant, Lease.expires_at > now)
                .values(expires_at=now + ttl_s)
            )
            return bool(res.rowcount)  # type: ignore[attr-defined]

    async def renew_leases_held_by(self, holder: str, key_prefix: str, ttl_s: float) -> int:
        """Extend (never shorten) every unexpired lease `holder` holds under `key_prefix`. Returns how many."""
        async with self.session() as s:
            now = await self.now(s)
            res = await s.execute(
                update(Lease)
                .where(
                    Lease.holder == holder,
                    Lease.key.startswith(key_prefix, autoescape=True),
                    Lease.expires_at > now,
                    Lease.expires_at < now + ttl_s,
                )
                .values(expires_at=now + ttl_s)
            )
            return int(res.rowcount)  # type: ignore[attr-defined]

    async def release_lease(self, key: str, grant: int | None = None, holder: str | None = None) -> bool:
        q = delete(Lease).where(Lease.key == key)
        if grant is not None:
            q = q.where(Lease.token == grant)
        if holder is not None:
            q = q.where(Lease.holder == holder)
        return bool(await self._release(q))

    async def release_leases_held_by(self, holder: str) -> int:
        """Release every lease `holder` holds (an item that ended without releasing its own). Returns how many."""
        return await self._release(delete(Lease).where(Lease.holder == holder))

    async def _release(self, q: Any) -> int:
        """Delete the leases `q` selects and end their grants in the history, in one transaction."""
        async with self.session() as s:
            now = await self.now(s)
            rows = (await s.execute(q.returning(Lease.key, Lease.token))).all()
            for key, token in rows:
                await s.execute(
                    update(LeaseHistory)
                    .where(LeaseHistory.key == key, LeaseHistory.token == token, LeaseHistory.ended_at.is_(None))
                    .values(ended_at=now, end_reason="released")
                )
            return len(rows)

    async def get_lease(self, key: str) -> StoredLease | None:
        async with self.session() as s:
            return await first_view(StoredLease, s.execute(select_view(StoredLease, Lease).where(Lease.key == key)))
