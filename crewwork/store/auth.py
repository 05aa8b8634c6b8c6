"""Tenants and API keys. Keys are shown once and stored only as hashes."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update

from crewwork.models.ids import is_tenant_id, new_id
from crewwork.store.engine import Database
from crewwork.store.tables import ApiKey, Tenant

API_KEY_PREFIX = "cw_"


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    key_id: str
    scopes: frozenset[str]

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes


def hash_api_key(key: str) -> str:
    # API keys are 256-bit random strings, so a fast hash is not brute-forceable; no salt needed.
    return hashlib.sha256(key.encode()).hexdigest()


def key_lookup(digest: Any) -> Any:
    """The API key row whose hash is `digest` (a value or a bound parameter): (id, tenant_id, key_hash, scopes,
    revoked_at)."""
    return select(ApiKey.id, ApiKey.tenant_id, ApiKey.key_hash, ApiKey.scopes, ApiKey.revoked_at).where(
        ApiKey.key_hash == digest
    )


def principal_of(
    key_id: str, tenant_id: str, key_hash: str, scopes: str, revoked_at: float | None, *, digest: str
) -> Principal | None:
    """The principal of a looked-up key row, or None for a revoked one."""
    if revoked_at is not None or not hmac.compare_digest(key_hash, digest):
        return None
    return Principal(tenant_id=tenant_id, key_id=key_id, scopes=frozenset(x for x in scopes.split(",") if x))


class AuthStore(Database):
    async def ensure_tenant(self, name: str) -> str:
        """The id of the tenant called `name`, created if there is none. `name` may also be a tenant's id (as
        `crewwork repos --tenant` takes either): a new tenant is never given a name shaped like an id, which
        operator scopes would take for another tenant's id (crewwork.models.TenantRef)."""
        async with self.session() as s:
            if is_tenant_id(name):
                existing = await s.scalar(select(Tenant.id).where(Tenant.id == name))
                if existing:
                    return existing
                raise ValueError(
                    f"tenant name {name!r} looks like a tenant id, and no tenant has that id: give a tenant a name "
                    "(or the id of an existing tenant)"
                )
            existing = await s.scalar(select(Tenant.id).where(Tenant.name == name))
            if existing:
                return existing
            tid = new_id("tn")
            s.add(Tenant(id=tid, name=name, created_at=await self.now(s)))
            return tid

    async def create_api_key(self, tenant_name: str, scopes: Sequence[str] = ()) -> tuple[str, str]:
        """Returns (key id, plaintext key). The plaintext is shown once; only its hash is stored."""
        tenant_id = await self.ensure_tenant(tenant_name)
        plain = API_KEY_PREFIX + secrets.token_urlsafe(32)
        kid = new_id("key")
        async with self.session() as s:
            s.add(
                ApiKey(
                    id=kid,
                    tenant_id=tenant_id,
                    prefix=plain[:8],
                    key_hash=hash_api_key(plain),
                    scopes=",".join(sorted(set(scopes))),
                    created_at=await self.now(s),
                )
            )
        return kid, plain

    async def revoke_api_key(self, key_id: str) -> bool:
        async with self.session() as s:
            res = await s.execute(
                update(ApiKey)
                .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
                .values(revoked_at=await self.now(s))
            )
            return bool(res.rowcount)  # type: ignore[attr-defined]

    async def list_api_keys(self, tenant_name: str | None = None) -> list[dict[str, Any]]:
        async with self.session() as s:
            q = select(ApiKey, Tenant.name).join(Tenant, Tenant.id == ApiKey.tenant_id).order_by(ApiKey.created_at)
            if tenant_name:
                q = q.where(Tenant.name == tenant_name)
            rows = (await s.execute(q)).all()
            return [
                {
                    "id": k.id,
                    "tenant": tname,
                    "prefix": k.prefix,
                    "scopes": k.scopes,
                    "created_at": k.created_at,
                    "revoked": k.revoked_at is not None,
                }
                for k, tname in rows
            ]

    async def authenticate(self, plain: str) -> Principal | None:
        digest = hash_api_key(plain)
        # Once per API request: one statement outside a transaction (a read needs none), one round trip. (The REST
        # API looks the key up and charges its rate limit in one statement: RateLimitStore.authenticate_and_charge.)
        key = await self.autocommit_first(key_lookup(digest))
        return None if key is None else principal_of(*key, digest=digest)
