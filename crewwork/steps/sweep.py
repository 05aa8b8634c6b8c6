"""The per-host sweep: what attempts that died on this host left on its disk, removed at pool start and periodically
(`CREWWORK_SWEEP_INTERVAL_S`), never from under a live attempt.

| what | left by | stale when |
|---|---|---|
| a workspace home `WORKTREES/<item>/<name>` (its loop disk unmounted first) | an agent run or validation whose process died (killed, OOM, the host lost power and came back) | no live process holds its lock (crewwork/workspace/liveness.py) and it is older than `min_age_s` |
| an item's empty directory under WORKTREES | the item's cleanup running on another host | empty and older than `min_age_s` |
| a half-finished clone or an evicted mirror in `MIRRORS/.tmp`, git `*.lock` files in a mirror | a clone, fetch or eviction killed half way | the mirror's fetch lock is free and they are older than `min_age_s` (crewwork/repos/mirror.py) |
| a half-built prepared environment, a lock file of a key with no entry | a setup killed half way | its lock is free and it is older than `min_age_s` (crewwork/sandbox/prepare.py) |
| a Docker sandbox container | a process of this host killed while its sandbox ran | its owner process is gone (crewwork/sandbox/orphans.py) |

Every removal is decided under a lock the live user would hold (an flock, which the kernel drops when its process
dies), so a sweep running beside live attempts of other processes on the same host removes only what is dead. The
sweep never asks the store: what is on this disk is this host's alone (docs/repositories.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from crewwork.config import Settings
from crewwork.workspace.liveness import lock_path, try_claim
from crewwork.workspace.tree import remove_tree

log = logging.getLogger("crewwork.sweep")


@dataclass
class SweepReport:
    workspaces: list[str] = field(default_factory=list)
    item_dirs: list[str] = field(default_factory=list)
    mirrors: list[str] = field(default_factory=list)
    prepared: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(len(x) for x in (self.workspaces, self.item_dirs, self.mirrors, self.prepared, self.containers))


def _age(path: Path, now: float) -> float:
    try:
        return now - path.lstat().st_mtime
    except OSError:
        return 0.0


async def sweep_workspaces(root: Path, min_age_s: float, report: SweepReport) -> None:
    now = time.time()
    if not root.is_dir():
        return
    for item_dir in sorted(root.iterdir()):
        if item_dir.is_symlink() or not item_dir.is_dir():
            continue
        for home in sorted(item_dir.iterdir()):
            if home.name.endswith(".lock"):
                if not home.with_name(home.name.removesuffix(".lock")).exists() and _age(home, now) >= min_age_s:
                    stale = try_claim(home.with_name(home.name.removesuffix(".lock")))
                    if stale is not None:
                        stale.release(unlink=True)
                continue
            if home.is_symlink() or not home.is_dir() or _age(home, now) < min_age_s:
                continue
            lock = try_claim(home)
            if lock is None:
                continue  # a live attempt of this host uses it
            try:
                await remove_tree(home)
                report.workspaces.append(str(home))
            finally:
                lock.release(unlink=True)
        with contextlib.suppress(OSError):
            if _age(item_dir, now) >= min_age_s and not any(item_dir.iterdir()):
                item_dir.rmdir()
                report.item_dirs.append(str(item_dir))


async def sweep_host(settings: Settings) -> SweepReport:
    """One sweep of this host's disk and sandboxes (the table in the module's docstring)."""
    from crewwork.repos.mirror import MirrorCache
    from crewwork.sandbox.prepare import PreparedEnvCache

    min_age = settings.sweep.min_age_s
    report = SweepReport()
    await sweep_workspaces(settings.resolved_worktree_dir(), min_age, report)
    mirrors = MirrorCache(settings.resolved_mirror_dir(), settings.mirror_max_bytes, fsck=settings.mirror_fsck)
    report.mirrors = await asyncio.to_thread(mirrors.sweep, min_age)
    prepared = PreparedEnvCache(settings.data_dir.resolve() / "prepared")
    report.prepared = await asyncio.to_thread(prepared.sweep, min_age)
    if settings.sandbox.backend in ("docker", "gvisor"):
        report.containers = await asyncio.to_thread(_reap_containers, settings.sandbox.docker_base_url)
    if report.total:
        log.info(
            "host sweep removed %d workspaces, %d item directories, %d mirror leftovers, %d prepared leftovers, "
            "%d containers",
            len(report.workspaces),
            len(report.item_dirs),
            len(report.mirrors),
            len(report.prepared),
            len(report.containers),
        )
    return report


def _reap_containers(base_url: str | None) -> list[str]:
    from crewwork.sandbox.docker import _connect
    from crewwork.sandbox.orphans import reap_dead_owners

    try:
        return reap_dead_owners(_connect(base_url))
    except Exception as exc:  # no engine here: nothing of ours can run on it either
        log.debug("no Docker engine to sweep: %s", exc)
        return []


async def run_sweeps(settings: Settings, stop: asyncio.Event) -> None:
    """Sweep at start, then every `CREWWORK_SWEEP_INTERVAL_S` until `stop` (0: only at start)."""
    while True:
        try:
            await sweep_host(settings)
        except Exception as exc:  # housekeeping must never stop a pool
            log.warning("host sweep failed: %s", exc)
        if settings.sweep.interval_s <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), settings.sweep.interval_s)
        if stop.is_set():
            return


__all__ = ["SweepReport", "lock_path", "run_sweeps", "sweep_host", "sweep_workspaces"]
