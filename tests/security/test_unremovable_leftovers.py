"""What a sandbox wrote is deleted completely when its workspace or prepared environment goes, also where it took its
own directories' permissions away.

When the worker is not root (the production image runs as uid 10001, and the sandbox then runs as that same uid), the
owner of a directory has no override: a test or a setup that ran `chmod 500` (or `000`) on a directory of its
workspace or of `$CREWWORK_ENV` made everything under it undeletable, and removal (`shutil.rmtree(..., ignore_errors)`)
left it on the host disk for good. A prepared environment evicted that way was still counted as freed, so any tenant
could fill the worker's disk for every tenant, one work item at a time, outside every budget. Removal now gives the
worker back its permissions on each directory first (without following links).

The worker here is root, so the removal runs in a child process with the sandbox user's uid: exactly a worker that
is not root, whose sandbox runs as itself.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from crewwork.boundary.safefs import chown_tree
from crewwork.config.sandbox import SandboxSettings
from crewwork.sandbox.backends import SANDBOXES, get_sandbox
from crewwork.sandbox.base import SandboxLimits
from crewwork.sandbox.envplan import CacheOwner
from crewwork.sandbox.prepare import PreparedEnvCache
from crewwork.workspace.tree import remove_tree

LIMITS = SandboxLimits(memory_mb=256, pids=64, timeout_s=60)
# Fills a directory, then takes the write (and, one level down, every) permission away from it.
LOCK_UP = (
    'd="$1"; mkdir -p "$d/trap/deeper" "$d/sealed" && head -c 2000000 /dev/zero > "$d/trap/deeper/blob" && '
    'echo x > "$d/sealed/f" && chmod 500 "$d/trap/deeper" "$d/trap" && chmod 000 "$d/sealed"'
)


@pytest.fixture
def owner() -> tuple[int, int]:
    if os.geteuid() != 0:
        pytest.skip("the test plays a non-root worker from a root one")
    ok, why = SANDBOXES["bwrap"].available()
    if not ok:
        pytest.skip(why)
    found = SandboxSettings().owner()
    assert found is not None
    return found


@pytest.fixture
def base(owner: tuple[int, int]) -> Iterator[Path]:
    """A directory the played worker can reach (pytest's own temporary directories are root's, mode 0700)."""
    d = Path(tempfile.mkdtemp(prefix="crewwork-nonroot-worker-"))
    os.chown(d, *owner)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_worker(owner: tuple[int, int], tree: Path, remove: Callable[[], None]) -> None:
    """Run `remove` in a child process of uid `owner` (which owns `tree`, as a non-root worker owns its data)."""
    chown_tree(tree, owner)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(owner[1])
            os.setuid(owner[0])
            remove()
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_an_evicted_environment_leaves_nothing_on_disk(owner: tuple[int, int], base: Path) -> None:
    tmp_path = base
    src = tmp_path / "src"
    src.mkdir()
    cache = PreparedEnvCache(tmp_path / "prepared", max_bytes=0)
    setup = [["sh", "-c", LOCK_UP, "setup", "/crewwork/env"]]
    prepared = asyncio.run(
        cache.get_or_prepare(
            owner=CacheOwner("tn_leftover", "rp"), sandbox=get_sandbox("bwrap"), repo="r", base_commit="c",
            setup=setup, source=src, limits=LIMITS,
        )
    )  # fmt: skip
    assert (prepared.env_dir / "trap" / "deeper" / "blob").stat().st_size == 2_000_000

    def evict() -> None:
        assert cache.evict() == [prepared.key]

    as_worker(owner, cache.root, evict)
    assert not prepared.root.exists(), f"left on disk: {sorted(str(p) for p in prepared.root.rglob('*'))[:5]}"


def test_a_removed_workspace_leaves_nothing_on_disk(owner: tuple[int, int], base: Path) -> None:
    tmp_path = base
    home = tmp_path / "work" / "wi_1" / "validate-1"
    ws = home / "ws"
    ws.mkdir(parents=True)
    # A directory of the worker's own outside the workspace, and a link to it the tests leave behind.
    outside = tmp_path / "work" / "not-the-workspace"
    (outside / "keep").mkdir(parents=True)
    link = f'mkdir -p "$1/trap" && ln -s {outside} "$1/trap/outside" && ln -s {outside}/keep "$1/keep"'
    r = asyncio.run(
        get_sandbox("bwrap").run(["sh", "-c", f"{link}; {LOCK_UP}", "tests", "/workspace"], workspace=ws, limits=LIMITS)
    )
    assert r.ok, r.stderr
    assert (ws / "trap" / "outside").is_symlink()
    (outside / "keep").chmod(0o500)

    as_worker(owner, tmp_path / "work", lambda: asyncio.run(remove_tree(home)))
    assert not home.exists(), f"left on disk: {sorted(str(p) for p in home.rglob('*'))[:5]}"
    assert (outside / "keep").is_dir() and (outside / "keep").stat().st_mode & 0o777 == 0o500, "no link followed"
