"""The chaos soak: M work items on real subprocess pools while a bounded chaos driver injects faults, then the
invariant checker over the store. Shared by tests/soak/test_chaos_soak.py (small M, in CI) and bench/chaos.py
(large M, figures).

Faults, drawn at random (seeded) from a fixed schedule bounded in count and time:
- `sigkill`: SIGKILL a random pool process (the stack's supervisor restarts it; Temporal retries its activities);
- `zombie`: SIGSTOP an agent-pool process past its activities' heartbeat timeout, then SIGCONT it: its attempts were
  declared dead and retried elsewhere meanwhile, and it wakes up and tries to finish and write (the store must
  reject those writes);
- `temporal_restart`: stop and restart the Temporal dev server on its persistent database file;
- `pg_terminate`: pg_terminate_backend every connection to the soak's database.

Figures: items, faults by kind, items retried, duplicate executions observed (activity attempts beyond the first
per work-item attempt), stale writes rejected, time to recover after each fault (fault start until the next work
item reaches a terminal state, database clock), and the invariant results.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from crewwork.invariants import check_invariants, summarize
from crewwork.models import WorkItemState
from crewwork.stack import Stack
from crewwork.store.store import Store
from crewwork.store.tables import Event, WorkItem
from crewwork.temporal.devserver import free_port

TERMINAL = {s.value for s in WorkItemState if s.terminal}
FAULT_KINDS = ("sigkill", "zombie", "temporal_restart", "pg_terminate")
# Past the agent activity's heartbeat timeout (10 s, crewwork/workflows/work_item.py AGENT_HEARTBEAT).
ZOMBIE_STOP_S = 14.0

GIT_ENV = {
    "GIT_AUTHOR_NAME": "soak",
    "GIT_AUTHOR_EMAIL": "soak@x",
    "GIT_COMMITTER_NAME": "soak",
    "GIT_COMMITTER_EMAIL": "soak@x",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "PATH": os.environ.get("PATH", ""),
}
PASSING_JUNIT = (
    "import pathlib; p = pathlib.Path('.crewwork/junit.xml'); p.parent.mkdir(exist_ok=True); "
    'p.write_text(\'<testsuite name="s" tests="1" failures="0" errors="0">'
    '<testcase classname="s" name="test_ok" time="0.001"/></testsuite>\')'
)


@dataclass
class Fault:
    kind: str
    target: str
    at: float  # wall clock (same host as the database)
    done_at: float = 0.0
    note: str = ""


@dataclass
class SoakResult:
    items: int
    work_item_ids: list[str]
    faults: list[Fault]
    states: dict[str, int]
    items_retried: int
    duplicate_executions: int
    stale_writes_rejected: int
    recover_s: list[float]
    invariants: Any
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def figures(self) -> dict[str, Any]:
        rec = sorted(self.recover_s)
        return {
            "items": self.items,
            "states": self.states,
            "faults_by_kind": dict(Counter(f.kind for f in self.faults)),
            "faults": [f.__dict__ for f in self.faults],
            "items_retried": self.items_retried,
            "duplicate_executions": self.duplicate_executions,
            "stale_writes_rejected": self.stale_writes_rejected,
            "recover_s_p50": rec[len(rec) // 2] if rec else None,
            "recover_s_max": rec[-1] if rec else None,
            "invariants": summarize(self.invariants),
            "invariant_results": {n: r.ok for n, r in self.invariants.results.items()},
            "wall_s": self.wall_s,
            **self.extra,
        }


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "README").write_text("soak\n")
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "base"]):
        subprocess.run(cmd, cwd=path, check=True, env=GIT_ENV)
    return path


def specs(m: int, root: Path, task_delay_s: float, rng: random.Random) -> list[dict[str, Any]]:
    """About a third code changes (two per repository, so the workspace lease is contended), the rest tasks."""
    out: list[dict[str, Any]] = []
    repo: Path | None = None
    for i in range(m):
        if i % 3 == 2:
            if repo is None or i % 6 == 5:
                repo = make_repo(root / f"repo-{i}")
            out.append(
                {
                    "kind": "code_change",
                    "repo": {"url": str(repo), "ref": "main"},
                    "instruction": f"soak change {i}",
                    "validation": {
                        "command": ["python3", "-c", PASSING_JUNIT],
                        "junit_path": ".crewwork/junit.xml",
                        "timeout_s": 60,
                    },
                    "agent": {"name": "scripted", "config": {"files": {f"f{i}.txt": f"{i}\n"}, "delay_s": 0.5}},
                    "budget": {"max_attempts": 2},
                }
            )
        else:
            out.append(
                {
                    "kind": "task",
                    "instruction": f"soak task {i}",
                    "input": {"i": i},
                    "agent": {
                        "name": "scripted",
                        "config": {"output": {"i": i}, "delay_s": round(task_delay_s * rng.uniform(0.5, 1.5), 2)},
                    },
                    "budget": {"max_attempts": 2},
                }
            )
    return out


def _psql(sql: str) -> str:
    return subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qAtc", sql],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def submit_all(stack: Stack, items: list[dict[str, Any]], spread_s: float = 0.0, timeout_s: float = 120) -> list[str]:
    """Submit through the API, spread evenly over `spread_s` so faults always meet work in flight; each submission
    carries an idempotency key and is retried through faults until accepted."""
    ids: list[str] = []
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    gap = spread_s / max(1, len(items))
    with httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as http:
        for spec in items:
            key = uuid.uuid4().hex
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    r = http.post("/v1/work-items", json=spec, headers={"Idempotency-Key": key})
                    if r.status_code < 300:
                        ids.append(r.json()["id"])
                        break
                    err = f"{r.status_code} {r.text[:300]}"
                except httpx.HTTPError as exc:
                    err = str(exc)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not submit: {err}")
                time.sleep(0.5)
            time.sleep(gap)
    return ids


class ChaosDriver:
    def __init__(self, stack: Stack, db_name: str, rng: random.Random, max_faults: int, every_s: float) -> None:
        self.stack = stack
        self.db_name = db_name
        self.rng = rng
        self.max_faults = max_faults
        self.every_s = every_s
        self.faults: list[Fault] = []

    def schedule(self) -> list[str]:
        # Every kind at least once (when the budget allows), then random kinds.
        kinds = list(FAULT_KINDS)
        self.rng.shuffle(kinds)
        while len(kinds) < self.max_faults:
            kinds.append(self.rng.choice(FAULT_KINDS))
        return kinds[: self.max_faults]

    def run(self, until: Any, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        for kind in self.schedule():
            if time.monotonic() > end or until():
                return
            time.sleep(self.every_s * self.rng.uniform(0.5, 1.5))
            getattr(self, kind)()

    def _pools(self, prefix: str = "") -> list[Any]:
        return [
            p
            for p in self.stack.processes
            if p.name != "api" and p.name.startswith(prefix) and p.proc is not None and p.alive()
        ]

    def sigkill(self) -> None:
        pools = self._pools()
        if not pools:
            return
        p = self.rng.choice(pools)
        f = Fault("sigkill", p.name, time.time())
        assert p.proc is not None
        p.proc.send_signal(signal.SIGKILL)
        f.done_at = time.time()
        self.faults.append(f)

    def zombie(self) -> None:
        pools = self._pools("agent")
        if not pools:
            return
        p = self.rng.choice(pools)
        assert p.proc is not None
        f = Fault("zombie", p.name, time.time())
        restart = p.restart
        p.restart = False  # a stopped process is alive: keep the supervisor out of it anyway
        os.kill(p.proc.pid, signal.SIGSTOP)
        time.sleep(ZOMBIE_STOP_S)
        os.kill(p.proc.pid, signal.SIGCONT)
        p.restart = restart
        f.done_at = time.time()
        self.faults.append(f)

    def temporal_restart(self) -> None:
        server = self.stack.temporal
        assert server is not None
        f = Fault("temporal_restart", "temporal", time.time())
        server.stop()
        server.start()
        f.done_at = time.time()
        self.faults.append(f)

    def pg_terminate(self) -> None:
        f = Fault("pg_terminate", self.db_name, time.time())
        n = _psql(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            f"WHERE datname = '{self.db_name}' AND pid <> pg_backend_pid()"
        )
        f.done_at = time.time()
        f.note = f"{n} connections terminated"
        self.faults.append(f)


async def _terminal_count(store: Store, ids: list[str]) -> int:
    async with store.session() as s:
        rows = (await s.execute(select(WorkItem.state).where(WorkItem.id.in_(ids)))).scalars().all()
    return sum(1 for st in rows if st in TERMINAL)


def wait_terminal(url: str, ids: list[str], timeout_s: float) -> bool:
    async def go() -> bool:
        store = Store(url)
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                try:
                    if await _terminal_count(store, ids) == len(ids):
                        return True
                except Exception:
                    pass  # the soak terminates connections: just ask again
                await asyncio.sleep(0.5)
            return False
        finally:
            await store.close()

    return asyncio.run(go())


async def analyse(url: str, ids: list[str], faults: list[Fault]) -> dict[str, Any]:
    store = Store(url)
    try:
        report = await check_invariants(store, ids, check_git=True)
        async with store.session() as s:
            events = list((await s.scalars(select(Event).where(Event.work_item_id.in_(ids)))).all())
            rows = (await s.execute(select(WorkItem.id, WorkItem.state))).all()
    finally:
        await store.close()
    states = Counter(st for wid, st in rows if wid in set(ids))
    # Each activity attempt that writes starts with a fenced `state_changed` (running / validating) carrying its
    # work-item attempt number; accepted or rejected, every execution leaves one write or one rejection.
    executions: dict[tuple[str, str, Any], int] = defaultdict(int)
    retried: set[str] = set()
    finished_at: list[float] = []
    stale = 0
    after_terminal = 0
    for e in events:
        if e.type == "write_after_terminal_rejected":
            after_terminal += 1
            retried.add(e.work_item_id)
        if e.type == "state_changed" and e.data.get("state") in ("running", "validating") and "attempt" in e.data:
            executions[(e.work_item_id, e.data["state"], e.data.get("attempt"))] += 1
        if e.type == "stale_write_rejected":
            stale += 1
            retried.add(e.work_item_id)
        if e.type == "state_changed" and e.data.get("state") in TERMINAL:
            finished_at.append(float(e.created_at))
    duplicates = 0
    for (wid, _state, _n), count in executions.items():
        if count > 1:
            duplicates += count - 1
            retried.add(wid)
    finished_at.sort()
    recover = []
    for f in faults:
        after = [t for t in finished_at if t > f.at]
        if after:
            recover.append(after[0] - f.at)
    return {
        "report": report,
        "states": dict(states),
        "items_retried": len(retried),
        "duplicates": duplicates,
        "stale": stale,
        "after_terminal": after_terminal,
        "recover": recover,
    }


async def describe_stuck(stack: Stack, url: str, ids: list[str]) -> list[str]:
    """For every item not terminal: its events and its workflow's pending activities (evidence for a bug report)."""
    from temporalio.client import Client

    out: list[str] = []
    store = Store(url)
    client = await Client.connect(f"127.0.0.1:{stack.temporal_port}")
    try:
        async with store.session() as s:
            rows = (await s.scalars(select(WorkItem).where(WorkItem.id.in_(ids)))).all()
            for row in rows:
                if row.state in TERMINAL:
                    continue
                evs = (await s.scalars(select(Event).where(Event.work_item_id == row.id).order_by(Event.id))).all()
                out.append(f"STUCK {row.id} state={row.state} workflow={row.workflow_id}")
                out.extend(f"  event {e.id} {e.type} token={e.token} {e.data}" for e in evs)
                try:
                    d = await client.get_workflow_handle(row.workflow_id).describe()
                    out.append(
                        f"  workflow status={d.status} history_length={d.raw_description.workflow_execution_info.history_length}"
                    )
                    for pa in d.raw_description.pending_activities:
                        out.append(
                            f"  pending {pa.activity_type.name} state={pa.state} attempt={pa.attempt} "
                            f"last_failure={pa.last_failure.message[:200]!r} worker={pa.last_worker_identity}"
                        )
                except Exception as exc:
                    out.append(f"  describe failed: {exc}")
    finally:
        await store.close()
    return out


def run_soak(
    *,
    root: Path,
    db_url: str,
    db_name: str,
    items: int,
    max_faults: int,
    fault_every_s: float = 4.0,
    chaos_deadline_s: float = 120.0,
    finish_timeout_s: float = 240.0,
    task_delay_s: float = 1.0,
    submit_spread_s: float = 30.0,
    agents: int = 2,
    seed: int = 9,
    sandbox: str = "bwrap",
    log: Any = print,
) -> SoakResult:
    rng = random.Random(seed)
    stack = Stack(
        root / "stack",
        temporal_port=free_port(),
        ui_port=free_port(),
        api_port=free_port(),
        database_url=db_url,
        pool_counts={"control": 1, "agent": agents, "validate": 1},
        ui=False,
        extra_env={
            "CREWWORK_TASK_QUEUE_PREFIX": f"soak{uuid.uuid4().hex[:6]}",
            "CREWWORK_SANDBOX_BACKEND": sandbox,
            "CREWWORK_API_RATE_PER_S": "10000",
            "CREWWORK_API_RATE_BURST": "10000",
            "CREWWORK_LOG_LEVEL": "WARNING",
        },
        on_event=lambda msg: log(f"stack: {msg}"),
    )
    started = time.monotonic()
    stack.start()
    try:
        log(f"submitting {items} work items over {submit_spread_s:.0f}s; chaos: up to {max_faults} faults")
        driver = ChaosDriver(stack, db_name, rng, max_faults, fault_every_s)
        submitted: list[str] = []
        errors: list[BaseException] = []
        all_specs = specs(items, root / "repos", task_delay_s, rng)

        def submitter() -> None:
            try:
                submitted.extend(submit_all(stack, all_specs, submit_spread_s))
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        thread = threading.Thread(target=submitter, name="soak-submitter")
        thread.start()
        driver.run(lambda: False, chaos_deadline_s)
        thread.join()
        if errors:
            raise errors[0]
        ids = submitted
        for f in driver.faults:
            log(f"fault {f.kind} on {f.target} at {time.strftime('%H:%M:%S', time.localtime(f.at))} {f.note}")
        finished = wait_terminal(db_url, ids, finish_timeout_s)
        log(f"all terminal: {finished}")
        a = asyncio.run(analyse(db_url, ids, driver.faults))
        if not finished:
            a["stuck"] = asyncio.run(describe_stuck(stack, db_url, ids))
            for line in a["stuck"]:
                log(line)
    finally:
        stack.stop()
    return SoakResult(
        items=len(ids),
        work_item_ids=ids,
        faults=driver.faults,
        states=a["states"],
        items_retried=a["items_retried"],
        duplicate_executions=a["duplicates"],
        stale_writes_rejected=a["stale"],
        recover_s=a["recover"],
        invariants=a["report"],
        wall_s=time.monotonic() - started,
        extra={
            "writes_after_terminal_rejected": a["after_terminal"],
            "pool_restarts": {p.name: p.restarts for p in stack.processes},
            "stuck": a.get("stuck", []),
        },
    )
