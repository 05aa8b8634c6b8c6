"""Prepared environments: setup runs once per (repo, commit, setup), reused read-only, evicted by size."""

from __future__ import annotations

from pathlib import Path

import pytest

from crewwork.sandbox import SANDBOXES, Sandbox, SandboxLimits, SandboxSettings, get_sandbox
from crewwork.sandbox.prepare import PreparedEnvCache, SetupFailed, prepare_key

LIMITS = SandboxLimits(memory_mb=256, pids=64, timeout_s=60)
# The setup "installs" a module into $CREWWORK_ENV and counts how often it ran.
SETUP = [
    [
        "sh",
        "-c",
        'mkdir -p "$CREWWORK_ENV/lib/python3.11/site-packages" && '
        "echo 'VALUE = 42' > \"$CREWWORK_ENV/lib/python3.11/site-packages/prepared_mod.py\" && "
        'cat marker.txt >> "$CREWWORK_ENV/setup-runs"',
    ]
]


@pytest.fixture(params=[pytest.param("bwrap"), pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    ok, why = SANDBOXES[request.param].available()
    if not ok:
        pytest.skip(f"sandbox backend {request.param} is not available: {why} (see docs/sandbox.md)")
    return get_sandbox(request.param, settings=SandboxSettings())


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    src = tmp_path / "repo"
    src.mkdir()
    (src / "marker.txt").write_text("ran\n")
    return src


async def test_setup_runs_once_and_every_attempt_reuses_it_read_only(
    sandbox: Sandbox, repo: Path, tmp_path: Path
) -> None:
    cache = PreparedEnvCache(tmp_path / "cache")
    args = dict(sandbox=sandbox, repo="r", base_commit="abc", setup=SETUP, source=repo, limits=LIMITS)
    first = await cache.get_or_prepare(**args)  # type: ignore[arg-type]
    assert first.cold and len(first.setup_results) == 1
    ws = tmp_path / "attempt"
    ws.mkdir()
    for _ in range(3):
        again = await cache.get_or_prepare(**args)  # type: ignore[arg-type]
        assert not again.cold and again.setup_results == [] and again.key == first.key
        probe = (
            "import prepared_mod, os\n"
            "print(prepared_mod.VALUE)\n"
            "try:\n"
            "    open(os.path.join(os.environ['CREWWORK_ENV'], 'tamper'), 'w')\n"
            "    print('writable')\n"
            "except OSError:\n"
            "    print('read-only')\n"
        )
        r = await sandbox.run(
            ["python", "-c", probe], workspace=ws, limits=LIMITS, env=again.env(), ro_mounts=again.mounts()
        )
        assert r.stdout.split() == [b"42", b"read-only"], r.stderr
    assert (first.env_dir / "setup-runs").read_text() == "ran\n"


async def test_new_commit_or_new_setup_gets_a_fresh_environment(sandbox: Sandbox, repo: Path, tmp_path: Path) -> None:
    cache = PreparedEnvCache(tmp_path / "cache")
    base = dict(sandbox=sandbox, repo="r", setup=SETUP, source=repo, limits=LIMITS)
    a = await cache.get_or_prepare(base_commit="abc", **base)  # type: ignore[arg-type]
    b = await cache.get_or_prepare(base_commit="def", **base)  # type: ignore[arg-type]
    changed = [*SETUP, ["true"]]
    c = await cache.get_or_prepare(**{**base, "setup": changed}, base_commit="abc")  # type: ignore[arg-type]
    assert a.cold and b.cold and c.cold
    assert len({a.key, b.key, c.key}) == 3


async def test_failed_setup_is_reported_and_leaves_nothing_cached(sandbox: Sandbox, repo: Path, tmp_path: Path) -> None:
    cache = PreparedEnvCache(tmp_path / "cache")
    with pytest.raises(SetupFailed, match="exit 5") as info:
        await cache.get_or_prepare(
            sandbox=sandbox, repo="r", base_commit="abc", setup=[["sh", "-c", "echo boom >&2; exit 5"]],
            source=repo, limits=LIMITS,
        )  # fmt: skip
    assert info.value.results[-1].stderr == b"boom\n"
    assert cache.entries() == []


def test_eviction_removes_least_recently_used_entries_beyond_the_budget(tmp_path: Path) -> None:
    import os
    import time

    cache = PreparedEnvCache(tmp_path / "cache", max_bytes=2500)
    for i, key in enumerate(["old", "mid", "new"]):
        entry = cache.root / key
        (entry / "env").mkdir(parents=True)
        (entry / "env" / "blob").write_bytes(b"x" * 1000)
        (entry / "READY.json").write_text("{}")
        os.utime(entry / "READY.json", (time.time() - 100 + i, time.time() - 100 + i))
    assert cache.lookup("old") is not None  # a hit makes "old" the most recently used
    assert cache.evict() == ["mid"]
    assert {k for k, _, _ in cache.entries()} == {"old", "new"}


def test_key_depends_on_every_input() -> None:
    k = prepare_key("r", "c", [["a"]])
    assert k == prepare_key("r", "c", [["a"]])
    assert (
        len(
            {
                k,
                prepare_key("r2", "c", [["a"]]),
                prepare_key("r", "c2", [["a"]]),
                prepare_key("r", "c", [["b"]]),
            }
        )
        == 4
    )
