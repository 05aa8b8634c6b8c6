"""The per-host sweep (crewwork/steps/sweep.py): what a process that died left is removed, what a live process of
the same host uses is not, however old, and nothing younger than the minimum age is touched. Real processes (a live
holder is another process, a dead one was SIGKILLed), real git mirrors, real locks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from crewwork.config import Settings
from crewwork.config.operations import SweepSettings
from crewwork.repos.mirror import MirrorCache
from crewwork.steps.sweep import sweep_host
from crewwork.workspace.liveness import lock_path

HOLD = """
import sys, time
sys.path.insert(0, {root!r})
import asyncio
from pathlib import Path
from crewwork.workspace.liveness import claim
async def main():
    lock = await claim(Path(sys.argv[1]))
    Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
    (Path(sys.argv[1]) / "ws").mkdir(exist_ok=True)
    print("held", flush=True)
    time.sleep(600)
asyncio.run(main())
"""


def holder(home: Path) -> subprocess.Popen[str]:
    """Another process of this host making a workspace at `home` and holding it, as an attempt does."""
    root = str(Path(__file__).resolve().parents[2])
    p = subprocess.Popen([sys.executable, "-c", HOLD.format(root=root), str(home)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def backdate(*paths: Path, by_s: float = 3600) -> None:
    for p in paths:
        t = time.time() - by_s
        os.utime(p, (t, t), follow_symlinks=False)


async def test_the_sweep_removes_what_dead_processes_left_and_never_what_a_live_one_uses(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, sweep=SweepSettings(min_age_s=60))
    worktrees = settings.resolved_worktree_dir()
    live = worktrees / "wi_live" / "agent-1"
    dead = worktrees / "wi_dead" / "validate-1"
    young = worktrees / "wi_young" / "agent-1"
    alive_proc = holder(live)
    dead_proc = holder(dead)
    dead_proc.send_signal(signal.SIGKILL)
    dead_proc.wait()
    young.mkdir(parents=True)
    backdate(live, dead, live.parent, dead.parent)
    # A mirror whose fetch was killed: git's lock files left behind, and a clone that never finished.
    mirrors = MirrorCache(settings.resolved_mirror_dir())
    gitdir = mirrors.root / "calc-0123456789abcdef.git"
    subprocess.run(["git", "init", "-q", "--bare", str(gitdir)], check=True)
    stale_locks = [gitdir / "packed-refs.lock", gitdir / "refs" / "heads" / "main.lock"]
    for lock in stale_locks:
        lock.write_text("")
    half_clone = mirrors.root / ".tmp" / "calc-0123456789abcdef-1a2b3c4d.git"
    half_clone.mkdir(parents=True)
    backdate(*stale_locks, half_clone)
    # A prepared environment whose setup was killed: no READY marker.
    prepared = tmp_path / "prepared" / "0f1e2d"
    prepared.mkdir(parents=True)
    backdate(prepared)
    try:
        report = await sweep_host(settings)
        assert report.workspaces == [str(dead)]
        assert live.is_dir() and young.is_dir() and not dead.exists() and not lock_path(dead).exists()
        assert report.item_dirs == []  # emptied just now: it goes once it has been empty for the minimum age
        assert not any(lock.exists() for lock in stale_locks) and not half_clone.exists()
        assert not prepared.exists() and report.prepared
        # Once the live process is gone too, its workspace goes at the next sweep.
        alive_proc.send_signal(signal.SIGKILL)
        alive_proc.wait()
        backdate(dead.parent)
        again = await sweep_host(settings)
        assert again.workspaces == [str(live)] and not live.exists()
        assert again.item_dirs == [str(dead.parent)]
    finally:
        alive_proc.kill()


async def test_a_mirror_being_fetched_keeps_its_git_locks(tmp_path: Path) -> None:
    """git's lock files of a fetch in progress (its process holds the mirror's fetch lock) stay, however old."""
    settings = Settings(data_dir=tmp_path, sweep=SweepSettings(min_age_s=0))
    mirrors = MirrorCache(settings.resolved_mirror_dir())
    gitdir = mirrors.root / "repo-00.git"
    subprocess.run(["git", "init", "-q", "--bare", str(gitdir)], check=True)
    (gitdir / "shallow.lock").write_text("")
    lock = mirrors.root / ".locks" / "repo-00.fetch"
    lock.parent.mkdir(parents=True, exist_ok=True)
    fetcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('fetching', flush=True); time.sleep(600)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert fetcher.stdout is not None and fetcher.stdout.readline().strip() == "fetching"
        assert (await sweep_host(settings)).mirrors == []
        assert (gitdir / "shallow.lock").exists()
    finally:
        fetcher.kill()
        fetcher.wait()
    assert (await sweep_host(settings)).mirrors == [str(gitdir / "shallow.lock")]
