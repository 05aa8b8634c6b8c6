"""A tenant's registered repositories as the MCP tools reach them: the registration the tenant names (another
tenant's is the same "not found" as a missing one), this host's mirror of it fetched with the tenant's credential,
and the commit a ref names there (crewwork.repos.trees rules).

A mirror is fetched when it is missing, when a branch or tag name is asked for and the last fetch is older than
CREWWORK_MCP_MIRROR_MAX_AGE_S, and once more when a name or commit is not found in it. Reads hold the mirror's
shared "use" lock (crewwork.repos.mirror), so it is not evicted under them.

Every repository tool runs in a slot (`CallGate`): at most CREWWORK_MCP_MAX_CONCURRENT_CALLS per API process (more
wait, FIFO), of which at most CREWWORK_MCP_MAX_CONCURRENT_CALLS_PER_TENANT are one tenant's (one more is refused at
once as `busy`), so the git processes and parses one tenant starts cannot take the host from the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from crewwork.boundary.urls import RepoURLError
from crewwork.config import Settings
from crewwork.models import RepoSpec
from crewwork.repos.credentials import CredentialError
from crewwork.repos.git import RemoteError
from crewwork.repos.mirror import META
from crewwork.repos.remote import Remote
from crewwork.repos.tenancy import RepositoryNotFound, RepositoryRegistry
from crewwork.repos.trees import TreeError, TreeIndex, load_index, parse_ref, resolve_commit
from crewwork.repos.worker import RepoPolicyError, Repositories
from crewwork.store.store import Store
from crewwork.store.views import StoredRepository


class McpToolError(Exception):
    """A tool's answer is an error: `code` (stable, machine-readable) and a message safe to show the tenant."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def not_found(name: str) -> McpToolError:
    # The same words whether another tenant registered it or nobody did.
    return McpToolError("not_found", f"no repository {name[:200]!r} is registered for this tenant")


class CallGate:
    """Slots for repository tool calls on one event loop: `total` at once, `per_tenant` of them one tenant's."""

    def __init__(self, total: int, per_tenant: int) -> None:
        self.total = total
        self.per_tenant = per_tenant
        self.free = asyncio.Semaphore(total)
        self.held: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def slot(self, tenant_id: str) -> AsyncIterator[None]:
        if _IN_SLOT.get():  # a tool that opens two commits (git_diff) holds one slot, not two
            yield
            return
        if self.held.get(tenant_id, 0) >= self.per_tenant:
            raise McpToolError(
                "busy",
                f"this tenant already has {self.per_tenant} repository tool calls running on this server "
                "(CREWWORK_MCP_MAX_CONCURRENT_CALLS_PER_TENANT); retry when one has answered",
            )
        self.held[tenant_id] = self.held.get(tenant_id, 0) + 1
        try:
            async with self.free:
                token = _IN_SLOT.set(True)
                try:
                    yield
                finally:
                    _IN_SLOT.reset(token)
        finally:
            self.held[tenant_id] -= 1
            if not self.held[tenant_id]:
                del self.held[tenant_id]


_IN_SLOT: contextvars.ContextVar[bool] = contextvars.ContextVar("crewwork_mcp_in_slot", default=False)
_GATES: dict[tuple[int, int, int], tuple[asyncio.AbstractEventLoop, CallGate]] = {}


def call_gate(settings: Settings) -> CallGate:
    """This event loop's gate for these settings' bounds (one per API process in production; tests run several
    apps, each on its own loop)."""
    m = settings.mcp
    loop = asyncio.get_running_loop()
    key = (id(loop), m.max_concurrent_calls, m.max_concurrent_calls_per_tenant)
    found = _GATES.get(key)
    if found is None or found[0] is not loop:  # (the loop is held, so its id is not reused while it is kept here)
        if len(_GATES) > 64:  # loops of finished apps (tests); a live loop's gate is made again on its next call
            _GATES.clear()
        found = _GATES[key] = (loop, CallGate(m.max_concurrent_calls, m.max_concurrent_calls_per_tenant))
    return found[1]


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
        """The repository `name` at `ref` (its registered default ref when None), its mirror held while the block runs,
        in one of the tenant's call slots (`CallGate`)."""
        async with call_gate(self.settings).slot(self.tenant_id):
            async with self._open(name, ref) as repo:
                yield repo

    @contextlib.asynccontextmanager
    async def _open(self, name: str, ref: str | None) -> AsyncIterator[OpenRepo]:
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
