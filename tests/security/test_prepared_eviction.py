"""The prepared-environment cache is one LRU budget shared by every tenant on a host (crewwork/sandbox/prepare.py). A
tenant's setup decides what its own entry holds; it must not be able to use that to take another tenant's entry away,
least of all from under a validation that is running on it.

- Size accounting: a setup that writes a sparse file of many GiB, or hundreds of hard links to one file, holds almost
  no disk; counted by apparent size per path it looked larger than the whole budget, so the eviction after its build
  removed every other tenant's environment. Entries now count the blocks they hold, each inode once.
- In use: a validation mounts its environment read-only for as long as its tests run; an eviction in between (any
  tenant's build going over budget) deleted the files under it, failing that tenant's validation for something another
  tenant did. An entry is now held (a shared lock) while it is in use, and eviction skips it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from crewwork.config.sandbox import SandboxSettings
from crewwork.sandbox.backends import SANDBOXES, get_sandbox
from crewwork.sandbox.base import Sandbox, SandboxLimits
from crewwork.sandbox.envplan import CacheOwner
from crewwork.sandbox.prepare import PreparedEnvCache

LIMITS = SandboxLimits(memory_mb=512, pids=128, timeout_s=120)
A = CacheOwner(tenant_id="tn_evict_a", repository="rp_a")
B = CacheOwner(tenant_id="tn_evict_b", repository="rp_b")
MiB = 1 << 20
OWN = 'printf "b-payload\\n" > "$CREWWORK_ENV/data"'
# Almost nothing on disk, and looking like 8 GiB (a sparse file) plus 200 MiB (links to one 1 MiB file).
INFLATE = (
    "import os; e = os.environ['CREWWORK_ENV']\n"
    "with open(e + '/sparse', 'wb') as f: f.truncate(8 << 30)\n"
    "open(e + '/one', 'wb').write(b'x' * (1 << 20))\n"
    "for i in range(200): os.link(e + '/one', e + f'/link{i}')\n"
)
BIG = "import os; open(os.environ['CREWWORK_ENV'] + '/big', 'wb').write(os.urandom(8 << 20))"


@pytest.fixture(params=[pytest.param("bwrap"), pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    ok, why = SANDBOXES[request.param].available()
    if not ok:
        pytest.skip(f"sandbox backend {request.param} is not available: {why} (see docs/sandbox.md)")
    return get_sandbox(request.param, settings=SandboxSettings())


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "README").write_text("a repository\n")
    return d


async def test_a_setup_cannot_look_big_enough_to_evict_other_tenants_environments(
    sandbox: Sandbox, src: Path, tmp_path: Path
) -> None:
    cache = PreparedEnvCache(tmp_path / "prepared", max_bytes=64 * MiB)
    common = dict(sandbox=sandbox, repo="r", base_commit="c", source=src, limits=LIMITS)
    b = await cache.get_or_prepare(owner=B, setup=[["sh", "-c", OWN]], **common)  # type: ignore[arg-type]
    a = await cache.get_or_prepare(owner=A, setup=[["python3", "-c", INFLATE]], **common)  # type: ignore[arg-type]
    sizes = {key: size for key, _, size in cache.entries()}
    assert sizes[a.key] < 8 * MiB, f"A's entry holds about 1 MiB of disk, counted {sizes[a.key]} bytes"
    assert cache.lookup(b.key) is not None, "A's build evicted B's environment"
    assert (b.env_dir / "data").read_text() == "b-payload\n"


async def test_an_environment_in_use_is_not_evicted_from_under_its_run(
    sandbox: Sandbox, src: Path, tmp_path: Path
) -> None:
    cache = PreparedEnvCache(tmp_path / "prepared", max_bytes=4 * MiB)
    common = dict(sandbox=sandbox, repo="r", base_commit="c", source=src, limits=LIMITS)
    b = await cache.get_or_prepare(owner=B, setup=[["sh", "-c", OWN]], hold=True, **common)  # type: ignore[arg-type]
    try:
        ws = tmp_path / "b-validation"
        ws.mkdir()
        # B's tests start, then wait until A's build (8 MiB: over the budget) is done, then read B's environment.
        script = "touch started; while [ ! -e go ]; do sleep 0.05; done; cat /crewwork/env/data"
        run = asyncio.create_task(
            sandbox.run(["sh", "-c", script], workspace=ws, limits=LIMITS, env=b.env(), mounts=b.mounts())
        )
        for _ in range(600):
            if (ws / "started").exists() or run.done():
                break
            await asyncio.sleep(0.05)
        a = await cache.get_or_prepare(owner=A, setup=[["python3", "-c", BIG]], **common)  # type: ignore[arg-type]
        (ws / "go").touch()
        r = await run
        assert r.ok and r.stdout == b"b-payload\n", (r.stdout, r.stderr[-2000:])
        assert cache.lookup(b.key) is not None
        cache.max_bytes = 0
        assert cache.evict() == [a.key], "an entry in use stays whatever the budget says"
    finally:
        b.release()
    assert cache.evict() == [b.key], "once released, it is evicted like any other"


async def test_racing_users_of_one_key_build_it_once_and_all_hold_it(
    sandbox: Sandbox, src: Path, tmp_path: Path
) -> None:
    cache = PreparedEnvCache(tmp_path / "prepared", max_bytes=0)
    common = dict(sandbox=sandbox, repo="r", base_commit="c", source=src, limits=LIMITS)
    setup = [["sh", "-c", 'echo run >> "$CREWWORK_ENV/runs"; sleep 1']]
    got = await asyncio.gather(
        *(cache.get_or_prepare(owner=B, setup=setup, hold=h, **common) for h in (True, True, False))  # type: ignore[arg-type]
    )
    assert sorted(p.cold for p in got) == [False, False, True] and len({p.key for p in got}) == 1
    assert (got[0].env_dir / "runs").read_text() == "run\n", "built once"
    assert cache.evict() == [], "held by two users (the budget is 0)"
    got[0].release()
    assert cache.evict() == []
    got[1].release()
    assert cache.evict() == [got[0].key]
