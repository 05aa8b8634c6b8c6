"""Repositories owned by tenants: registered once (API, CLI, or on first use where the operator allows it), then
named by the tenant's work items by id or by URL. Every read is scoped to a tenant; another tenant's repository is
not found, exactly like a missing one."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError

from crewwork.models import TenantRef
from crewwork.models.ids import new_id
from crewwork.store.engine import Database
from crewwork.store.tables import Repository, Tenant
from crewwork.store.views import StoredRepository, first_view, select_view, view_of, views_of


class RepositoryExists(ValueError):
    """The tenant already registered this URL."""

    def __init__(self, existing: StoredRepository) -> None:
        super().__init__(f"repository {existing.url} is already registered as {existing.id}")
        self.existing = existing


class RepositoryStore(Database):
    _tenant_refs: dict[str, TenantRef] | None = None

    async def create_repository(
        self,
        *,
        tenant_id: str,
        url: str,
        default_ref: str = "HEAD",
        credential: str | None = None,
        protect_paths: list[str] | None = None,
        environment: dict[str, Any] | None = None,
        auto_registered: bool = False,
        checks: list[dict[str, Any]] | None = None,
    ) -> StoredRepository:
        """Register `url` (already normalised and checked) for the tenant. RepositoryExists if it already is."""
        try:
            async with self.session() as s:
                values = {
                    "id": new_id("repo"),
                    "tenant_id": tenant_id,
                    "url": url,
                    "default_ref": default_ref,
                    "credential": credential,
                    "protect_paths": list(protect_paths or []),
                    "environment": environment,
                    "auto_registered": auto_registered,
                    "created_at": await self.now(s),
                    "checks": list(checks) if checks else None,
                }
                s.add(Repository(**values))
            return view_of(StoredRepository, values)
        except IntegrityError:
            found = await self.find_repository(tenant_id, url)
            if found is None:
                raise
            raise RepositoryExists(found) from None

    async def get_repository(self, repository_id: str, tenant_id: str | None) -> StoredRepository | None:
        """The repository if `tenant_id` owns it (any tenant's when None: operators)."""
        async with self.session() as s:
            q = select_view(StoredRepository, Repository).where(Repository.id == repository_id)
            if tenant_id is not None:
                q = q.where(Repository.tenant_id == tenant_id)
            return await first_view(StoredRepository, s.execute(q))

    async def find_repository(self, tenant_id: str, url: str) -> StoredRepository | None:
        """The tenant's registration of the normalised `url`."""
        async with self.session() as s:
            q = select_view(StoredRepository, Repository).where(
                Repository.tenant_id == tenant_id, Repository.url == url
            )
            return await first_view(StoredRepository, s.execute(q))

    async def list_repositories(self, tenant_id: str | None, *, limit: int = 500) -> list[StoredRepository]:
        async with self.session() as s:
            q = select_view(StoredRepository, Repository)
            if tenant_id is not None:
                q = q.where(Repository.tenant_id == tenant_id)
            q = q.order_by(Repository.created_at, Repository.id).limit(limit)
            return await views_of(StoredRepository, s.execute(q))

    async def count_repositories(self, tenant_id: str) -> int:
        async with self.session() as s:
            q = select(func.count()).select_from(Repository).where(Repository.tenant_id == tenant_id)
            return int((await s.execute(q)).scalar_one())

    async def delete_repository(self, repository_id: str, tenant_id: str | None) -> bool:
        """Unregister. Work items already submitted keep running on the URL they were admitted with."""
        async with self.session() as s:
            q = delete(Repository).where(Repository.id == repository_id)
            if tenant_id is not None:
                q = q.where(Repository.tenant_id == tenant_id)
            res = await s.execute(q)
            return bool(res.rowcount)  # type: ignore[attr-defined]

    async def repository_credential(self, tenant_id: str, url: str) -> str | None:
        """The credential name the tenant's registration of `url` names (what the workers present), if any."""
        async with self.session() as s:
            return await s.scalar(
                select(Repository.credential).where(Repository.tenant_id == tenant_id, Repository.url == url)
            )

    async def tenant_by_name(self, name: str) -> str | None:
        async with self.session() as s:
            return await s.scalar(select(Tenant.id).where(Tenant.name == name))

    async def tenant_name(self, tenant_id: str) -> str | None:
        async with self.session() as s:
            return await s.scalar(select(Tenant.name).where(Tenant.id == tenant_id))

    async def tenant_ref(self, tenant_id: str) -> TenantRef:
        """The tenant by id and name, as operator scopes name it. Names never change, so each is asked once."""
        if self._tenant_refs is None:
            self._tenant_refs = {}
        ref = self._tenant_refs.get(tenant_id)
        if ref is None:
            ref = TenantRef(id=tenant_id, name=await self.tenant_name(tenant_id))
            if ref.name is not None:
                self._tenant_refs[tenant_id] = ref
        return ref
