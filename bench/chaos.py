"""Chaos soak figures: M work items on real subprocess pools while a bounded chaos driver SIGKILLs pool processes,
turns an agent process into a zombie (SIGSTOP past its heartbeat timeout, then SIGCONT), restarts the Temporal dev
server and terminates PostgreSQL connections; then the invariant checker over the store.

The driver is tests/soak/chaos.py (CI runs it at small M in tests/soak/test_chaos_soak.py).

    .venv/bin/python bench/chaos.py [--quick] [--items 60] [--faults 12] [--seed 9]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import pg_database, table, write_results
from tests.soak.chaos import run_soak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 items, 6 faults")
    ap.add_argument("--items", type=int, default=60)
    ap.add_argument("--faults", type=int, default=12)
    ap.add_argument("--every", type=float, default=5.0, help="mean seconds between faults")
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--sandbox", default="bwrap")
    args = ap.parse_args()
    if args.quick:
        args.items, args.faults = 20, 6
    spread = max(25.0, args.faults * args.every)
    with tempfile.TemporaryDirectory(prefix="crewwork-chaos-") as tmp, pg_database("crewwork_chaos") as (url, db):
        res = run_soak(
            root=Path(tmp),
            db_url=url,
            db_name=db,
            items=args.items,
            max_faults=args.faults,
            fault_every_s=args.every,
            chaos_deadline_s=spread + 60,
            finish_timeout_s=600,
            task_delay_s=2.0,
            submit_spread_s=spread,
            seed=args.seed,
            sandbox=args.sandbox,
        )
    fig = res.figures()
    print()
    rows = [
        ["work items", fig["items"]],
        ["final states", fig["states"]],
        ["faults injected", sum(fig["faults_by_kind"].values())],
        *[[f"  {k}", v] for k, v in sorted(fig["faults_by_kind"].items())],
        ["items retried", fig["items_retried"]],
        ["duplicate executions observed", fig["duplicate_executions"]],
        ["stale writes rejected", fig["stale_writes_rejected"]],
        ["writes after terminal rejected", fig.get("writes_after_terminal_rejected", 0)],
        ["recovery after a fault p50 s", fig["recover_s_p50"]],
        ["recovery after a fault max s", fig["recover_s_max"]],
        ["pool restarts", fig["pool_restarts"]],
        ["wall time s", fig["wall_s"]],
    ]
    rows += [[f"invariant {k}", "ok" if v else "FAIL"] for k, v in fig["invariant_results"].items()]
    print(table(["chaos soak", "value"], rows))
    if not res.invariants.ok:
        print(res.invariants)
    for line in fig.get("stuck", []):
        print(line)
    write_results("chaos", fig)
    sys.exit(0 if res.invariants.ok else 1)


if __name__ == "__main__":
    main()
