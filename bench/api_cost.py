"""What one submission costs crewwork's API, against the floor: a bare FastAPI route doing the same insert and start
(bench/bare_api.py: body validation, the work item row and its `submitted` event in one statement, the workflow
start; no authentication, rate limit, policy, idempotency or admission).

    .venv/bin/python bench/api_cost.py [--requests 400] [--clients 4] [--rounds 3]

Both APIs run as their own processes against one throwaway PostgreSQL database and one Temporal dev server (no
workers: the workflows started are left waiting, for both); rounds alternate between them. Per request it prints
the CPU of the API process, of PostgreSQL (every server process on the host: keep the machine quiet) and of the
Temporal server, the requests per second and the p50 latency, and the ratio of crewwork to bare in each round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import dev_server, pct, pg_database, postgres_cpu_s, proc_cpu_s, table, task_spec, wait_http
from crewwork.store.store import Store
from crewwork.temporal.devserver import free_port

HERE = Path(__file__).resolve().parent


async def load(url: str, key: str | None, requests: int, clients: int) -> tuple[float, list[float], int]:
    """`requests` submissions from `clients` concurrent clients: (wall seconds, latencies, errors)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    https = [httpx.AsyncClient(base_url=url, headers=headers, timeout=60) for _ in range(clients)]
    left = list(range(requests))
    lat: list[float] = []
    errors = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal errors
        async with http:
            while left:
                left.pop()
                t0 = time.perf_counter()
                r = await http.post("/v1/work-items", json=task_spec(delay_s=0.1))
                lat.append(time.perf_counter() - t0)
                if r.status_code != 202:
                    errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client(h) for h in https))
    return time.perf_counter() - t0, lat, errors


async def api_key(url: str) -> str:
    store = Store(url)
    try:
        return (await store.create_api_key("bench"))[1]
    finally:
        await store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if shutil.which("psql") is None:
        raise SystemExit("bench/api_cost.py needs PostgreSQL on 127.0.0.1:5432 and psql (see docs/development.md)")

    with (
        pg_database("crewwork_apicost") as (url, _name),
        tempfile.TemporaryDirectory(prefix="crewwork-apicost-") as tmp,
        dev_server(Path(tmp) / "temporal") as temporal,
    ):
        key = asyncio.run(api_key(url))
        queue = f"ac{uuid.uuid4().hex[:6]}"
        crew_port, bare_port = free_port(), free_port()
        env = {
            **os.environ,
            "CREWWORK_DATA_DIR": tmp,
            "CREWWORK_DATABASE_URL": url,
            "CREWWORK_TEMPORAL_ADDRESS": temporal.address,
            "CREWWORK_TASK_QUEUE_PREFIX": queue,
            "CREWWORK_API_RATE_PER_S": "1000000",
            "CREWWORK_API_RATE_BURST": "1000000",
            "CREWWORK_TENANT_MAX_IN_FLIGHT": "1000000",  # nobody runs the items: every one is admitted and started
            "CREWWORK_WEBHOOK_DELIVERY": "false",
            "CREWWORK_LOG_LEVEL": "WARNING",
        }
        dsn = url.replace("postgresql+asyncpg://", "postgresql://")
        procs = {
            "crewwork": subprocess.Popen(
                [sys.executable, "-m", "crewwork", "api", "--port", str(crew_port)], env=env, stdout=subprocess.DEVNULL
            ),
            "bare": subprocess.Popen(
                [sys.executable, str(HERE / "bare_api.py"), str(bare_port), dsn, temporal.address, f"{queue}-control"],
                env=env,
                stdout=subprocess.DEVNULL,
            ),
        }
        urls = {"crewwork": f"http://127.0.0.1:{crew_port}", "bare": f"http://127.0.0.1:{bare_port}"}
        keys = {"crewwork": key, "bare": None}
        try:
            wait_http(urls["crewwork"] + "/healthz", procs["crewwork"])
            wait_http(urls["bare"] + "/docs", procs["bare"])
            tpid = temporal.proc.pid if temporal.proc else 0
            rows: list[list[Any]] = []
            cpu: dict[str, list[float]] = {"crewwork": [], "bare": []}
            for name in ("crewwork", "bare"):  # warm up: imports, prepared statements, connections
                asyncio.run(load(urls[name], keys[name], 40, args.clients))
            for rnd in range(1, args.rounds + 1):
                for name in ("crewwork", "bare"):
                    pid = procs[name].pid
                    c0, p0, t0 = proc_cpu_s(pid), postgres_cpu_s(), proc_cpu_s(tpid)
                    wall, lat, errors = asyncio.run(load(urls[name], keys[name], args.requests, args.clients))
                    n = args.requests
                    api_ms = (proc_cpu_s(pid) - c0) / n * 1000
                    pg_ms = (postgres_cpu_s() - p0) / n * 1000
                    t_ms = (proc_cpu_s(tpid) - t0) / n * 1000
                    cpu[name].append(api_ms + pg_ms)
                    rows.append(
                        [
                            rnd,
                            name,
                            f"{n / wall:.0f}",
                            f"{pct(lat, 50) * 1000:.1f}",
                            f"{api_ms:.2f}",
                            f"{pg_ms:.2f}",
                            f"{t_ms:.2f}",
                            f"{api_ms + pg_ms + t_ms:.2f}",
                            errors,
                        ]
                    )
        finally:
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                p.wait(15)

    print(
        f"\nsubmission cost: crewwork's API against a bare FastAPI route ({args.requests} requests x {args.rounds} rounds,"
    )
    print(f"{args.clients} clients, load average {os.getloadavg()[0]:.1f} at the end)\n")
    print(
        table(
            [
                "round",
                "API",
                "req/s",
                "p50 ms",
                "API CPU ms/req",
                "PostgreSQL ms/req",
                "Temporal ms/req",
                "total",
                "errors",
            ],
            rows,
        )
    )
    ratios = [c / b for c, b in zip(cpu["crewwork"], cpu["bare"], strict=True) if b > 0]
    if ratios:
        print(
            f"\nAPI + PostgreSQL CPU per submission, crewwork / bare, per round: {', '.join(f'{r:.2f}' for r in ratios)}"
            f" (median {statistics.median(ratios):.2f})"
        )


if __name__ == "__main__":
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    main()
