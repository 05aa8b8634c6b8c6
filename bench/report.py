"""Render the latest bench/results/*.json as the Markdown tables docs/performance.md carries.

.venv/bin/python bench/report.py > /tmp/tables.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import RESULTS, table


def load(name: str) -> dict[str, Any] | None:
    p = RESULTS / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def med(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    s = sorted(rounds, key=lambda r: r["items_per_s"])
    return s[len(s) // 2]


def overhead(d: dict[str, Any]) -> str:
    rows = []
    for kind in ("task", "code_change"):
        if kind not in d:
            continue
        b, c = med(d[kind]["bare"]), med(d[kind]["crewwork"])
        for name, r in (("bare Temporal", b), ("crewwork", c)):
            lat = r["latency_s"]
            rows.append([kind, name, r["items"], r["items_per_s"], lat["p50"], lat["p95"], lat["p99"]])
        rows.append(
            [
                kind,
                "**crewwork/bare**",
                "",
                c["items_per_s"] / b["items_per_s"],
                c["latency_s"]["p50"] / b["latency_s"]["p50"],
                c["latency_s"]["p95"] / b["latency_s"]["p95"],
                c["latency_s"]["p99"] / b["latency_s"]["p99"],
            ]
        )
    out = table(["kind", "run", "items", "items/s", "p50 s", "p95 s", "p99 s"], rows)
    paired = []
    for kind in ("task", "code_change"):
        if kind in d:
            for i, (b, c) in enumerate(zip(d[kind]["bare"], d[kind]["crewwork"], strict=True)):
                paired.append(
                    f"{kind} round {i + 1}: throughput {c['items_per_s'] / b['items_per_s']:.2f}, "
                    f"p50 {c['latency_s']['p50'] / b['latency_s']['p50']:.2f}"
                )
    cpu_rows = []
    for kind in ("task", "code_change"):
        per = d.get(kind, {}).get("cpu_ms_per_item_median")
        if not per:
            continue
        for name, key in (("bare Temporal", "bare"), ("crewwork", "crewwork")):
            c = per[key]
            cpu_rows.append([kind, name, c["bench_process"], c["temporal"], c["postgres"], sum(c.values())])
    cpu = (
        '\n\nCPU per item in ms (median over rounds; "Python" is the one process that runs the worker pools and the '
        "clients; git and sandbox child processes of `code_change` items are not included):\n\n"
        + table(["kind", "run", "Python", "Temporal server", "PostgreSQL", "total"], cpu_rows)
        if cpu_rows
        else ""
    )
    return (
        out
        + "\n\nPaired ratios crewwork/bare per round (each round runs bare, then crewwork): "
        + "; ".join(paired)
        + cpu
    )


def load_table(d: dict[str, Any]) -> str:
    ref = {int(k): v for k, v in d["reference"].items()}
    rows = []
    for r in d["runs"]:
        rf = ref.get(r["agent_processes"])
        rows.append(
            [
                r.get("system", "crewwork"),
                r["agent_processes"],
                r["agent_slots_per_process"],
                r["tasks_per_s"],
                f"{r['tasks_per_s'] / rf['tasks_per_s']:.2f}x" if rf else "",
                r["submit_latency_s"]["p50"],
                r["submit_latency_s"]["p95"],
                r["submit_to_result_s"]["p50"],
                f"{r['submit_to_result_s']['p50'] / rf['submit_to_result_p50_s']:.2f}x" if rf else "",
                r["submit_to_result_s"]["p95"],
                r["queue_wait_s"]["p50"],
                r["queue_wait_s"]["p95"],
            ]
        )
    return table(
        [
            "system",
            "agent procs",
            "slots/proc",
            "tasks/s",
            "vs reference",
            "submit p50 s",
            "submit p95 s",
            "submit-to-result p50 s",
            "vs reference",
            "p95 s",
            "queue wait p50 s",
            "p95 s",
        ],
        rows,
    )


def peers(d: dict[str, Any]) -> str:
    rows = d["table"]
    base = rows[0]["items_per_s"]
    t1 = table(
        ["system", "items", "items/s", "crewwork/peer throughput", "p50 s", "p95 s", "p99 s"],
        [
            [
                r["system"],
                r["items"],
                r["items_per_s"],
                base / r["items_per_s"] if r["items_per_s"] else "",
                r["latency_s"]["p50"],
                r["latency_s"]["p95"],
                r["latency_s"]["p99"],
            ]
            for r in rows
        ],
    )
    zr = []
    for key in ("crewwork", "procrastinate", "dbos"):
        z = d.get(key, {}).get("zombie")
        if not z:
            continue
        if "error" in z:
            zr.append([key, "?", z["error"]])
            continue
        if key == "crewwork":
            what = (
                f"{z.get('stale_writes_rejected')} stale write(s) rejected (stale_write_rejected events); stored "
                f"result from the newest rank: {z.get('result_rank_is_newest')}; final state {z.get('final_state')}"
            )
        else:
            what = (
                f"newer attempt's result `{z.get('result_after_newer_attempt')}` replaced by the stale attempt's "
                f"`{z.get('final_result_writer')}` ({z.get('result_writes')} result writes)"
                if z.get("overwrote")
                else f"final result `{z.get('final_result_writer')}`"
            )
        zr.append([key, "**yes**" if z.get("overwrote") else "no", what])
    return t1 + "\n\n" + table(["system", "stale late write overwrote the newer result?", "what happened"], zr)


def components(d: dict[str, Any]) -> str:
    rows = []
    for what in ("fenced_write", "rank_probe", "lease_acquire", "lease_renew"):
        if what not in d["postgres"]:
            continue
        rows.append(
            [
                what.replace("_", " "),
                d["postgres"][what]["p50"] * 1000,
                d["postgres"][what]["p99"] * 1000,
                d["sqlite"][what]["p50"] * 1000,
                d["sqlite"][what]["p99"] * 1000,
            ]
        )
    t1 = table(["store operation", "PostgreSQL p50 ms", "p99 ms", "SQLite p50 ms", "p99 ms"], rows)
    rows2 = [
        [w.replace("_", " "), d["git"][w]["p50"] * 1000, d["git"][w]["p99"] * 1000]
        for w in ("worktree_add", "worktree_remove")
    ]
    for name, s in d["sandbox"].items():
        if "p50" in s:
            rows2.append([f"sandbox start-to-exit `true`: {name}", s["p50"] * 1000, s["p99"] * 1000])
        else:
            rows2.append([f"sandbox: {name}", "unavailable", ""])
    t2 = table(["operation", "p50 ms", "p99 ms"], rows2)
    r = d["rss"]
    t3 = table(
        ["process", "RSS idle MiB", "RSS peak under load MiB"],
        [[k, r["idle_mb"][k], r["under_load_peak_mb"][k]] for k in r["idle_mb"]],
    )
    return "\n\n".join([t1, t2, t3])


def scaling(d: dict[str, Any]) -> str:
    rows = []
    for lv in d["levels"]:
        r, sb = lv["probe"], lv["store_bytes"]
        rows.append(
            [
                lv["work_items"],
                r["items_per_s"],
                r["latency_s"]["p50"],
                r["latency_s"]["p95"],
                sb["database"] / 1e6,
                sb.get("work_items", 0) / 1e6,
                sb.get("events", 0) / 1e6,
                "yes" if all(p["indexed"] for p in lv["plans"].values()) else "NO",
            ]
        )
    t1 = table(
        [
            "work items in store",
            "probe items/s",
            "p50 s",
            "p95 s",
            "db MB",
            "work_items MB",
            "events MB",
            "reads indexed",
        ],
        rows,
    )
    last = d["levels"][-1]
    t2 = table(
        [f"query at {last['work_items']} items", "indexed (no seq scan of a big table)", "execution"],
        [[k, "yes" if v["indexed"] else f"NO {v['seq_scans']}", v["execution"]] for k, v in last["plans"].items()],
    )
    return t1 + "\n\n" + t2


def chaos(d: dict[str, Any]) -> str:
    rows = [
        ["work items", d["items"]],
        ["final states", ", ".join(f"{k}: {v}" for k, v in d["states"].items())],
        ["faults injected", ", ".join(f"{k}: {v}" for k, v in sorted(d["faults_by_kind"].items()))],
        ["items retried", d["items_retried"]],
        ["duplicate executions observed", d["duplicate_executions"]],
        ["stale writes rejected", d["stale_writes_rejected"]],
        ["writes after terminal rejected", d.get("writes_after_terminal_rejected", 0)],
        # bench/chaos.py writes p50 and p95 (older results had p50 and max).
        [
            "time to recover after a fault, p50 / p95 s",
            f"{d['recover_s_p50']:.1f} / {d.get('recover_s_p95', d.get('recover_s_max', float('nan'))):.1f}",
        ],
        ["pool restarts", ", ".join(f"{k}: {v}" for k, v in d["pool_restarts"].items() if v)],
    ]
    rows += [[f"invariant `{k}`", "ok" if v else "**FAIL**"] for k, v in d["invariant_results"].items()]
    return table(["chaos soak", "value"], rows)


def attempt(d: dict[str, Any]) -> str:
    """bench/attempt.py: the phase table it printed (stored as `table`), and the load it ran under."""
    loads = ", ".join(f"{x:.1f}" for x in d.get("loadavg_1m_per_round", []))
    head = ["phase", "crewwork s", "floor s", "x floor (medians)", "x floor (paired)"]
    start = ", ".join(f"{x:.1f}" for x in d.get("loadavg_at_start", []))
    note = (
        f"\n\nLoad average when the bench started: {start} (the one above is when it wrote its results)."
        if start
        else ""
    )
    land = d.get("landing_side_by_side") or {}
    if land:
        note += (
            f"\n\nThe landing's git work, {land['rounds']} alternating rounds: {land['median_ls_remote_first_s']:.3f} s "
            f"with the ls-remote first (before), {land['median_push_decides_s']:.3f} s with the push deciding (now), "
            f"paired {land['paired_ratio']:.2f}x."
        )
    return table(head, d["table"]) + f"\n\n1-minute load average per round: {loads}" + note


def main() -> None:
    for name, fn in (
        ("overhead", overhead),
        ("load", load_table),
        ("peers", peers),
        ("components", components),
        ("scaling", scaling),
        ("chaos", chaos),
        ("attempt", attempt),
    ):
        d = load(name)
        if d is None:
            continue
        load_avg = ", ".join(f"{x:.1f}" for x in d["machine"]["loadavg_at_start"])
        print(f"### {name}\n\nRun of {d['when']}; load average at its start {load_avg}.\n")
        print(fn(d))
        print()


if __name__ == "__main__":
    main()
