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
import sys
import tempfile
import time
from pathlib import Path

from crewwork.sandbox import SANDBOXES, Sandbox, SandboxLimits, get_sandbox

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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--backends", default="local,bwrap,docker,gvisor")
    parser.add_argument(
        "--prepared", action="store_true", help="also time cold vs warm prepared environments"
    )
    args = parser.parse_args()
    asyncio.run(start_to_exit([b for b in args.backends.split(",") if b], args.runs))
    if args.prepared:
        from crewwork.sandbox.prepare import benchmark_cold_warm

        asyncio.run(benchmark_cold_warm())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
