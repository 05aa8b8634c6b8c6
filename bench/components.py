"""Component costs: what each piece of a work item's lifecycle costs on its own.

- fenced write (Store.set_state: lock the item row, compare ranks, update, event, outbox) p50/p99, PostgreSQL and
  SQLite, and the watch round's probe of the current rank;
- workspace lease acquire and renew;
- workspace preparation (private git dir, materialised files, disk cap; made + removed on a small repository);
- sandbox start-to-exit of `true` per available backend (bench/sandbox.py has the full comparison);
- RSS of each pool process (real `crewwork worker` subprocesses) idle and under load.

    .venv/bin/python bench/components.py [--quick] [--n 300]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (
    code_change_spec,
    make_repo,
    pg_database,
    rss_mb,
    summary,
    table,
    task_spec,
    write_results,
)
from crewwork.models import WorkItemKind, WorkItemSpec, WorkItemState
from crewwork.store.db import upgrade
from crewwork.store.fencing import FencedWrite, StateChange
from crewwork.store.store import Rank, Store
from crewwork.workspace import gitops


async def timed(n: int, fn: Any) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await fn(i)
        out.append(time.perf_counter() - t0)
    return out


async def store_costs(url: str, n: int) -> dict[str, Any]:
    store = Store(url)
    try:
        tenant = await store.ensure_tenant("bench")
        row, _ = await store.create_work_item(
            tenant_id=tenant, spec=WorkItemSpec(kind=WorkItemKind.task, input={}), base_commit=None, repo_path=None
        )
        step = [0]

        async def fenced(i: int) -> None:
            # What every activity does: a write at its step's rank, accepted because it is the newest.
            step[0] += 1
            await store.set_state(
                StateChange(
                    FencedWrite(work_item_id=row.id, tenant_id=tenant, rank=Rank(step[0], 1), writer="b"),
                    state=WorkItemState.running,
                )
            )

        write = await timed(n, fenced)
        probe = await timed(n, lambda i: store.current_rank(row.id))
        lkey = f"ws:{uuid.uuid4().hex[:6]}#main"
        holder_tok: list[int] = []

        async def acquire(i: int) -> None:
            await store.release_lease(lkey)
            t, _ = await store.acquire_lease(lkey, f"h{i}", 60)
            holder_tok[:] = [int(t or 0)]

        acq = await timed(n, acquire)
        renew = await timed(n, lambda i: store.renew_lease(lkey, holder_tok[0], 60))
        return {
            "fenced_write": summary(write),
            "rank_probe": summary(probe),
            "lease_acquire": summary(acq),
            "lease_renew": summary(renew),
        }
    finally:
        await store.close()


async def workspace_costs(root: Path, n: int) -> dict[str, Any]:
    """A workspace (private git dir + materialised files, with the configured disk cap) made and removed."""
    from crewwork.config.sandbox import SandboxSettings
    from crewwork.sandbox.disk import workspace_disk_mb
    from crewwork.workspace.tree import Workspace

    repo = make_repo(root / "ws-repo", {f"src/m{i}.py": "x = 1\n" * 50 for i in range(50)} | {"README": "r\n"})
    commit = (await gitops.git("rev-parse", "HEAD", cwd=repo)).out.strip()
    sandbox = SandboxSettings()
    add: list[float] = []
    rm: list[float] = []
    for i in range(n):
        t0 = time.perf_counter()
        ws = await Workspace.create(
            git_dir=gitops.git_dir_of(repo),
            home=root / "workspaces" / f"w{i}",
            commit=commit,
            disk_mb=workspace_disk_mb(sandbox, sandbox.default_limits()),
            owner=sandbox.owner(),
        )
        t1 = time.perf_counter()
        await ws.remove()
        add.append(t1 - t0)
        rm.append(time.perf_counter() - t1)
    return {"workspace_create": summary(add), "workspace_remove": summary(rm), "repo_files": 51}


async def sandbox_costs(root: Path, n: int) -> dict[str, Any]:
    from crewwork.sandbox.backends import SANDBOXES, get_sandbox
    from crewwork.sandbox.base import SandboxLimits

    limits = SandboxLimits(memory_mb=256, pids=64, cpus=1.0, timeout_s=60)
    out: dict[str, Any] = {}
    # A directory of its own: a sandbox hands its workspace to the sandbox user, and the temporary root handed so
    # kept the later load phase's repositories from crewwork's confined git ("repo.ref 'HEAD' does not exist").
    root = root / "sandbox-workspace"
    root.mkdir()
    for name, cls in SANDBOXES.items():
        ok, why = cls.available()
        if not ok:
            out[name] = {"unavailable": why}
            continue
        sb = get_sandbox(name, allow_unsafe=True)
        await sb.run(["true"], workspace=root, limits=limits)  # warm-up
        lat = []
        for _ in range(n):
            t0 = time.perf_counter()
            await sb.run(["true"], workspace=root, limits=limits)
            lat.append(time.perf_counter() - t0)
        out[name] = summary(lat)
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["true"], check=True)
        t.append(time.perf_counter() - t0)
    out["bare subprocess"] = summary(t)
    return out


def pool_rss(url: str, root: Path, items: int) -> dict[str, Any]:
    import httpx

    from crewwork.cli.stack import Stack
    from crewwork.temporal.devserver import free_port

    stack = Stack(
        root / "stack",
        temporal_port=free_port(),
        ui_port=free_port(),
        api_port=free_port(),
        database_url=url,
        ui=False,
        extra_env={
            "CREWWORK_TASK_QUEUE_PREFIX": f"rss{uuid.uuid4().hex[:6]}",
            "CREWWORK_SANDBOX_BACKEND": "bwrap",
            "CREWWORK_API_RATE_PER_S": "10000",
            "CREWWORK_API_RATE_BURST": "10000",
            "CREWWORK_LOG_LEVEL": "WARNING",
        },
    )
    stack.start()
    try:
        time.sleep(3)
        idle = {p.name: rss_mb(p.proc.pid) for p in stack.processes if p.proc}
        peak = dict(idle)
        headers = {"Authorization": f"Bearer {stack.api_key}"}
        with httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as http:
            ids = []
            for i in range(items):
                spec = (
                    code_change_spec(make_repo(root / f"r{i}", {"README": "x\n"}))
                    if i % 5 == 0
                    else task_spec(delay_s=0.2)
                )
                r = http.post("/v1/work-items", json=spec)
                if r.status_code >= 300:
                    raise SystemExit(f"components: submitting a load item failed: {r.status_code} {r.text[:300]}")
                ids.append(r.json()["id"])
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                for p in stack.processes:
                    if p.proc:
                        peak[p.name] = max(peak[p.name], rss_mb(p.proc.pid))
                states = [http.get(f"/v1/work-items/{i}").json()["state"] for i in ids[-5:]]
                if all(s in ("succeeded", "failed", "dead") for s in states):
                    break
                time.sleep(0.3)
    finally:
        stack.stop()
    return {"idle_mb": idle, "under_load_peak_mb": peak, "load_items": items}


async def sqlite_url(root: Path) -> str:
    url = f"sqlite+aiosqlite:///{root / 'c.db'}"
    await upgrade(url)
    return url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int, default=300)
    args = ap.parse_args()
    n = 50 if args.quick else args.n
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="crewwork-components-") as tmp:
        root = Path(tmp)
        with pg_database("crewwork_components") as (url, _db):
            out["postgres"] = asyncio.run(store_costs(url, n))
            out["sqlite"] = asyncio.run(store_costs(asyncio.run(sqlite_url(root)), n))
            out["git"] = asyncio.run(workspace_costs(root, max(10, n // 10)))
            out["sandbox"] = asyncio.run(sandbox_costs(root, max(5, n // 20)))
            out["rss"] = pool_rss(url, root, 20 if args.quick else 60)
    rows = []
    for what in ("fenced_write", "rank_probe", "lease_acquire", "lease_renew"):
        for db in ("postgres", "sqlite"):
            s = out[db][what]
            rows.append([what, db, s["p50"] * 1000, s["p99"] * 1000])
    for what in ("workspace_create", "workspace_remove"):
        s = out["git"][what]
        rows.append([what, "git", s["p50"] * 1000, s["p99"] * 1000])
    for name, s in out["sandbox"].items():
        if "p50" in s:
            rows.append(["sandbox start `true`", name, s["p50"] * 1000, s["p99"] * 1000])
    print(table(["component", "on", "p50 ms", "p99 ms"], rows))
    print()
    r = out["rss"]
    print(
        table(
            ["process", "RSS idle MiB", "RSS peak under load MiB"],
            [[k, r["idle_mb"][k], r["under_load_peak_mb"][k]] for k in r["idle_mb"]],
        )
    )
    write_results("components", out)


if __name__ == "__main__":
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    main()
