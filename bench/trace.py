"""Where a `task` item's time goes under the load test: the same stack and load as bench/load.py, then each item's
Temporal history and store rows are read back and its life is split into phases, printed as p50/p95 per phase.

Phases of a `task` item (see crewwork/workflows/work_item.py), from its Temporal history (server clock):
- start: the API's POST starting the workflow -> first workflow task started (waiting for a control poller);
- wft1: first workflow task (admit as a local activity, schedule run_agent);
- agent wait: run_agent scheduled -> started (waiting for an agent slot);
- agent run: run_agent started -> completed;
- wft2 wait: run_agent completed -> next workflow task started;
- wft2: that workflow task (finish as a local activity) -> workflow completed.

The agent slot's own breakdown, from the history and the store's rows (database clock; same host, same clock):
- dispatch -> first write: activity started (server) -> the `running` state change's statement (the poll's
  response reaching Python, decoding the input, choosing the agent);
- first write + agent: -> the transcript artifact's statement (the rest of the first transaction, the watch,
  the mock agent's own `delay_s`, its result);
- transcript tx: -> the `agent_finished` event's statement (the artifact's own transaction, when it has one);
- last write + completion: -> activity completed (server): the last transaction, encoding the result, the
  completion round trip;
- completion -> next start: activity completed -> the next activity started on the same agent process (the poll
  round trip and the server's matching). Only per slot with `--slots 1`; with more slots per process the slot
  efficiency (busy slot-seconds over the run's slot-seconds) is given instead.
Heartbeats: the watch heartbeats every 2 s, so a 100 ms agent makes none.

CPU per item: each process's CPU seconds over the run divided by the items; `--profile NAME [--profile-gil]` (a pool process,
e.g. agent-0 or control-0) samples it with py-spy and groups the samples by what they were doing.

    .venv/bin/python bench/trace.py [--items 100] [--clients 12] [--agents 1] [--slots 1] [--profile agent-0]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import select
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.harness import pg_database, postgres_cpu_s, proc_cpu_s, summary, table, tree_cpu_s
from bench.load import drive, load_stack
from crewwork.store.store import Store
from crewwork.store.tables import Artifact, Event, WorkItem

HISTORY_KEYS = ["start", "wft1", "agent wait", "agent run", "wft2 wait", "wft2", "total"]
SLOT_KEYS = [
    "dispatch -> first write",
    "first write + agent",
    "transcript tx",
    "last write + completion",
    "completion -> next start",
]
COUNT_KEYS = ["workflow tasks", "timers fired", "signals", "history events"]
MOCK_AGENT_S = 0.1


def _ts(e: Any) -> float:
    return float(e.event_time.ToDatetime().timestamp())


def phases(events: list[Any]) -> dict[str, float]:
    t: dict[str, list[float]] = {}
    for e in events:
        name = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
        t.setdefault(name, []).append(_ts(e))
    wft_started = t.get("WORKFLOW_TASK_STARTED", [])
    wft_done = t.get("WORKFLOW_TASK_COMPLETED", [])
    out: dict[str, float] = {}
    start = t["WORKFLOW_EXECUTION_STARTED"][0]
    out["_wf_start"] = start
    if wft_started:
        out["start"] = wft_started[0] - start
    if wft_done and wft_started:
        out["wft1"] = wft_done[0] - wft_started[0]
    sched, started, completed = (
        t.get(k, [0])[0] for k in ("ACTIVITY_TASK_SCHEDULED", "ACTIVITY_TASK_STARTED", "ACTIVITY_TASK_COMPLETED")
    )
    if sched and started:
        out["agent wait"] = started - sched
    if started and completed:
        out["agent run"] = completed - started
        out["_scheduled"], out["_started"], out["_completed"] = sched, started, completed
    later = [s for s in wft_started if completed and s >= completed]
    if later:
        out["wft2 wait"] = later[0] - completed
        end = t.get("WORKFLOW_EXECUTION_COMPLETED", [later[0]])[0]
        out["wft2"] = end - later[0]
    if "WORKFLOW_EXECUTION_COMPLETED" in t:
        out["total"] = t["WORKFLOW_EXECUTION_COMPLETED"][0] - start
        out["_wf_end"] = t["WORKFLOW_EXECUTION_COMPLETED"][0]
    out["workflow tasks"] = float(len(wft_started))
    # What woke a queued item to re-run admission: its backoff timer or a `slot_freed` signal.
    out["timers fired"] = float(len(t.get("TIMER_FIRED", [])))
    out["signals"] = float(len(t.get("WORKFLOW_EXECUTION_SIGNALED", [])))
    out["history events"] = float(len(events))
    return out


def agent_identity(events: list[Any]) -> str:
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            return str(e.activity_task_started_event_attributes.identity)
    return ""


async def histories(address: str, url: str) -> list[dict[str, Any]]:
    """Per item: its history phases, the agent process that ran it, and the store's timestamps of its writes."""
    client = await Client.connect(address)
    store = Store(url)
    async with store.session() as s:
        items = (await s.execute(select(WorkItem.id, WorkItem.workflow_id))).all()
        evs = (
            await s.execute(
                select(Event.work_item_id, Event.type, Event.data, Event.created_at).where(
                    Event.type.in_(["state_changed", "agent_finished"])
                )
            )
        ).all()
        arts = (
            await s.execute(
                select(Artifact.work_item_id, Artifact.created_at).where(Artifact.name.like("%transcript%"))
            )
        ).all()
    await store.close()
    writes: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for wid, typ, data, created in evs:
        if typ == "state_changed" and data.get("state") == "running" and "activity_attempt" in data:
            writes[wid].setdefault("running", float(created))
        elif typ == "agent_finished":
            writes[wid].setdefault("finished", float(created))
    for wid, created in arts:
        writes[wid].setdefault("transcript", float(created))
    out = []
    for wid, wf in items:
        events = list((await client.get_workflow_handle(wf).fetch_history()).events)
        p: dict[str, Any] = phases(events)
        p["_identity"] = agent_identity(events)
        w = writes.get(wid, {})
        st, done = p.get("_started"), p.get("_completed")
        if st and done and "running" in w and "finished" in w:
            p["dispatch -> first write"] = w["running"] - st
            mid = w.get("transcript", w["finished"])
            p["first write + agent"] = mid - w["running"]
            if "transcript" in w:
                p["transcript tx"] = w["finished"] - w["transcript"]
            p["last write + completion"] = done - w["finished"]
            p["_finished"] = w["finished"]
        out.append(p)
    return out


def slot_figures(traces: list[dict[str, Any]], slots: int) -> tuple[float, float]:
    """Fill in `completion -> next start` per agent process (one slot each), and return (the agent slots' busy
    fraction: activity-seconds over slot-seconds from each process's first start to its last completion, and the
    slot's tasks/s over its limit for the mock agent)."""
    by_proc: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for t in traces:
        if "_started" in t:
            by_proc[t["_identity"]].append(t)
    busy = span = n = 0.0
    for runs in by_proc.values():
        runs.sort(key=lambda t: t["_started"])
        if slots == 1:
            for a, b in itertools.pairwise(runs):
                a["completion -> next start"] = b["_started"] - a["_completed"]
        busy += sum(t["_completed"] - t["_started"] for t in runs)
        span += slots * (max(t["_completed"] for t in runs) - runs[0]["_started"])
        n += len(runs)
    if not span:
        return 0.0, 0.0
    return busy / span, (n / span) * MOCK_AGENT_S


GAP_KEYS = ["free -> next start", "of it: no task scheduled", "of it: scheduled, not yet started"]


def idle_gaps(traces: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per agent process (one slot each): from the moment its agent was done with one task (the `agent_finished`
    write, where the slot is given back) to the next task's start, split into the part where no activity task
    was scheduled anywhere that had not started (the slot starved: the control side had nothing for it) and the
    part where the next task was scheduled but not yet handed to the slot (the poll and the server's matching)."""
    by_proc: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for t in traces:
        if "_started" in t and "_finished" in t:
            by_proc[t["_identity"]].append(t)
    out = []
    everything = [t for t in traces if "_scheduled" in t]
    for runs in by_proc.values():
        runs.sort(key=lambda t: t["_started"])
        for a, b in itertools.pairwise(runs):
            free = a["_finished"]
            # The first moment after `free` at which some task was scheduled and not yet started.
            avail = min(
                (max(t["_scheduled"], free) for t in everything if t["_started"] > free and t is not a), default=free
            )
            avail = min(avail, b["_started"])
            out.append(
                {
                    GAP_KEYS[0]: b["_started"] - free,
                    GAP_KEYS[1]: max(0.0, avail - free),
                    GAP_KEYS[2]: b["_started"] - max(avail, free),
                }
            )
    return out


# ------------------------------------------------------------------------------------------------ py-spy

CATEGORIES = [
    ("payload conversion", ("pydantic", "temporalio/converter", "crewwork/temporal/converter", "json/")),
    ("store (SQLAlchemy, asyncpg)", ("sqlalchemy", "asyncpg")),
    ("Temporal SDK (worker, bridge)", ("temporalio",)),
    ("HTTP / API", ("uvicorn", "starlette", "fastapi", "httpx", "h11")),
    ("logging", ("logging/",)),
    ("asyncio event loop", ("asyncio/",)),
]


def profile_summary(path: Path) -> list[list[Any]]:
    """py-spy's raw (folded) samples grouped by the innermost frame that belongs to a known category."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        if frames and "selectors.py" in frames[-1]:
            # The event loop waiting in epoll: py-spy counts it when it cannot tell idle threads (--nonblocking).
            counts["waiting (event loop in epoll)"] += int(n)
            total += int(n)
            continue
        cat = "other (crewwork, stdlib)"
        for frame in reversed(frames):
            hit = next((c for c, keys in CATEGORIES if any(k in frame for k in keys)), None)
            if hit:
                cat = hit
                break
        counts[cat] += int(n)
        total += int(n)
    return [[c, n, n / total if total else 0.0] for c, n in counts.most_common()]


def py_spy() -> Path | None:
    """py-spy (a bench-only dependency: `pip install py-spy`, in the `bench` extra), or None when missing."""
    import shutil

    local = Path(sys.executable).parent / "py-spy"
    if local.exists():
        return local
    found = shutil.which("py-spy")
    return Path(found) if found else None


def run_once(args: argparse.Namespace, env: dict[str, str], spy_bin: Path | None) -> dict[str, Any]:
    """One stack, a warm-up, the measured burst, then the histories: the figures of one configuration."""
    prof = Path(f"/tmp/prof-{args.profile}.txt")
    load0 = os.getloadavg()[0]
    with pg_database("crewwork_trace") as (url, _db), tempfile.TemporaryDirectory(prefix="crewwork-trace-") as tmp:
        stack = load_stack(
            Path(tmp), url, args.agents, args.slots, control=args.control, env=env, one_process=args.one_process
        )
        stack.start()
        try:
            time.sleep(2.0)
            asyncio.run(drive(stack, url, 4, 4, 60))
            cpu0 = {p.name: tree_cpu_s(p.proc.pid) for p in stack.processes if p.proc}
            tpid = stack.temporal.proc.pid if stack.temporal and stack.temporal.proc else 0
            cpu0["temporal"] = proc_cpu_s(tpid)
            cpu0["postgres"] = postgres_cpu_s()
            spy = None
            if args.profile and spy_bin is not None:
                pid = next(p.proc.pid for p in stack.processes if p.name == args.profile and p.proc)
                cmd = [str(spy_bin), "record", "-p", str(pid), "-f", "raw", "-r", "200", "-o", str(prof)]
                # --gil: only the samples of a thread holding the GIL, i.e. Python that runs (the default also counts
                # threads waiting in native code: the SDK's bridge, the event loop in epoll).
                gil = ["--gil"] if args.profile_gil else []
                spy = subprocess.Popen(
                    [*cmd, "--nonblocking", *gil], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                time.sleep(1.0)
            cpu: dict[str, float] = {}

            def cpu_at_end() -> None:
                cpu.update({p.name: tree_cpu_s(p.proc.pid) - cpu0[p.name] for p in stack.processes if p.proc})
                cpu["temporal"] = proc_cpu_s(tpid) - cpu0["temporal"]
                cpu["postgres"] = postgres_cpu_s() - cpu0["postgres"]  # every server process on the host

            out = asyncio.run(drive(stack, url, args.items, args.clients, 300, on_done=cpu_at_end))
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
            assert stack.temporal is not None
            warm = asyncio.run(histories(stack.temporal.address, url))
        finally:
            stack.stop()
    # The warm-up's items ran before the measured burst: leave them out.
    traces = sorted(warm, key=lambda t: t.get("_started", 0.0))[4:]
    busy, eff = slot_figures(traces, args.slots)
    gaps = idle_gaps(traces) if args.slots == 1 else []
    return {
        "gaps": gaps,
        "env": env,
        "load": load0,
        "out": out,
        "traces": traces,
        "busy": busy,
        "efficiency": eff,
        "cpu_ms_per_item": {k: 1000 * v / args.items for k, v in cpu.items()},
        "profile": profile_summary(prof) if args.profile and prof.exists() else None,
    }


def rows(traces: list[dict[str, Any]], keys: list[str]) -> list[list[Any]]:
    r = []
    for k in keys:
        vals = [t[k] for t in traces if k in t]
        if vals:
            s = summary(vals)
            r.append([k, len(vals), s["p50"], s["p95"], s["mean"]])
    return r


def report(run: dict[str, Any], args: argparse.Namespace) -> None:
    out, env = run["out"], run["env"]
    label = " ".join(f"{k}={v}" for k, v in env.items()) or "defaults"
    print(
        f"[{label}] load average {run['load']:.1f}; {args.agents} agent process(es) x {args.slots} slot(s): "
        f"{out['tasks_per_s']:.1f} tasks/s, submit-to-result p50 {out['submit_to_result_s']['p50']:.2f}s"
    )
    print(
        f"agent slots busy {run['busy']:.3f} of the run; per-slot efficiency (tasks/s per slot / "
        f"{1 / MOCK_AGENT_S:.0f}) {run['efficiency']:.3f}"
    )
    print("CPU ms per item: " + ", ".join(f"{k} {v:.1f}" for k, v in run["cpu_ms_per_item"].items()))
    print()
    print(table(["item phase (s)", "n", "p50", "p95", "mean"], rows(run["traces"], HISTORY_KEYS)))
    print()
    print(table(["agent slot (s)", "n", "p50", "p95", "mean"], rows(run["traces"], SLOT_KEYS)))
    print()
    print(table(["per item", "n", "p50", "p95", "mean"], rows(run["traces"], COUNT_KEYS)))
    timed = [t for t in run["traces"] if "_started" in t and "_wf_end" in t]
    if timed:
        first = min(t["_wf_start"] for t in timed)
        # The load's own clock: its start is its end (the last result's store time) minus its wall time.
        begun = max(t["_wf_end"] for t in timed) - out["wall_s"]
        print(
            f"\nfill: load started -> first workflow started {first - begun:.3f}s; "
            f"first workflow started -> first agent started {min(t['_started'] for t in timed) - first:.3f}s; "
            f"drain: last agent completed -> last item completed "
            f"{max(t['_wf_end'] for t in timed) - max(t['_completed'] for t in timed):.3f}s; "
            f"first workflow started -> last item completed {max(t['_wf_end'] for t in timed) - first:.3f}s"
        )
    starts = sorted(t["_started"] for t in timed)
    if len(starts) >= 20:
        # Start-to-start time of consecutive agent tasks, by tenth of the run: the first tenths overlap the burst of
        # submissions (the API and the control pool's first workflow tasks share the machine), the rest is steady.
        cycles = [b - a for a, b in itertools.pairwise(starts)]
        tenth = len(cycles) // 10
        print(
            "agent start-to-start by tenth of the run (ms, mean): "
            + " ".join(f"{1000 * sum(cycles[i : i + tenth]) / tenth:.0f}" for i in range(0, tenth * 10, tenth))
        )
    if run["gaps"]:
        print()
        print(table(["slot idle between tasks (s)", "n", "p50", "p95", "mean"], rows(run["gaps"], GAP_KEYS)))
        long = [g for g in run["gaps"] if g[GAP_KEYS[0]] > MOCK_AGENT_S / 2]
        starved = sum(1 for g in long if g[GAP_KEYS[1]] > g[GAP_KEYS[2]])
        print(
            f"gaps over {MOCK_AGENT_S / 2:.2f}s: {len(long)} of {len(run['gaps'])}; mostly starved (no task "
            f"scheduled): {starved}, mostly waiting for dispatch: {len(long) - starved}"
        )
    if run["profile"]:
        print()
        print(f"py-spy samples of {args.profile}:")
        print(table(["where", "samples", "share"], run["profile"]))
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--agents", type=int, default=1)
    ap.add_argument("--slots", type=int, default=1)
    ap.add_argument("--control", type=int, default=1)
    ap.add_argument("--profile", default="", help="pool process to sample with py-spy during the run (e.g. agent-0)")
    ap.add_argument(
        "--profile-gil",
        action="store_true",
        help="with --profile: only samples of a thread holding the GIL (py-spy --gil)",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="settings of a configuration to compare, e.g. CREWWORK_AGENT_POLL_AHEAD=false (repeatable; each "
        "variant is one space-separated list of KEY=VALUE; rounds alternate the variants)",
    )
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--one-process",
        action="store_true",
        help="the control and agent pools in one process (crewwork worker --pool control,agent), named control-0",
    )
    args = ap.parse_args()
    spy_bin = py_spy()
    if args.profile and spy_bin is None:
        print(
            "bench/trace.py: --profile needs py-spy, which is not installed:\n"
            "  .venv/bin/pip install py-spy   (or the bench extra: .venv/bin/pip install -e '.[bench]')",
            file=sys.stderr,
        )
        sys.exit(2)
    variants = [dict(kv.split("=", 1) for kv in v.split()) for v in args.variant] or [{}]
    runs = []
    for _round in range(args.rounds):
        for env in variants:
            run = run_once(args, env, spy_bin)
            report(run, args)
            runs.append(run)
    if len(runs) > 1:
        print(
            table(
                ["variant", "load", "tasks/s", "s2r p50", "slot busy", "slot eff.", "CPU ms/item (all)", *SLOT_KEYS],
                [
                    [
                        " ".join(f"{k}={v}" for k, v in r["env"].items()) or "defaults",
                        r["load"],
                        r["out"]["tasks_per_s"],
                        r["out"]["submit_to_result_s"]["p50"],
                        r["busy"],
                        r["efficiency"],
                        sum(r["cpu_ms_per_item"].values()),
                        *[summary([t[k] for t in r["traces"] if k in t])["mean"] for k in SLOT_KEYS],
                    ]
                    for r in runs
                ],
            )
        )


if __name__ == "__main__":
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    main()
