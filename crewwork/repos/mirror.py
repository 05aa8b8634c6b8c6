"""A per-host cache of bare mirrors, one per repository, that worktrees are checked out from.

Nothing is shared between hosts: each worker host fetches what it needs into its own cache, on demand (only when the
wanted commit is missing), and the diff travels between hosts in the store.

Layout under the root (`CREWWORK_MIRROR_DIR`, default DATA/mirrors):

    <slug>-<hash>.git/            the bare mirror (refs/heads/* and refs/tags/* of the remote)
    <slug>-<hash>.git/crewwork-mirror.json   its URL, size and last fetch
    .locks/<slug>-<hash>.fetch    exclusive while cloning, fetching or evicting
    .locks/<slug>-<hash>.use      shared while a workspace is made from the mirror, exclusive while evicting
    .tmp/                         clones in progress (renamed into place when complete: atomic first clone)

Concurrency: several pool processes on one host share the cache. The first clone of a repository happens in
`.tmp/` under the fetch lock and is renamed into place, so a half-cloned mirror is never seen. Fetches take the
fetch lock; readers need none (git adds objects and moves refs atomically). A workspace reads the mirror's objects
(crewwork.workspace.gitops.PrivateGit's alternates) for as long as it lives, so an activity holds the mirror (`hold`: a
shared flock on its use lock, released with the workspace, or by the kernel if the process dies). Eviction (least
recently used first, beyond `max_bytes`) takes both locks without waiting and skips a mirror that is held,
being fetched, or still has worktrees.

Every mirror's own config switches hooks and fsmonitor off, so no git command on it can execute anything either.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from crewwork.boundary.urls import RepoURL
from crewwork.repos.git import RemoteNotFound, git_env, hardening, run_git
from crewwork.repos.remote import HEADS_AND_TAGS, Remote

log = logging.getLogger("crewwork.repos.mirror")

META = "crewwork-mirror.json"
LAST_USE = "crewwork-last-use"
# Written into every mirror's config: local git commands on the mirror (worktree add, checkout, commit-tree) then
# run no hooks and no fsmonitor whatever environment they are started with.
MIRROR_CONFIG = {
    "core.hooksPath": os.devnull,
    "core.fsmonitor": "false",
    "gc.auto": "0",
    "maintenance.auto": "false",
    "receive.denyCurrentBranch": "refuse",
    "uploadpack.allowAnySHA1InWant": "false",
}


@dataclass
class FetchStats:
    """What `ensure` did, as evidence: whether it fetched, and how long it took."""

    cloned: bool = False
    fetched: bool = False
    seconds: float = 0.0


@dataclass
class MirrorHold:
    """A mirror kept from eviction until `release()` (a shared flock held on an open file)."""

    gitdir: Path
    stats: FetchStats
    _fd: int | None = None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def mirror_key(url: RepoURL) -> str:
    digest = hashlib.sha256(url.url.encode()).hexdigest()[:16]
    tail = url.path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or "repo"
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", f"{url.host or 'local'}-{tail}")[:48]
    return f"{slug}-{digest}"


@contextlib.asynccontextmanager
async def file_lock(path: Path, *, shared: bool = False, wait: bool = True) -> AsyncIterator[bool]:
    """An flock on `path` (created if missing), polled so the event loop never blocks. Yields False without waiting
    when `wait` is False and the lock is taken."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    held = False
    try:
        delay = 0.01
        while True:
            try:
                fcntl.flock(fd, mode)
                held = True
                break
            except BlockingIOError:
                if not wait:
                    break
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.2)
        yield held
    finally:
        if held:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class MirrorCache:
    """Bare mirrors of remote repositories on this host, bounded by `max_bytes` (LRU)."""

    def __init__(self, root: Path, max_bytes: int = 20 * 1024**3, *, fsck: bool = True) -> None:
        self.root = Path(root).resolve()
        self.max_bytes = max_bytes
        self.fsck = fsck
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, url: RepoURL) -> Path:
        return self.root / f"{mirror_key(url)}.git"

    def _lock(self, url: RepoURL, kind: str) -> Path:
        return self.root / ".locks" / f"{mirror_key(url)}.{kind}"

    async def has_commit(self, gitdir: Path, commit: str) -> bool:
        if not gitdir.is_dir():
            return False
        res = await run_git(["cat-file", "-e", f"{commit}^{{commit}}"], cwd=gitdir, git_dir=gitdir, timeout_s=60)
        return res.code == 0

    async def ensure(self, remote: Remote, want: str | None = None) -> tuple[Path, FetchStats]:
        """The mirror of `remote`, holding commit `want`. Fetches only when the commit is missing (always when
        `want` is None). Raises RemoteNotFound when the remote does not have it, other RemoteErrors as they come."""
        started = time.monotonic()
        stats = FetchStats()
        gitdir = self.path(remote.url)
        if want is not None and await self.has_commit(gitdir, want):
            self._touch(gitdir)
            return gitdir, stats
        async with file_lock(self._lock(remote.url, "fetch")):
            if not gitdir.is_dir():
                await self._clone(remote, gitdir)
                stats.cloned = stats.fetched = True
            elif want is None or not await self.has_commit(gitdir, want):
                await remote.fetch(gitdir, *HEADS_AND_TAGS, prune=True)
                stats.fetched = True
            if want is not None and not await self.has_commit(gitdir, want):
                # Not under any branch or tag: ask for the commit itself (servers allow it when it is reachable).
                with contextlib.suppress(RemoteNotFound):
                    await remote.fetch(gitdir, want)
                if not await self.has_commit(gitdir, want):
                    raise RemoteNotFound(f"commit {want} is not in {remote.name}", remote.name)
            if stats.fetched:
                self._write_meta(gitdir, remote.url)
        self._touch(gitdir)
        stats.seconds = time.monotonic() - started
        if stats.fetched:
            await asyncio.to_thread(self.evict, {gitdir.name})
        return gitdir, stats

    async def _clone(self, remote: Remote, gitdir: Path) -> None:
        tmp = self.root / ".tmp" / f"{gitdir.stem}-{uuid.uuid4().hex[:8]}.git"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        try:
            res = await run_git(["init", "--quiet", "--bare", "--template=", str(tmp)], cwd=self.root, timeout_s=60)
            if res.code != 0:
                raise OSError(f"git init of a mirror failed: {res.err.strip()}")
            for key, value in MIRROR_CONFIG.items():
                await run_git(["config", key, value], cwd=tmp, git_dir=tmp, timeout_s=60)
            await remote.fetch(tmp, *HEADS_AND_TAGS)
            # The remote's default branch, so HEAD in the mirror means what it means on the remote.
            head = await remote.git("ls-remote", "--symref", "--", remote.url.url, "HEAD", cwd=tmp, git_dir=tmp)
            m = re.match(r"ref: (refs/heads/\S+)\tHEAD", head.out)
            if m:
                await run_git(["symbolic-ref", "HEAD", m.group(1)], cwd=tmp, git_dir=tmp, timeout_s=60)
            os.rename(tmp, gitdir)  # atomic: a mirror is either complete or absent
        finally:
            if tmp.exists():
                await asyncio.to_thread(shutil.rmtree, tmp, True)

    @contextlib.asynccontextmanager
    async def using(self, remote: Remote, want: str | None) -> AsyncIterator[tuple[Path, FetchStats]]:
        """The mirror holding `want`, protected from eviction while the block runs."""
        async with file_lock(self._lock(remote.url, "use"), shared=True):
            yield await self.ensure(remote, want)

    async def hold(self, remote: Remote, want: str | None) -> MirrorHold:
        """The mirror holding `want`, protected from eviction until the returned hold is released. For what lives
        longer than one call: a workspace made from the mirror reads its objects until it is removed."""
        path = self._lock(remote.url, "use")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            delay = 0.01
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:  # an eviction is deciding about this mirror right now
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.2)
            gitdir, stats = await self.ensure(remote, want)
        except BaseException:
            os.close(fd)
            raise
        return MirrorHold(gitdir, stats, fd)

    def _touch(self, gitdir: Path) -> None:
        with contextlib.suppress(OSError):
            (gitdir / LAST_USE).touch()

    def _write_meta(self, gitdir: Path, url: RepoURL) -> None:
        meta = {"url": url.url, "fetched_at": time.time(), "bytes": _du(gitdir)}
        tmp = gitdir / f"{META}.tmp"
        tmp.write_text(json.dumps(meta))
        tmp.replace(gitdir / META)

    def entries(self) -> list[tuple[Path, float, int]]:
        """(git dir, last use, bytes) of every complete mirror."""
        out = []
        for d in self.root.glob("*.git"):
            try:
                meta = json.loads((d / META).read_text())
                last = (d / LAST_USE).stat().st_mtime if (d / LAST_USE).exists() else d.stat().st_mtime
                out.append((d, last, int(meta.get("bytes", 0))))
            except (OSError, ValueError):
                continue
        return out

    def evict(self, keep: set[str] | None = None) -> list[str]:
        """Remove least-recently-used mirrors until the cache fits in `max_bytes`. A mirror that is being used or
        fetched, or that still has worktrees, stays. Returns the names removed."""
        keep = keep or set()
        entries = sorted(self.entries(), key=lambda e: e[1])
        total = sum(size for _, _, size in entries)
        removed: list[str] = []
        for gitdir, _, size in entries:
            if total <= self.max_bytes:
                break
            if gitdir.name in keep:
                continue
            if self._evict_one(gitdir):
                total -= size
                removed.append(gitdir.name)
        return removed

    def _evict_one(self, gitdir: Path) -> bool:
        stem = gitdir.name.removesuffix(".git")
        fds = []
        try:
            for kind in ("use", "fetch"):
                p = self.root / ".locks" / f"{stem}.{kind}"
                p.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o600)
                fds.append(fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
            _prune_worktrees(gitdir)
            wt = gitdir / "worktrees"
            if wt.is_dir() and any(wt.iterdir()):
                return False
            trash = self.root / ".tmp" / f"evicted-{stem}-{uuid.uuid4().hex[:8]}"
            trash.parent.mkdir(parents=True, exist_ok=True)
            os.rename(gitdir, trash)
            shutil.rmtree(trash, ignore_errors=True)
            log.info("evicted mirror %s", gitdir.name)
            return True
        finally:
            for fd in fds:
                os.close(fd)

    def sweep(self, min_age_s: float) -> list[str]:
        """Remove what processes that died on this host left in the cache (the host sweep, crewwork/workspace/
        sweep.py): a clone that never finished or an evicted mirror still in `.tmp/`, and git's own lock files
        (`*.lock`) in a mirror, which make every later fetch fail ("File exists"). Only for a mirror whose fetch lock
        no live process holds (cloning and fetching hold it), and only what is older than `min_age_s`."""
        removed: list[str] = []
        cutoff = time.time() - min_age_s
        tmp_root = self.root / ".tmp"
        for gitdir in sorted({*self.root.glob("*.git"), *tmp_root.glob("*.git")}):
            stem = gitdir.name.removesuffix(".git")
            stem = stem.rsplit("-", 1)[0] if gitdir.parent == tmp_root else stem
            lock = self.root / ".locks" / f"{stem}.fetch"
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o600)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # being cloned or fetched right now
                if gitdir.parent == tmp_root:
                    if _mtime(gitdir) < cutoff:
                        shutil.rmtree(gitdir, ignore_errors=True)
                        removed.append(str(gitdir))
                    continue
                for stale in [*gitdir.glob("*.lock"), *(gitdir / "refs").rglob("*.lock")]:
                    if not stale.is_symlink() and _mtime(stale) < cutoff:
                        with contextlib.suppress(OSError):
                            stale.unlink()
                            removed.append(str(stale))
            finally:
                os.close(fd)
        for trash in tmp_root.glob("evicted-*"):
            if _mtime(trash) < cutoff:
                shutil.rmtree(trash, ignore_errors=True)
                removed.append(str(trash))
        return removed

    async def prune(self, url: RepoURL) -> None:
        """Forget worktrees of this mirror whose directories are gone (a crashed or cleaned-up attempt)."""
        gitdir = self.path(url)
        if gitdir.is_dir():
            await run_git(["worktree", "prune"], cwd=gitdir, git_dir=gitdir, timeout_s=60)


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return float("inf")


def _prune_worktrees(gitdir: Path) -> None:
    import subprocess

    subprocess.run(
        ["git", *hardening(), f"--git-dir={gitdir}", "worktree", "prune"],
        cwd=gitdir,
        env=git_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total
