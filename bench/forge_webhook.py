"""Forge webhook benchmark: how fast the API answers GitHub's deliveries (docs/forge.md), which it must do quickly
(GitHub gives up after 10 s and marks the delivery failed): the HMAC check, the parse and the one transaction that
records the delivery and queues its trigger, with no forge call and no workflow start in the request.

    .venv/bin/python bench/forge_webhook.py [--requests 300] [--db sqlite|postgres]

Starts the real API (uvicorn) on a throwaway store, with the intake off (so only the request path is measured), and
sends, one at a time from an HTTP client on the same machine: new triggers (`queued`), redeliveries of one delivery
id (`duplicate_delivery`), replays under new ids (`duplicate_trigger`), deliveries with a wrong signature (401) and
`/healthz`-like baseline requests to an unknown subscription (404, one indexed read). Prints one table; read the
ratios to the baseline, these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

from crewwork.forge.github_events import sign
from crewwork.store.db import upgrade
from crewwork.store.forge import ForgeStore
from crewwork.store.store import Store
from crewwork.temporal.devserver import free_port

PG = "postgresql+asyncpg://postgres@127.0.0.1:5432"
EXAMPLES = Path(__file__).resolve().parents[1] / ".cache/node/node_modules/@octokit/webhooks-examples"


def payload() -> dict[str, Any]:
    for entry in json.loads((EXAMPLES / "api.github.com" / "index.json").read_text()):
        if entry["name"] == "issues":
            for example in entry["examples"]:
                if example.get("action") == "labeled":
                    example["repository"]["full_name"] = "acme/calc"
                    example["label"]["name"] = "crewwork"
                    return dict(example)
    raise SystemExit("no issues.labeled example: run scripts/test-env.sh (npm @octokit/webhooks-examples)")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-"))
    dbname = f"forge_bench_{uuid.uuid4().hex[:8]}"
    if args.db == "postgres":
        subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", dbname], check=True)
        url = f"{PG}/{dbname}"
    else:
        url = f"sqlite+aiosqlite:///{tmp / 'crewwork.db'}"
    await upgrade(url)
    store = Store(url)
    tenant = await store.ensure_tenant("bench")
    repo = await store.create_repository(tenant_id=tenant, url="https://github.com/acme/calc")
    sub = await ForgeStore(store).subscribe(
        tenant_id=tenant, repository_id=repo.id, dialect="github", settings={"label": "crewwork"}
    )
    await store.close()
    port = free_port()
    env = {
        **os.environ,
        "CREWWORK_DATA_DIR": str(tmp),
        "CREWWORK_DATABASE_URL": url,
        "CREWWORK_FORGE_INTAKE": "false",
        "CREWWORK_WEBHOOK_DELIVERY": "false",
        "CREWWORK_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",  # none: the webhook path never needs it
    }
    api = subprocess.Popen(
        [sys.executable, "-m", "crewwork", "api", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    hook = f"/forge/github/{sub.id}"
    template = payload()
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as c:
            for _ in range(300):
                try:
                    await c.get("/metrics")
                    break
                except httpx.HTTPError:
                    await asyncio.sleep(0.1)

            async def send(body: bytes, delivery: str, secret: str = sub.secret) -> tuple[float, int]:
                headers = {
                    "Content-Type": "application/json",
                    "X-GitHub-Event": "issues",
                    "X-GitHub-Delivery": delivery,
                    "X-Hub-Signature-256": sign(secret, body),
                }
                t0 = time.perf_counter()
                r = await c.post(hook, content=body, headers=headers)
                return time.perf_counter() - t0, r.status_code

            async def unknown() -> tuple[float, int]:
                t0 = time.perf_counter()
                r = await c.post("/forge/github/fsub_none", content=b"{}", headers={"Content-Type": "application/json"})
                return time.perf_counter() - t0, r.status_code

            rows: dict[str, list[float]] = {
                k: [] for k in ("baseline 404", "queued", "dup delivery", "dup trigger", "bad sig")
            }
            statuses: dict[str, set[int]] = {k: set() for k in rows}
            first = json.dumps(template).encode()
            await send(first, "fixed-delivery")
            for i in range(args.requests):
                template["issue"]["number"] = 10_000 + i
                body = json.dumps(template).encode()
                for name, call in (
                    ("baseline 404", unknown()),
                    ("queued", send(body, str(uuid.uuid4()))),
                    ("dup delivery", send(first, "fixed-delivery")),
                    ("dup trigger", send(body, str(uuid.uuid4()))),
                    ("bad sig", send(body, str(uuid.uuid4()), secret="wrong")),
                ):
                    took, status = await call
                    rows[name].append(took * 1000)
                    statuses[name].add(status)
        print(f"forge webhook answers, {args.requests} of each, one at a time, {args.db}, body {len(first)} bytes")
        print(f"{'request':<14} {'status':<8} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'x baseline p50':>15}")
        base50 = statistics.median(rows["baseline 404"])
        for name, xs in rows.items():
            print(
                f"{name:<14} {','.join(map(str, sorted(statuses[name]))):<8} {statistics.median(xs):>8.1f} "
                f"{pct(xs, 0.95):>8.1f} {max(xs):>8.1f} {statistics.median(xs) / base50:>15.2f}"
            )
    finally:
        api.terminate()
        api.wait(10)
        if args.db == "postgres":
            subprocess.run(["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--force", dbname], check=False)


if __name__ == "__main__":
    asyncio.run(main())
