"""What a new agent child costs: forked by the pool's zygote (crewwork.agents.zygote) against a fresh interpreter
that does the child's imports itself (what every child cost before the zygote), side by side, in rounds.

Each round starts `--children` children one after another, waits for each to say `ready`, and stops it; it reports
wall seconds per child and the CPU seconds the children used (their own and their descendants', from
`resource.getrusage(RUSAGE_CHILDREN)` for the fresh interpreters; the forked children are the zygote's, so their
CPU is read from /proc/<pid>/stat before they exit, plus the zygote's own CPU for forking and reaping them; /proc
counts in clock ticks, 10 ms). A pool replaces a child after every kill and every crash, and
every crew (every test that starts one) prestarts `agent_concurrency + 1` of them.

    .venv/bin/python bench/agent_spawn.py [--children 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import table
from crewwork.agents.isolation import AgentChild
from crewwork.agents.zygote import zygote

TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    """utime + stime of a live process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def forked(n: int) -> tuple[float, float]:
    """Wall and CPU for `n` forked children: theirs, and the zygote's for forking and reaping them."""
    z = zygote().proc.pid
    cpu = -_proc_cpu(z)
    t0 = time.perf_counter()
    for _ in range(n):
        child = AgentChild()
        await child.wait_ready()
        pid = child.proc.pid
        assert pid is not None
        cpu += _proc_cpu(pid)
        await asyncio.to_thread(child.kill)
    wall = time.perf_counter() - t0
    return wall, cpu + _proc_cpu(z)


async def fresh(n: int) -> tuple[float, float]:
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    for _ in range(n):
        parent, theirs = socket.socketpair()
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "crewwork.agents.child", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        theirs.close()
        conn = Connection(os.dup(parent.fileno()))
        parent.close()
        msg = await asyncio.to_thread(conn.recv)
        assert msg == ("ready",), msg
        conn.close()  # the child ends when its socket closes
        await asyncio.to_thread(proc.wait, 10)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return time.perf_counter() - t0, cpu


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--children", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not Path("/proc/self/stat").exists():
        sys.exit("agent_spawn: needs Linux /proc")
    # The zygote's own start (its imports, once per pool process) is not a child's cost: start it first.
    warm = AgentChild()
    await warm.wait_ready()
    await asyncio.to_thread(warm.kill)
    z = zygote()
    zygote_cpu = _proc_cpu(z.proc.pid)
    rows: dict[str, list[tuple[float, float]]] = {"fresh interpreter": [], "zygote fork": []}
    for _ in range(args.rounds):  # alternating, so drift in the machine's load hits both
        rows["fresh interpreter"].append(await fresh(args.children))
        rows["zygote fork"].append(await forked(args.children))
    base_wall = statistics.median(w for w, _ in rows["fresh interpreter"]) / args.children
    base_cpu = statistics.median(c for _, c in rows["fresh interpreter"]) / args.children
    out = []
    for name, runs in rows.items():
        wall = statistics.median(w for w, _ in runs) / args.children
        cpu = statistics.median(c for _, c in runs) / args.children
        out.append(
            [name, f"{wall * 1000:.1f}", f"{cpu * 1000:.1f}", f"{wall / base_wall:.3f}", f"{cpu / base_cpu:.3f}"]
        )
    print(
        f"{args.children} children per round, {args.rounds} rounds, medians; zygote's own start: {zygote_cpu:.2f} s CPU"
    )
    print(table(["child", "wall ms/child", "CPU ms/child", "wall ratio", "CPU ratio"], out))


if __name__ == "__main__":
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    asyncio.run(main())
