"""A tenant's registered repositories as the MCP tools reach them: the registration the tenant names (another
tenant's is the same "not found" as a missing one), this host's mirror of it fetched with the tenant's credential,
and the commit a ref names there (crewwork.repos.trees rules).

A mirror is fetched when it is missing, when a branch or tag name is asked for and the last fetch is older than
CREWWORK_MCP_MIRROR_MAX_AGE_S, and once more when a name or commit is not found in it. Reads hold the mirror's
shared "use" lock (crewwork.repos.mirror), so it is not evicted under them.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from crewwork.config import Settings
from crewwork.models import RepoSpec
from crewwork.repos.credentials import CredentialError
from crewwork.repos.git import RemoteError
from crewwork.repos.mirror import META
from crewwork.repos.remote import Remote
from crewwork.repos.service import RepoPolicyError, Repositories
from crewwork.repos.tenancy import RepositoryNotFound, RepositoryRegistry
from crewwork.repos.trees import TreeError, TreeIndex, load_index, parse_ref, resolve_commit
from crewwork.store.store import Store
from crewwork.store.views import StoredRepository
from crewwork.urls import RepoURLError


class McpToolError(Exception):
    """A tool's answer is an error: `code` (stable, machine-readable) and a message safe to show the tenant."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def not_found(name: str) -> McpToolError:
    # The same words whether another tenant registered it or nobody did.
    return McpToolError("not_found", f"no repository {name[:200]!r} is registered for this tenant")


@dataclass
class OpenRepo:
    """One registration, its mirror on this host and the commit a ref named."""

    registration: StoredRepository
    git_dir: Path
    commit: str
    ref: str
    settings: Settings

    @property
    def scope(self) -> str:
        """What every cache of this repository is keyed by: the tenant's own registration (never shared)."""
        return self.registration.id

    async def index(self) -> TreeIndex:
        m = self.settings.mcp
        try:
            return await load_index(
                self.git_dir, self.commit, scope=self.scope, max_entries=m.max_tree_entries, timeout_s=m.git_timeout_s
            )
        except TreeError as exc:
            raise McpToolError(exc.code, str(exc)) from None


class TenantRepositories:
    def __init__(self, store: Store, settings: Settings, repos: Repositories, tenant_id: str) -> None:
        self.store = store
        self.settings = settings
        self.repos = repos
        self.tenant_id = tenant_id
        self.registry = RepositoryRegistry(store, settings, repos)

    async def list(self) -> list[StoredRepository]:
        return await self.store.list_repositories(self.tenant_id)

    async def registration(self, name: str) -> StoredRepository:
        """The tenant's registration named by its id or its URL (normalised). Never registers anything."""
        if not isinstance(name, str) or not name or len(name) > 4096:
            raise not_found(str(name))
        try:
            if "/" not in name and ":" not in name:  # an id (repo_…); a URL or path has one of them
                return await self.registry.resolve(RepoSpec(id=name), self.tenant_id)
            url = await self.registry.normalise(name, self.tenant_id, must_exist=False)
            row = await self.store.find_repository(self.tenant_id, url.url)
            if row is None:
                raise not_found(name)
            return await self.registry.resolve(RepoSpec(id=row.id), self.tenant_id)
        except (RepositoryNotFound, RepoPolicyError, RepoURLError, ValueError) as exc:
            if isinstance(exc, RepoPolicyError) and "no longer usable" in str(exc):
                raise McpToolError("repository_unavailable", str(exc)) from None
            raise not_found(name) from None

    async def remote(self, reg: StoredRepository) -> Remote:
        url = self.repos.locate(reg.url)
        try:
            return self.repos.remote(url, await self.store.tenant_ref(self.tenant_id), reg.credential)
        except CredentialError as exc:
            raise McpToolError("repository_unavailable", f"repository {reg.id}: {exc}") from None

    async def _fetch(self, remote: Remote) -> None:
        try:
            await self.repos.mirrors.ensure(remote, None)
        except RemoteError as exc:
            raise McpToolError(
                "repository_unavailable", f"repository {remote.name} could not be fetched: {exc}"
            ) from None

    def _age_s(self, git_dir: Path) -> float | None:
        try:
            meta = json.loads((git_dir / META).read_text())
            return time.time() - float(meta["fetched_at"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @contextlib.asynccontextmanager
    async def open(self, name: str, ref: str | None) -> AsyncIterator[OpenRepo]:
        """The repository `name` at `ref` (its registered default ref when None), its mirror held while the block runs."""
        reg = await self.registration(name)
        wanted = ref if ref is not None else reg.default_ref
        try:
            parsed = parse_ref(wanted)
        except TreeError as exc:
            raise McpToolError(exc.code, str(exc)) from None
        remote = await self.remote(reg)
        git_dir = self.repos.mirrors.path(remote.url)
        age = self._age_s(git_dir)
        fetched = False
        if age is None or (not parsed.hex and age > self.settings.mcp.mirror_max_age_s):
            await self._fetch(remote)
            fetched = True
        timeout = self.settings.mcp.git_timeout_s
        try:
            try:
                commit = await resolve_commit(git_dir, wanted, scope=reg.id, timeout_s=timeout)
            except TreeError as exc:
                if exc.code != "not_found" or fetched:
                    raise
                await self._fetch(remote)
                commit = await resolve_commit(git_dir, wanted, scope=reg.id, timeout_s=timeout)
        except TreeError as exc:
            raise McpToolError(exc.code, str(exc)) from None
        try:
            async with self.repos.mirrors.using(remote, commit) as (held, _stats):
                yield OpenRepo(reg, held, commit, wanted, self.settings)
        except RemoteError as exc:
            raise McpToolError("repository_unavailable", str(exc)) from None
