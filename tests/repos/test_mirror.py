"""The per-host mirror cache: several processes on one host share it safely (one clone, no torn mirror), it fetches
only what is missing, and it stays within its size bound by evicting the least recently used idle mirror."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from pathlib import Path

from crewwork.boundary.urls import parse_repo_url
from crewwork.repos.mirror import MirrorCache
from crewwork.repos.remote import Remote
from tests.conftest import make_repo
from tests.repos.conftest import Served
from tests.repos.servers import LOOPBACK, GitDaemon, bare_from, git


def _worker(root: str, url: str, commit: str, q: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    async def go() -> tuple[bool, str]:
        cache = MirrorCache(Path(root))
        hold = await cache.hold(Remote(address=LOOPBACK, url=parse_repo_url(url)), commit)
        try:
            return hold.stats.cloned, git(hold.gitdir, "rev-parse", f"{commit}^{{commit}}") + " " + str(hold.gitdir)
        finally:
            hold.release()

    try:
        q.put(asyncio.run(go()))
    except Exception as exc:  # reported to the test, which fails on it
        q.put(("error", repr(exc)))


def test_processes_sharing_a_cache_clone_once_and_all_get_the_commit(
    daemon: GitDaemon, served: Served, tmp_path: Path
) -> None:
    root = tmp_path / "host" / "mirrors"
    commit = git(served.bare, "rev-parse", "main")
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(root), daemon.url(served.name), commit, q)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(r[0] != "error" for r in results), results
    assert sum(1 for cloned, _ in results if cloned) == 1, "exactly one process clones; the others wait and reuse"
    heads = {r[1].split()[0] for r in results}
    gitdirs = {r[1].split()[1] for r in results}
    assert heads == {commit} and len(gitdirs) == 1
    assert list(root.glob("*.git")) == [Path(next(iter(gitdirs)))]
    assert not list((root / ".tmp").iterdir()), "no half-made clone is left behind"


async def test_fetches_only_when_the_wanted_commit_is_missing(
    daemon: GitDaemon, served: Served, tmp_path: Path
) -> None:
    cache = MirrorCache(tmp_path / "mirrors")
    remote = Remote(address=LOOPBACK, url=parse_repo_url(daemon.url(served.name)))
    first = git(served.bare, "rev-parse", "main")
    gitdir, stats = await cache.ensure(remote, first)
    assert stats.cloned
    _, stats = await cache.ensure(remote, first)
    assert not stats.fetched
    # A new commit upstream: the mirror lacks it, so this ensure fetches.
    (served.work / "NEW").write_text("new\n")
    git(served.work, "add", "NEW")
    git(served.work, "commit", "-qm", "new")
    git(served.work, "push", "--quiet", str(served.bare), "main")
    second = git(served.bare, "rev-parse", "main")
    _, stats = await cache.ensure(remote, second)
    assert stats.fetched and not stats.cloned
    assert git(gitdir, "rev-parse", "refs/heads/main") == second


async def test_lru_eviction_keeps_the_bound_and_spares_mirrors_in_use(daemon: GitDaemon, tmp_path: Path) -> None:
    urls = []
    for name in ("a", "b", "c"):
        work = make_repo(tmp_path / "work" / name, {"f.txt": name * 5000})
        bare_from(work, daemon.root / "lru" / f"{name}.git")
        urls.append(daemon.url(f"lru/{name}.git"))
    cache = MirrorCache(tmp_path / "mirrors", max_bytes=10**9)
    gitdirs = []
    for i, url in enumerate(urls):
        remote = Remote(address=LOOPBACK, url=parse_repo_url(url))
        gitdir, _ = await cache.ensure(remote, None)
        os.utime(gitdir / "crewwork-last-use", (time.time() - 1000 + i, time.time() - 1000 + i))
        gitdirs.append(gitdir)
    one = sum(size for _, _, size in cache.entries()) // 3
    # The oldest mirror ("a") is held (a workspace is reading it): eviction must skip it and take "b" instead.
    commit = git(gitdirs[0], "rev-parse", "HEAD")
    hold = await cache.hold(Remote(address=LOOPBACK, url=parse_repo_url(urls[0])), commit)
    os.utime(gitdirs[0] / "crewwork-last-use", (time.time() - 2000, time.time() - 2000))
    cache.max_bytes = one * 2 + one // 2
    removed = cache.evict()
    assert removed == [gitdirs[1].name]
    assert gitdirs[0].is_dir() and not gitdirs[1].exists() and gitdirs[2].is_dir()
    # Once the hold is released, the oldest mirror can go too.
    hold.release()
    cache.max_bytes = one + one // 2
    assert cache.evict() == [gitdirs[0].name]
    assert sum(size for _, _, size in cache.entries()) <= cache.max_bytes
