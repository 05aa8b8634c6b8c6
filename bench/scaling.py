"""Scaling with work: end-to-end latency and store size as the store grows from 100 to 10,000 work items, and the
query plans of the API's reads at each size (nothing may scan all rows).

At each size the store is first grown to that many work items by cloning a real completed item's rows (work item,
attempts, events; cloning keeps the run bounded: 10,000 items through Temporal would take hours on a shared
2-core machine), then a probe batch of real work items runs the full lifecycle through Temporal and is timed.
EXPLAIN (ANALYZE) of the reads the API and the activities make is taken at each size.

    .venv/bin/python bench/scaling.py [--quick] [--sizes 100,1000,10000] [--probe 30]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text

from bench.harness import (
    bench_settings,
    dev_server,
    in_process_pools,
    pg_database,
    psql,
    task_spec,
    write_results,
)
from bench.overhead import crew_round
from crewwork.store.tables import Attempt, Event, WorkItem

QUERIES = {
    "get work item": "SELECT * FROM work_items WHERE id = '{wid}' AND tenant_id = '{tenant}'",
    "list page (newest 50)": (
        "SELECT * FROM work_items WHERE tenant_id = '{tenant}' ORDER BY created_at DESC, id DESC LIMIT 50"
    ),
    "list page by state": (
        "SELECT * FROM work_items WHERE tenant_id = '{tenant}' AND state = 'succeeded' "
        "ORDER BY created_at DESC, id DESC LIMIT 50"
    ),
    "list next page (keyset)": (
        "SELECT * FROM work_items WHERE tenant_id = '{tenant}' AND (created_at < {ts} OR (created_at = {ts} "
        "AND id < '{wid}')) ORDER BY created_at DESC, id DESC LIMIT 50"
    ),
    "events of an item": "SELECT * FROM events WHERE work_item_id = '{wid}' AND id > 0 ORDER BY id LIMIT 1000",
    "attempts of an item": "SELECT * FROM attempts WHERE work_item_id = '{wid}' ORDER BY number",
    "item row (fenced write)": "SELECT state, fence_rank FROM work_items WHERE id = '{wid}' FOR UPDATE",
    "event tail of a tenant (SSE)": "SELECT * FROM events WHERE tenant_id = '{tenant}' AND id > 0 ORDER BY id LIMIT 100",
}
BIG = ("work_items", "events", "attempts")


def _clone_sql(model: Any, template: str, count: int, tag: str) -> str:
    cols = [c.name for c in model.__table__.columns if not (c.name == "id" and model is not WorkItem)]
    exprs = []
    for c in cols:
        if model is WorkItem and c == "id":
            exprs.append(f"'wi_bg{tag}_' || g")
        elif c == "work_item_id":
            exprs.append(f"'wi_bg{tag}_' || g")
        elif c == "workflow_id":
            exprs.append(f"'wf_bg{tag}_' || g")
        elif c == "idempotency_key":
            exprs.append("NULL")
        elif c in ("created_at", "updated_at"):
            exprs.append(f"{c} - g * 0.001")
        else:
            exprs.append(c)
    key = "id" if model is WorkItem else "work_item_id"
    return (
        f"INSERT INTO {model.__tablename__} ({', '.join(cols)}) SELECT {', '.join(exprs)} "
        f"FROM {model.__tablename__}, generate_series(1, {count}) AS g WHERE {key} = '{template}'"
    )


async def grow(store: Any, template: str, count: int, tag: str) -> None:
    if count <= 0:
        return
    async with store.session() as s:
        for model in (WorkItem, Attempt, Event):
            await s.execute(text(_clone_sql(model, template, count, tag)))
    async with store.session() as s:
        for t in ("work_items", "events", "attempts"):
            await s.execute(text(f"ANALYZE {t}"))


def plans(db: str, params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, q in QUERIES.items():
        plan = psql(f"EXPLAIN (ANALYZE, COSTS OFF) {q.format(**params)}", db)
        seq = [ln.strip() for ln in plan.splitlines() if "Seq Scan" in ln and any(t in ln for t in BIG)]
        ms = next((ln.split(":")[1].strip() for ln in plan.splitlines() if "Execution Time" in ln), "")
        out[name] = {"indexed": not seq, "seq_scans": seq, "execution": ms, "plan": plan.splitlines()[:6]}
    return out


def sizes(db: str) -> dict[str, int]:
    rows = psql(
        "SELECT relname, pg_total_relation_size(relid) FROM pg_catalog.pg_statio_user_tables "
        "WHERE relname IN ('work_items','events','attempts','artifacts','lease_history','fences','leases')",
        db,
    )
    out = {r.split("|")[0]: int(r.split("|")[1]) for r in rows.strip().splitlines()}
    out["database"] = int(psql(f"SELECT pg_database_size('{db}')", db).strip())
    return out


async def run(levels: list[int], probe: int) -> dict[str, Any]:
    res: dict[str, Any] = {"levels": []}
    with tempfile.TemporaryDirectory(prefix="crewwork-scaling-") as tmp, pg_database("crewwork_scaling") as (url, db):
        root = Path(tmp)
        with dev_server(root / "temporal") as server:
            settings = bench_settings(root / "data", server, url, agent_concurrency=10)
            async with in_process_pools(settings, ("control", "agent")) as (service, store, tenant):
                await crew_round(service, tenant, [task_spec() for _ in range(5)])
                async with store.session() as s:
                    template = (
                        await s.execute(text("SELECT id FROM work_items WHERE state = 'succeeded' LIMIT 1"))
                    ).scalar_one()
                for i, level in enumerate(levels):
                    async with store.session() as s:
                        have = int((await s.execute(text("SELECT count(*) FROM work_items"))).scalar_one())
                    await grow(store, template, level - have - probe, f"{i}")
                    r = await crew_round(service, tenant, [task_spec() for _ in range(probe)])
                    async with store.session() as s:
                        total = int((await s.execute(text("SELECT count(*) FROM work_items"))).scalar_one())
                        _wid, ts = (
                            await s.execute(text("SELECT id, created_at FROM work_items ORDER BY created_at LIMIT 1"))
                        ).one()
                    level_out: dict[str, Any] = {
                        "work_items": total,
                        "probe": r,
                        "store_bytes": sizes(db),
                        "plans": plans(db, {"wid": template, "tenant": tenant, "ts": ts}),
                    }
                    print(
                        f"{total} items: probe p50 {r['latency_s']['p50']:.3f}s, {r['items_per_s']:.1f}/s, "
                        f"db {level_out['store_bytes']['database'] / 1e6:.1f} MB, all indexed: "
                        f"{all(p['indexed'] for p in level_out['plans'].values())}",
                        flush=True,
                    )
                    res["levels"].append(level_out)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="sizes 100,1000; probe 15")
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--probe", type=int, default=30)
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.probe = "100,1000", 15
    res = asyncio.run(run([int(x) for x in args.sizes.split(",")], args.probe))
    from bench.report import scaling as render

    print()
    print(render(res))
    write_results("scaling", res)


if __name__ == "__main__":
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    main()
