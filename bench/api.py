"""API benchmark: list latency with 100k work items in PostgreSQL, and submit latency at a steady request rate.

    .venv/bin/python bench/api.py [--items 100000] [--rate 20] [--seconds 10]

Creates a throwaway PostgreSQL database (dropped afterwards), inserts the work items directly with SQL, starts a
real Temporal dev server and the real API (uvicorn) and measures from an HTTP client on the same machine. Prints
one table; `/healthz` (one trivial query) is measured side by side as the baseline, because these machines are
shared and noisy: read the ratios, not only the absolute figures. Targets: list p50 < 25 ms, submit p50 < 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from crewwork.store.db import upgrade
from crewwork.store.store import Store
from crewwork.temporal.devserver import DevServer, free_port

PG = "postgresql+asyncpg://postgres@127.0.0.1:5432"

FILL_SQL = """
INSERT INTO work_items (id, tenant_id, kind, state, spec, idempotency_key, labels, repo_url, base_commit, workflow_id,
    reason, result, fence_rank, result_rank, state_rank, attempt_count, delivery_branch, landed_commit, mock, created_at,
    updated_at)
SELECT 'wi_' || lpad(to_hex(g), 24, '0'), :tenant, (ARRAY['task', 'code_change', 'hotfix'])[1 + g % 3],
    (ARRAY['succeeded', 'failed', 'running', 'awaiting_review', 'cancelled'])[1 + g % 5],
    '{"kind": "task", "input": {}}'::json, NULL, json_build_object('team', 'team' || (g % 10), 'batch', 'b' || (g % 100)),
    NULL, NULL, 'work-item-wi_' || g, '', NULL, 0, NULL, NULL, 1 + g % 3, NULL, NULL, true,
    1700000000 + g * 0.5, 1700000000 + g * 0.5
FROM generate_series(1, :n) AS g
"""


def psql(sql: str) -> None:
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qAtc", sql], check=True)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


class Api:
    """The real API as its own process (`crewwork api`), as deployed: the load generator does not share its GIL."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            **env,
            "CREWWORK_API_RATE_PER_S": "1000000",
            "CREWWORK_API_RATE_BURST": "1000000",
            "CREWWORK_WEBHOOK_DELIVERY": "false",
            "CREWWORK_LOG_LEVEL": "WARNING",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Api:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "crewwork", "api", "--port", str(self.port)], env=self.env, stdout=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).json().get("ok"):
                    return self
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        raise RuntimeError("API did not become ready")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(15)


async def timed(client: httpx.AsyncClient, n: int, method: str, path: str, **kw: Any) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await client.request(method, path, **kw)
        out.append((time.perf_counter() - t0) * 1000)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:200]}")
    return out


async def steady_submits(client: httpx.AsyncClient, rate: float, seconds: float) -> list[float]:
    """Open-loop: one submit every 1/rate seconds, whatever the latency, so queueing shows in the tail."""
    lat: list[float] = []
    interval = 1.0 / rate
    start = time.perf_counter()

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        r = await client.post(
            "/v1/work-items",
            json={"kind": "task", "input": {"i": i}, "labels": {"bench": "submit"}},
            headers={"Idempotency-Key": f"bench-{uuid.uuid4().hex}"},
        )
        lat.append((time.perf_counter() - t0) * 1000)
        if r.status_code != 202:
            raise RuntimeError(f"submit: {r.status_code} {r.text[:200]}")

    tasks = []
    i = 0
    while time.perf_counter() - start < seconds:
        tasks.append(asyncio.create_task(one(i)))
        i += 1
        await asyncio.sleep(max(0.0, start + i * interval - time.perf_counter()))
    await asyncio.gather(*tasks)
    return lat


async def direct_sql(store: Store, tenant: str, reps: int) -> list[tuple[str, list[float]]]:
    """The list queries alone (same SQL shape as the API's), to separate database time from HTTP/auth/JSON time."""
    from sqlalchemy import select, tuple_

    from crewwork.store.tables import WorkItem

    async def run(q: Any) -> list[float]:
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            async with store.session() as s:
                (await s.scalars(q)).all()
            out.append((time.perf_counter() - t0) * 1000)
        return out

    base = select(WorkItem).where(WorkItem.tenant_id == tenant).order_by(WorkItem.created_at.desc(), WorkItem.id.desc())
    mid = 1700000000 + 25_000.0
    return [
        ("  SQL only: first page (51 rows)", await run(base.limit(51))),
        (
            "  SQL only: cursor page at ~50k",
            await run(base.where(tuple_(WorkItem.created_at, WorkItem.id) < tuple_(mid, "zz")).limit(51)),
        ),
    ]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=10.0, help="submits per second")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--reps", type=int, default=200, help="requests per list scenario")
    args = ap.parse_args()

    db = f"crewwork_bench_{uuid.uuid4().hex[:8]}"
    psql(f"CREATE DATABASE {db}")
    url = f"{PG}/{db}"
    tmp = Path(tempfile.mkdtemp(prefix="crewwork-bench-"))
    server = DevServer(tmp / "temporal", port=free_port(), ui=False)
    try:
        await upgrade(url)
        store = Store(url)
        _kid, key = await store.create_api_key("bench")
        tenant = await store.ensure_tenant("bench")
        from sqlalchemy import text

        t0 = time.perf_counter()
        async with store.session() as s:
            await s.execute(text(FILL_SQL), {"tenant": tenant, "n": args.items})
        async with store.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text("VACUUM ANALYZE work_items"))
        fill_s = time.perf_counter() - t0
        sql_rows = await direct_sql(store, tenant, args.reps)
        await store.close()
        server.start()
        env = {
            "CREWWORK_DATA_DIR": str(tmp),
            "CREWWORK_DATABASE_URL": url,
            "CREWWORK_TEMPORAL_ADDRESS": server.address,
            "CREWWORK_TASK_QUEUE_PREFIX": f"b{uuid.uuid4().hex[:6]}",
        }
        rows: list[tuple[str, list[float]]] = []
        with Api(env) as api:
            headers = {"Authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(base_url=api.url, headers=headers, timeout=30) as c:
                await timed(c, 20, "GET", "/v1/work-items")  # warm up
                rows.append(("GET /healthz (baseline)", await timed(c, args.reps, "GET", "/healthz")))
                rows.append(("list first page (50)", await timed(c, args.reps, "GET", "/v1/work-items")))
                # A cursor 1000 pages deep (keyset: as cheap as the first page).
                cursor = None
                page = await c.get("/v1/work-items", params={"limit": 200})
                for _ in range(args.items // 200 // 2):
                    cursor = page.json()["next_cursor"]
                    page = await c.get("/v1/work-items", params={"limit": 200, "cursor": cursor})
                rows.append(
                    (
                        "list page at item ~50k (cursor)",
                        await timed(c, args.reps, "GET", "/v1/work-items", params={"cursor": cursor}),
                    )
                )
                rows.append(
                    (
                        "list state=awaiting_review",
                        await timed(c, args.reps, "GET", "/v1/work-items", params={"state": "awaiting_review"}),
                    )
                )
                rows.append(
                    (
                        "list label batch=b7 (1% of items)",
                        await timed(c, args.reps, "GET", "/v1/work-items", params={"label": "batch=b7"}),
                    )
                )
                rows.append(
                    (
                        "list kind=hotfix + created range",
                        await timed(
                            c,
                            args.reps,
                            "GET",
                            "/v1/work-items",
                            params={"kind": "hotfix", "created_after": 1700010000, "created_before": 1700040000},
                        ),
                    )
                )
                rows.append(
                    (
                        f"submit at {args.rate:g}/s for {args.seconds:g} s",
                        await steady_submits(c, args.rate, args.seconds),
                    )
                )
    finally:
        server.stop()
        psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")

    rows += sql_rows
    base = statistics.median(rows[0][1])
    print(f"\ncrewwork API benchmark: {args.items} work items in PostgreSQL (filled by SQL in {fill_s:.1f} s)\n")
    print(f"{'scenario':40} {'n':>5} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'p50 / baseline':>15}")
    print("-" * 88)
    for name, xs in rows:
        p50 = pct(xs, 50)
        print(f"{name:40} {len(xs):5d} {p50:8.2f} {pct(xs, 90):8.2f} {pct(xs, 99):8.2f} {p50 / base:14.1f}x")
    print("\ntargets: list p50 < 25 ms at 100k items; submit p50 < 50 ms")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    asyncio.run(main())
