"""Prepared environments: setup runs once per (repo, commit, setup), reused read-only, evicted by size."""

from __future__ import annotations

from pathlib import Path

import pytest

from crewwork.config.sandbox import SandboxSettings
from crewwork.sandbox.backends import SANDBOXES, get_sandbox
from crewwork.sandbox.base import Sandbox, SandboxLimits
from crewwork.sandbox.disk import prepare_disk_cap_mb
from crewwork.sandbox.envplan import CacheOwner, SetupFailed, prepare_key
from crewwork.sandbox.prepare import PreparedEnvCache

LIMITS = SandboxLimits(memory_mb=256, pids=64, timeout_s=60)
OWNER = CacheOwner(tenant_id="tn_a", repository="rp_a")
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
    args = dict(owner=OWNER, sandbox=sandbox, repo="r", base_commit="abc", setup=SETUP, source=repo, limits=LIMITS)
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
            ["python", "-c", probe], workspace=ws, limits=LIMITS, env=again.env(), mounts=again.mounts()
        )
        assert r.stdout.split() == [b"42", b"read-only"], r.stderr
    assert (first.env_dir / "setup-runs").read_text() == "ran\n"


async def test_new_commit_or_new_setup_gets_a_fresh_environment(sandbox: Sandbox, repo: Path, tmp_path: Path) -> None:
    cache = PreparedEnvCache(tmp_path / "cache")
    base = dict(owner=OWNER, sandbox=sandbox, repo="r", setup=SETUP, source=repo, limits=LIMITS)
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
            owner=OWNER, sandbox=sandbox, repo="r", base_commit="abc", setup=[["sh", "-c", "echo boom >&2; exit 5"]],
            source=repo, limits=LIMITS,
        )  # fmt: skip
    assert info.value.results[-1].stderr == b"boom\n"
    assert cache.entries() == []


def test_eviction_removes_least_recently_used_entries_beyond_the_budget(tmp_path: Path) -> None:
    import os
    import time

    # An entry counts the disk it holds (blocks, each inode once): about 1 MiB each here.
    cache = PreparedEnvCache(tmp_path / "cache", max_bytes=2_500_000)
    for i, key in enumerate(["old", "mid", "new"]):
        entry = cache.root / key
        (entry / "env").mkdir(parents=True)
        (entry / "env" / "blob").write_bytes(b"x" * 1_000_000)
        (entry / "READY.json").write_text("{}")
        os.utime(entry / "READY.json", (time.time() - 100 + i, time.time() - 100 + i))
    assert cache.lookup("old") is not None  # a hit makes "old" the most recently used
    assert cache.evict() == ["mid"]
    assert {k for k, _, _ in cache.entries()} == {"old", "new"}


def test_key_depends_on_every_input() -> None:
    from crewwork.sandbox.envplan import SetupPlan

    runner = {"backend": "bwrap", "python": "fp1"}

    def key(
        owner: CacheOwner = OWNER, repo: str = "r", commit: str = "c", setup: object = (("a",),), **kw: object
    ) -> str:
        return prepare_key(owner, repo, commit, setup, **{"runner": runner, **kw})  # type: ignore[arg-type]

    k = key()
    assert k == key()
    variants = {
        k,
        key(owner=CacheOwner("tn_b", "rp_a")),
        key(owner=CacheOwner("tn_a", "rp_b")),
        key(repo="r2"),
        key(commit="c2"),
        key(setup=(("b",),)),
        key(runner={"backend": "docker", "image": "i"}),
        key(runner={"backend": "bwrap", "python": "fp2"}),
        key(env={"X": "1"}),
        key(plan=SetupPlan(python="python3")),
        key(plan=SetupPlan(allowlist=("pypi.org:443",))),
        key(plan=SetupPlan(image="img")),
        key(plan=SetupPlan(secrets={"TOKEN": "v"}), secret_digests={"TOKEN": "d1"}),
        key(plan=SetupPlan(secrets={"TOKEN": "v"}), secret_digests={"TOKEN": "d2"}),
    }
    assert len(variants) == 14


def test_secret_digests_are_keyed_and_never_the_value(tmp_path: Path) -> None:
    import hashlib

    cache = PreparedEnvCache(tmp_path / "cache")
    d = cache.secret_digests({"IDX_TOKEN": "hunter2"})
    assert d == cache.secret_digests({"IDX_TOKEN": "hunter2"})
    assert d != cache.secret_digests({"IDX_TOKEN": "hunter3"})
    # Keyed: nobody without the cache's own key can test a guess against a digest (or the entry key holding it).
    assert d["IDX_TOKEN"] not in {
        hashlib.sha256(b"hunter2").hexdigest(),
        hashlib.sha256(b"IDX_TOKEN\0hunter2").hexdigest(),
    }
    assert "hunter2" not in d["IDX_TOKEN"]
    assert (cache.root / ".secret-digest-key").stat().st_mode & 0o777 == 0o600
    assert PreparedEnvCache(tmp_path / "other").secret_digests({"IDX_TOKEN": "hunter2"}) != d


# ---------------------------------------------------------------- the disk cap of an entry (setup is the tenant's)


@pytest.fixture
async def capped(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A cache whose entries are loop images (32 MiB); whatever a failing test leaves mounted is unmounted."""
    from crewwork.sandbox.disk import loop_available, unmount_all_under

    ok, why = loop_available()
    if not ok:
        pytest.skip(f"loop images cannot be made here: {why} (see docs/sandbox.md, disk caps)")
    cache = PreparedEnvCache(tmp_path / "cache", disk_mb=32)
    yield cache
    await unmount_all_under(cache.root)


def _mounts_under(root: Path) -> list[str]:
    from crewwork.sandbox.disk import _mountpoints

    return [m for m in _mountpoints() if m == str(root) or m.startswith(f"{root}/")]


def _host_bytes(root: Path) -> int:
    """What the cache directory holds on the host disk (allocated blocks, images included)."""
    import os

    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


@pytest.mark.parametrize("swallow", [False, True], ids=["fails", "ignores-enospc"])
async def test_setup_writing_past_the_disk_cap_fails_naming_the_cap_and_leaves_nothing_on_the_host(
    sandbox: Sandbox, repo: Path, tmp_path: Path, capped: PreparedEnvCache, swallow: bool
) -> None:
    cache = capped
    fill = 'dd if=/dev/zero of="$CREWWORK_ENV/big" bs=64k count=1024' + ("; true" if swallow else "")
    with pytest.raises(SetupFailed, match=r"disk cap of 32 MiB.*CREWWORK_SANDBOX_PREPARE_DISK_MB") as info:
        await cache.get_or_prepare(
            owner=OWNER,
            sandbox=sandbox,
            repo="r",
            base_commit="abc",
            setup=[["sh", "-c", fill]],
            source=repo,
            limits=LIMITS,
        )
    last = info.value.results[-1]
    assert last.disk_limited and b"CREWWORK_SANDBOX_PREPARE_DISK_MB" in last.stderr
    assert b"CREWWORK_SANDBOX_PREPARE_DISK_MB" in info.value.log
    assert cache.entries() == [] and _mounts_under(cache.root) == []
    assert sorted(p.name for p in cache.root.iterdir() if not p.name.endswith(".lock")) == []
    assert _host_bytes(cache.root) < 1024 * 1024


async def test_repository_larger_than_the_cap_fails_setup_naming_the_cap(
    sandbox: Sandbox, tmp_path: Path, capped: PreparedEnvCache
) -> None:
    big = tmp_path / "big-repo"
    big.mkdir()
    (big / "blob.bin").write_bytes(b"\x01" * (40 << 20))
    with pytest.raises(SetupFailed, match=r"copying the repository filled .* 32 MiB") as info:
        await capped.get_or_prepare(
            owner=OWNER, sandbox=sandbox, repo="r", base_commit="abc", setup=SETUP, source=big, limits=LIMITS
        )
    assert info.value.results[-1].disk_limited
    assert _mounts_under(capped.root) == [] and [p for p in capped.root.iterdir() if p.suffix != ".lock"] == []


async def test_environment_on_its_own_disk_is_used_and_eviction_unmounts_and_deletes_it(
    sandbox: Sandbox, repo: Path, tmp_path: Path, capped: PreparedEnvCache
) -> None:
    from crewwork.sandbox.disk import is_mountpoint

    cache = capped
    args = dict(owner=OWNER, sandbox=sandbox, repo="r", base_commit="abc", setup=SETUP, source=repo, limits=LIMITS)
    first = await cache.get_or_prepare(**args)  # type: ignore[arg-type]
    assert first.cold and first.evidence()["disk"] == "loop-32m"
    assert is_mountpoint(first.root) and cache.image(first.key).is_file()
    # The budget counts what the sparse image really holds on the host, not its nominal 32 MiB.
    [(key, _, size)] = cache.entries()
    assert key == first.key and 0 < size < 8 * 1024 * 1024
    again = await cache.get_or_prepare(**args)  # type: ignore[arg-type]
    assert not again.cold
    ws = tmp_path / "attempt"
    ws.mkdir()
    r = await sandbox.run(
        ["python", "-c", "import prepared_mod; print(prepared_mod.VALUE)"],
        workspace=ws, limits=LIMITS, env=again.env(), mounts=again.mounts(),
    )  # fmt: skip
    assert r.stdout.split() == [b"42"], r.stderr
    cache.max_bytes = 0
    assert cache.evict() == [first.key]
    assert _mounts_under(cache.root) == [] and not cache.image(first.key).exists() and not first.root.exists()


async def test_cancelled_build_leaves_no_mount_or_image_behind(
    sandbox: Sandbox, repo: Path, tmp_path: Path, capped: PreparedEnvCache
) -> None:
    import asyncio

    cache = capped
    slow = [["sh", "-c", 'touch "$CREWWORK_ENV/started"; sleep 60']]
    task = asyncio.create_task(
        cache.get_or_prepare(
            owner=OWNER, sandbox=sandbox, repo="r", base_commit="abc", setup=slow, source=repo, limits=LIMITS
        )
    )
    key = cache.key_for(OWNER, sandbox, "r", "abc", slow)
    for _ in range(300):
        if (cache.root / key / "env" / "started").exists():
            break
        await asyncio.sleep(0.1)
    assert _mounts_under(cache.root) == [str(cache.root / key)]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _mounts_under(cache.root) == [] and not cache.image(key).exists() and not (cache.root / key).exists()


async def test_a_killed_workers_half_built_entry_is_cleaned_up_and_rebuilt(
    sandbox: Sandbox, repo: Path, capped: PreparedEnvCache
) -> None:
    import os

    from crewwork.sandbox.disk import WorkspaceDisk

    cache = capped
    key = cache.key_for(OWNER, sandbox, "r", "abc", SETUP)
    owner = (os.geteuid(), os.getegid())
    # What a worker killed mid-build leaves: the entry's image still mounted, no READY marker.
    await WorkspaceDisk.create(cache.image(key), cache.root / key, 32, owner)
    await WorkspaceDisk.create(cache.image("orphan"), cache.root / "orphan", 32, owner)
    (cache.root / key / "junk").write_bytes(b"x" * 4096)
    assert cache.lookup(key) is None
    built = await cache.get_or_prepare(
        owner=OWNER, sandbox=sandbox, repo="r", base_commit="abc", setup=SETUP, source=repo, limits=LIMITS
    )
    assert built.cold and not (built.root / "junk").exists()
    # The orphan's key is never asked for again: eviction's sweep removes it, the ready entry stays.
    assert cache.evict() == []
    assert _mounts_under(cache.root) == [str(built.root)] and not cache.image("orphan").exists()
    cache.max_bytes = 0
    cache.evict()
    assert _mounts_under(cache.root) == []


def test_prepare_disk_cap_is_on_and_off_with_the_workspace_disk_cap() -> None:
    assert prepare_disk_cap_mb(SandboxSettings(workspace_disk="none", prepare_disk_mb=100)) is None
    assert prepare_disk_cap_mb(SandboxSettings(workspace_disk="loop", prepare_disk_mb=100)) == 100
