"""Start-to-exit time of a trivial command (`true`) per sandbox backend, next to a bare subprocess.

Runs are interleaved round-robin so every backend sees the same machine noise; the table gives medians and
the ratio to the bare subprocess measured in the same run. With --prepared it also times getting a ready
environment for an attempt (setup that installs real packages), cold and warm (see crewwork.sandbox.prepare).

    .venv/bin/python bench/sandbox.py [--runs 20] [--backends bwrap,docker,gvisor] [--prepared]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crewwork.sandbox.backends import SANDBOXES, best_available, get_sandbox
from crewwork.sandbox.base import Mount, Sandbox, SandboxLimits
from crewwork.sandbox.envplan import CacheOwner
from crewwork.sandbox.prepare import PreparedEnvCache

# Real packages with real dependency trees; downloaded once (PyPI) into a local wheelhouse, because the
# sandbox itself has no network.
BENCH_PACKAGES = ("requests", "pyyaml", "attrs", "rich")
WHEELS = Path.home() / ".cache" / "crewwork" / "bench-wheels"

LIMITS = SandboxLimits(memory_mb=256, pids=64, cpus=1.0, timeout_s=60)


async def bare(ws: Path) -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec("true", cwd=ws)
    await proc.wait()
    return time.perf_counter() - started


async def sandboxed(sandbox: Sandbox, ws: Path) -> float:
    started = time.perf_counter()
    r = await sandbox.run(["true"], workspace=ws, limits=LIMITS)
    elapsed = time.perf_counter() - started
    if r.exit_code != 0:
        raise SystemExit(f"{sandbox.name}: `true` failed: exit {r.exit_code} {r.stderr[-300:]!r}")
    return elapsed


async def start_to_exit(backends: list[str], runs: int) -> None:
    sandboxes: dict[str, Sandbox] = {}
    for name in backends:
        ok, why = SANDBOXES[name].available()
        if not ok:
            print(f"skipping {name}: {why}", file=sys.stderr)
            continue
        sandboxes[name] = get_sandbox(name, allow_unsafe=True)
    times: dict[str, list[float]] = {"bare subprocess": [], **{n: [] for n in sandboxes}}
    with tempfile.TemporaryDirectory(prefix="crewwork-bench-") as tmp:
        ws = Path(tmp)
        for sandbox in sandboxes.values():  # warm-up: first container start loads the image
            await sandboxed(sandbox, ws)
        for _ in range(runs):
            times["bare subprocess"].append(await bare(ws))
            for name, sandbox in sandboxes.items():
                times[name].append(await sandboxed(sandbox, ws))
    base = statistics.median(times["bare subprocess"])
    print(f"start-to-exit of `true`, {runs} interleaved runs each")
    print(f"{'backend':<18}{'median ms':>11}{'min ms':>9}{'max ms':>9}{'x bare':>9}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<18}{med * 1000:>11.1f}{min(ts) * 1000:>9.1f}{max(ts) * 1000:>9.1f}{med / base:>9.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--backends", default="local,bwrap,docker,gvisor")
    parser.add_argument("--prepared", action="store_true", help="also time cold vs warm prepared envs")
    parser.add_argument("--prepared-backend", default=None, help="backend for --prepared (default: best)")
    parser.add_argument("--prepared-runs", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(start_to_exit([b for b in args.backends.split(",") if b], args.runs))
    if args.prepared:
        if not any(WHEELS.glob("*.whl")):
            WHEELS.mkdir(parents=True, exist_ok=True)
            pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(WHEELS)]
            subprocess.run([*pip, *BENCH_PACKAGES], check=True)
        with tempfile.TemporaryDirectory(prefix="crewwork-prep-") as tmp:
            repo = Path(tmp, "repo")
            repo.mkdir()
            (repo / "requirements.txt").write_text("\n".join(BENCH_PACKAGES) + "\n")
            Path(tmp, "ws").mkdir()
            backend = args.prepared_backend or best_available()[0]
            asyncio.run(cold_warm(Path(tmp), backend, args.prepared_runs))
    return 0


async def cold_warm(tmp: Path, backend: str, runs: int) -> None:
    """Time to a ready environment for an attempt (setup + first import), on a cache miss and on a hit."""
    sandbox = get_sandbox(backend, allow_unsafe=True)
    limits = SandboxLimits(memory_mb=1024, pids=256, timeout_s=300)
    wheels = Mount(WHEELS, "/crewwork/wheels")
    pip = f'python -m pip install -q --no-index --find-links {sandbox.inside(wheels)} --prefix "$CREWWORK_ENV"'
    pip += " -r requirements.txt"
    setup = [["sh", "-c", pip]]
    check = ["python", "-c", "import requests, yaml, attr, rich; print('ready')"]
    times: dict[str, list[float]] = {"cold": [], "warm": []}
    ready: dict[str, list[float]] = {"cold": [], "warm": []}
    for i in range(runs):
        cache = PreparedEnvCache(tmp / f"cache{i}")
        for kind in ("cold", "warm"):
            started = time.perf_counter()
            prepared = await cache.get_or_prepare(
                owner=CacheOwner(tenant_id="tn_bench", repository="rp_bench"),
                sandbox=sandbox, repo="bench", base_commit="c0ffee", setup=setup, source=tmp / "repo",
                limits=limits, mounts=[wheels], env={"PIP_CONFIG_FILE": "/dev/null"},
            )  # fmt: skip
            ready[kind].append(time.perf_counter() - started)
            r = await sandbox.run(
                check, workspace=tmp / "ws", limits=limits, env=prepared.env(), mounts=prepared.mounts()
            )
            if r.stdout.strip() != b"ready":
                raise SystemExit(f"prepared environment not usable: {r.stderr[-1000:]!r}")
            assert prepared.cold == (kind == "cold")
            times[kind].append(time.perf_counter() - started)
    med = {k: (statistics.median(ready[k]), statistics.median(times[k])) for k in ("cold", "warm")}
    print(f"\nready environment for an attempt on {backend}: setup pip-installs {', '.join(BENCH_PACKAGES)}")
    print(f"and their dependencies (median of {runs}); 'ready' = environment usable, '+ first run' adds one")
    print("sandboxed run importing all of them")
    print(f"{'':<8}{'ready s':>10}{'+ first run s':>16}")
    for k, (r, t) in med.items():
        print(f"{k:<8}{r:>10.3f}{t:>16.3f}")
    print(f"{'cold/warm':<8}{med['cold'][0] / med['warm'][0]:>10.0f}x{med['cold'][1] / med['warm'][1]:>15.1f}x")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    raise SystemExit(main())
