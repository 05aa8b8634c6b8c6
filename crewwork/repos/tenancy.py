"""Repositories owned by tenants: registration under the tenant's roots and credentials, and the lookup by which a
work item names one of its tenant's repositories (docs/repositories.md, "Registered repositories").

A work item's `repo` names a repository its tenant registered, by `id` or by a URL equal (once normalised) to the
registered one. Anything else (another tenant's repository, an unregistered URL, a missing id) is the same 404, so
a tenant learns nothing about what others registered. With CREWWORK_AUTO_REGISTER_REPOS (development, the demo and
the tests) an unregistered URL is registered for the submitting tenant on first use, with the same checks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crewwork.boundary.urls import RepoURL
from crewwork.config import Settings
from crewwork.models import CheckSpec, EnvironmentSpec, RepoSpec
from crewwork.repos.credentials import CredentialError
from crewwork.repos.environment import EnvironmentRejected, check_environment
from crewwork.repos.registration import RepoPolicyError, RepositoryChecks, checked_local_git_dir
from crewwork.store.repositories import RepositoryExists
from crewwork.store.store import Store
from crewwork.store.views import StoredRepository

# Kernel interfaces: never a repository, whatever they resolve to (`/proc/self/cwd` is the service's own checkout).
PSEUDO_FS = (Path("/proc"), Path("/sys"), Path("/dev"))


class TooManyRepositories(RepoPolicyError):
    """The tenant has registered as many repositories as the operator allows (CREWWORK_MAX_REPOSITORIES_PER_TENANT)."""


class RegistrationRejected(RepoPolicyError):
    """A registration the operator's policy refuses; `field` names the part of it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class RepositoryNotFound(LookupError):
    """No repository of this tenant matches. The message is the same whether another tenant has one or not."""


NOT_REGISTERED = (
    "repo.url names no repository registered for this tenant (register it first: POST /v1/repositories or "
    "`crewwork repos add`)"
)


def not_found_by_id(repository_id: str) -> str:
    return f"no repository {repository_id}"


@dataclass
class Registration:
    """What a repository is registered with (all checked by `RepositoryRegistry.register`)."""

    url: str
    default_ref: str = "HEAD"
    credential: str | None = None
    protect_paths: list[str] = field(default_factory=list)
    environment: EnvironmentSpec | None = None
    checks: list[CheckSpec] = field(default_factory=list)


class RepositoryRegistry:
    def __init__(self, store: Store, settings: Settings, repos: RepositoryChecks | None = None) -> None:
        self.store = store
        self.settings = settings
        self.repos = repos or RepositoryChecks(settings)

    async def roots(self, tenant_id: str) -> list[Path] | None:
        """The tenant's repository roots (None: anywhere, only when no roots are configured at all)."""
        name = await self.store.tenant_name(tenant_id) if self.settings.tenant_repo_roots else None
        return self.settings.repo_roots_for(tenant_id, name)

    async def normalise(self, raw: str, tenant_id: str, *, must_exist: bool) -> RepoURL:
        """`raw` as the tenant may name it: an allowed scheme; a local path resolved (symlinks, `..`, `/proc`) and
        inside the tenant's roots, and (`must_exist`) a repository whose git directory sends git nowhere else
        (crewwork.repos.local). RepoPolicyError otherwise."""
        if _through_pseudo_fs(raw):
            raise RepoPolicyError(f"repository {raw[:200]!r}: /proc, /sys and /dev paths are not repositories")
        url = self.repos.parse(raw, must_exist=must_exist, roots=await self.roots(tenant_id))
        if url.is_local and any(url.local_path.is_relative_to(p) for p in PSEUDO_FS):
            raise RepoPolicyError(f"repository {raw[:200]!r}: /proc, /sys and /dev paths are not repositories")
        if url.is_local and must_exist:
            # Its git directory must not send git elsewhere (alternates, gitdir:/commondir, symlinks out of it).
            checked_local_git_dir(url)
        return url

    # ------------------------------------------------------------------ registration

    async def register(self, tenant_id: str, reg: Registration, *, auto: bool = False) -> StoredRepository:
        """Check and store a registration; RepoPolicyError (a 422) naming what is wrong, RepositoryExists (a 409)
        when the tenant already registered the URL."""
        cap = self.settings.max_repositories_per_tenant
        if await self.store.count_repositories(tenant_id) >= cap:
            raise TooManyRepositories(f"a tenant may register at most {cap} repositories; remove one first")
        url = await self.normalise(reg.url, tenant_id, must_exist=True)
        tenant = await self.store.tenant_ref(tenant_id)
        if reg.credential is not None:
            if url.is_local:
                raise RegistrationRejected("credential: local repositories take no credential", "credential")
            try:
                self.repos.credentials.select(url, tenant, reg.credential)
            except CredentialError as exc:
                raise RegistrationRejected(f"credential: {exc}", "credential") from None
        if reg.environment is not None:
            try:
                check_environment(reg.environment, self.settings, tenant)
            except EnvironmentRejected as exc:
                raise RegistrationRejected(str(exc), "environment") from None
        # The remote is reachable with the credential and has the default ref (raises RepoPolicyError).
        await self.repos.check(
            url.url, reg.default_ref, tenant, credential=reg.credential, roots=await self.roots(tenant_id)
        )
        return await self.store.create_repository(
            tenant_id=tenant_id,
            url=url.url,
            default_ref=reg.default_ref,
            credential=reg.credential,
            protect_paths=[str(p) for p in reg.protect_paths],
            environment=reg.environment.model_dump(mode="json") if reg.environment else None,
            auto_registered=auto,
            checks=[c.model_dump(mode="json") for c in reg.checks],
        )

    # ------------------------------------------------------------------ submissions

    async def resolve(self, spec: RepoSpec, tenant_id: str) -> StoredRepository:
        """The tenant's repository a work item names. RepositoryNotFound (404) when it names none of them;
        RepoPolicyError (422) when it names one that is no longer usable (moved outside the tenant's roots)."""
        if spec.id is not None:
            row = await self.store.get_repository(spec.id, tenant_id)
            if row is None:
                raise RepositoryNotFound(not_found_by_id(spec.id))
            if spec.url is not None and not await self._same(spec.url, row, tenant_id):
                raise RepoPolicyError(f"repo.url does not name repository {row.id} ({row.url})")
        else:
            assert spec.url is not None
            row = await self._by_url(spec.url, tenant_id)
        await self._still_usable(row, tenant_id)
        return row

    async def _by_url(self, raw: str, tenant_id: str) -> StoredRepository:
        try:
            url = await self.normalise(raw, tenant_id, must_exist=False)
        except RepoPolicyError:
            if self.settings.auto_register_repos:
                raise
            raise RepositoryNotFound(NOT_REGISTERED) from None
        row = await self.store.find_repository(tenant_id, url.url)
        if row is not None:
            return row
        if not self.settings.auto_register_repos:
            raise RepositoryNotFound(NOT_REGISTERED)
        try:
            return await self.register(tenant_id, Registration(url=raw), auto=True)
        except RepositoryExists as exc:  # registered concurrently
            return exc.existing

    async def _same(self, raw: str, row: StoredRepository, tenant_id: str) -> bool:
        try:
            return (await self.normalise(raw, tenant_id, must_exist=False)).url == row.url
        except RepoPolicyError:
            return False

    async def _still_usable(self, row: StoredRepository, tenant_id: str) -> None:
        """A local repository is checked again at each use: the tenant's roots may have changed, or a directory on
        the way may have been swapped for a symlink since it was registered."""
        if not row.url.startswith("/"):
            return
        try:
            url = await self.normalise(row.url, tenant_id, must_exist=True)
        except RepoPolicyError as exc:
            raise RepoPolicyError(f"repository {row.id} is no longer usable: {exc}") from None
        if url.url != row.url:
            raise RepoPolicyError(f"repository {row.id} is no longer usable: {row.url} now resolves to {url.url}")


def _through_pseudo_fs(raw: str) -> bool:
    """A local path (or file:// URL) that names a kernel interface before any resolution (`/proc/self/cwd`,
    `/../proc/1/root`)."""
    path = raw[len("file://") :] if raw.lower().startswith("file://") else raw
    if not path.startswith("/"):
        return False
    normal = Path(os.path.normpath(path))
    return any(normal == p or normal.is_relative_to(p) for p in PSEUDO_FS)


def repository_view(row: StoredRepository) -> dict[str, Any]:
    """A registration as the API shows it (the credential by name only; there is no secret to show)."""
    return {
        "id": row.id,
        "url": row.url,
        "default_ref": row.default_ref,
        "credential": row.credential,
        "protect_paths": list(row.protect_paths or []),
        "environment": row.environment,
        "checks": list(row.checks or []),
        "auto_registered": row.auto_registered,
        "created_at": row.created_at,
    }
