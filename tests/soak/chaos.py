"""The chaos soak: M work items on real subprocess pools while a bounded chaos driver injects faults, then the
invariant checker over the store and Temporal's histories. Shared by tests/soak/test_chaos_soak.py (small M, in CI)
and bench/chaos.py (large M, figures).

Faults, drawn at random (seeded), each kind at least once:
- `sigkill_control`, `sigkill_agent`, `sigkill_validate`: SIGKILL a random process of that pool (the stack's
  supervisor restarts it; Temporal retries its activities and workflow tasks);
- `stop_before_write`: an agent or validate process freezes itself with SIGSTOP when its next activity attempt is
  delivered, before that attempt's first write (tests/soak/chaos_worker.py), stays frozen past the heartbeat timeout,
  then is SIGCONTed: the zombie of the fencing issue, which must be refused at its first write;
- `stop_after_write`: the same at the attempt's first heartbeat, after its first write;
- `temporal_restart`: stop and restart the Temporal dev server on its persistent database file;
- `pg_restart`: stop the soak's own PostgreSQL server (tests/soak/privatepg.py) and start it again;
- `pg_terminate`: pg_terminate_backend every connection to the soak's database.

Figures: items submitted and lost, final states (`dead` ones ended for infrastructure reasons), faults by kind,
accepted stale writes, state regressions and double landings (all three from the invariant checker), stale writes
rejected, zombie refusals, and recovery per fault kind (fault start until the next item reaches a terminal state on
the database clock, p50/p95).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from crewwork.cli.stack import Stack
from crewwork.models import WorkItemState
from crewwork.store.store import Store
from crewwork.store.tables import Event, WorkItem
from crewwork.temporal.devserver import free_port
from tests.invariants import CompletedStep, check_invariants, completed_steps, summarize
from tests.soak.privatepg import PrivatePostgres, private_postgres

TERMINAL = {s.value for s in WorkItemState if s.terminal}
FAULT_KINDS = (
    "sigkill_control",
    "sigkill_agent",
    "sigkill_validate",
    "stop_before_write",
    "stop_after_write",
    "temporal_restart",
    "pg_restart",
    "pg_terminate",
)
# Past the execution activities' heartbeat timeout (10 s, crewwork/steps/step.py EXECUTION_HEARTBEAT).
ZOMBIE_STOP_S = 14.0
ARM_WAIT_S = 20.0
"""How long an armed stop fault waits for its process to receive an activity attempt before it is called off."""
REPO_ROOT = Path(__file__).resolve().parents[2]

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
    injected: bool = True
    """False for a stop fault whose process received no activity attempt while armed (called off, not counted)."""


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

    @property
    def injected(self) -> list[Fault]:
        return [f for f in self.faults if f.injected]

    def figures(self) -> dict[str, Any]:
        rec = sorted(self.recover_s)
        counts = self.invariants.counts
        by_kind: dict[str, list[float]] = defaultdict(list)
        for f, r in zip(self.injected, self.extra.get("recover_by_fault", []), strict=False):
            if r is not None:
                by_kind[f.kind].append(r)
        return {
            "items": self.items,
            "items_lost": self.items - sum(n for st, n in self.states.items() if st in TERMINAL),
            "states": self.states,
            "dead_infrastructure": self.states.get("dead", 0),
            "faults_by_kind": dict(Counter(f.kind for f in self.injected)),
            "faults_called_off": sum(not f.injected for f in self.faults),
            "faults": [f.__dict__ for f in self.faults],
            "stale_writes_accepted": counts.get("stale_accepted", 0),
            "state_regressions": counts.get("state_regressions", 0),
            "double_landings": self.extra.get("double_landings", 0),
            "items_retried": self.items_retried,
            "duplicate_executions": self.duplicate_executions,
            "stale_writes_rejected": self.stale_writes_rejected,
            "recover_s_p50": _pct(rec, 0.5),
            "recover_s_p95": _pct(rec, 0.95),
            "recover_s_by_kind": {
                k: {"p50": _pct(sorted(v), 0.5), "p95": _pct(sorted(v), 0.95), "n": len(v)}
                for k, v in sorted(by_kind.items())
            },
            "invariants": summarize(self.invariants),
            "invariant_results": {n: r.ok for n, r in self.invariants.results.items()},
            "wall_s": self.wall_s,
            **{k: v for k, v in self.extra.items() if k != "recover_by_fault"},
        }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


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
                    # Lands without a person: the soak is about faults. Said here, not left to the operator's
                    # default (code changes wait for review unless told otherwise; tests/conftest.py turns that
                    # off for the tests, and bench/chaos.py, which does not load it, waited forever on review).
                    "review": {"required": False},
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
    def __init__(
        self,
        stack: Stack,
        pg: PrivatePostgres,
        control_dir: Path,
        rng: random.Random,
        max_faults: int,
        every_s: float,
        log: Any = print,
    ) -> None:
        self.stack = stack
        self.pg = pg
        self.control_dir = control_dir
        self.rng = rng
        self.max_faults = max_faults
        self.every_s = every_s
        self.log = log
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
            f = getattr(self, kind)()
            if f is not None:
                self.faults.append(f)
                self.log(f"fault {f.kind} on {f.target}{'' if f.injected else ' (called off)'} {f.note}")

    def _pools(self, prefix: str = "") -> list[Any]:
        return [
            p
            for p in self.stack.processes
            if p.name != "api" and p.name.startswith(prefix) and p.proc is not None and p.alive()
        ]

    def _sigkill(self, pool: str) -> Fault | None:
        pools = self._pools(pool)
        if not pools:
            return None
        p = self.rng.choice(pools)
        f = Fault(f"sigkill_{pool}", p.name, time.time())
        assert p.proc is not None
        p.proc.send_signal(signal.SIGKILL)
        f.done_at = time.time()
        return f

    def sigkill_control(self) -> Fault | None:
        return self._sigkill("control")

    def sigkill_agent(self) -> Fault | None:
        return self._sigkill("agent")

    def sigkill_validate(self) -> Fault | None:
        return self._sigkill("validate")

    def _stop(self, when: str) -> Fault | None:
        """Arm every agent and validate process; the first that receives an activity attempt freezes itself, the
        others are disarmed. Frozen past the heartbeat timeout, then SIGCONTed."""
        pools = self._pools("agent") + self._pools("validate")
        if not pools:
            return None
        f = Fault(f"stop_{when}_write", "", time.time())
        armed = {p.proc.pid: p for p in pools if p.proc is not None}
        restarts = {pid: p.restart for pid, p in armed.items()}
        for p in armed.values():
            p.restart = False  # a stopped process is alive: keep the supervisor out of it anyway
        for pid in armed:
            (self.control_dir / f"{pid}.{when}").touch()
        deadline = time.monotonic() + ARM_WAIT_S
        stopped: list[int] = []
        while not stopped and time.monotonic() < deadline:
            stopped = [pid for pid in armed if (self.control_dir / f"{pid}.stopped-{when}").exists()]
            time.sleep(0.05)
        for pid in armed:
            (self.control_dir / f"{pid}.{when}").unlink(missing_ok=True)
        time.sleep(0.2)  # another may have claimed its arm just before it was taken away
        stopped = [pid for pid in armed if (self.control_dir / f"{pid}.stopped-{when}").exists()]
        if not stopped:
            for pid, p in armed.items():
                p.restart = restarts[pid]
            f.injected, f.note, f.done_at = False, "no activity attempt arrived while armed", time.time()
            return f
        f.at = time.time()
        f.target = ",".join(armed[pid].name for pid in stopped)
        f.note = "; ".join((self.control_dir / f"{pid}.stopped-{when}").read_text() for pid in stopped)
        for pid in stopped:
            (self.control_dir / f"{pid}.stopped-{when}").unlink()
        time.sleep(ZOMBIE_STOP_S)
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for pid, p in armed.items():
            p.restart = restarts[pid]
        f.done_at = time.time()
        return f

    def stop_before_write(self) -> Fault | None:
        return self._stop("before")

    def stop_after_write(self) -> Fault | None:
        return self._stop("after")

    def temporal_restart(self) -> Fault:
        server = self.stack.temporal
        assert server is not None
        f = Fault("temporal_restart", "temporal", time.time())
        server.stop()
        server.start()
        f.done_at = time.time()
        return f

    def pg_restart(self) -> Fault:
        f = Fault("pg_restart", f"postgres:{self.pg.port}", time.time())
        self.pg.restart(down_s=self.rng.uniform(0.5, 2.0))
        f.done_at = time.time()
        return f

    def pg_terminate(self) -> Fault:
        f = Fault("pg_terminate", "soak", time.time())
        n = self.pg.psql(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = 'soak' AND pid <> pg_backend_pid()"
        )
        f.done_at = time.time()
        f.note = f"{n} connections terminated"
        return f


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


async def _histories(temporal_address: str, store: Store, ids: list[str]) -> dict[str, list[CompletedStep]]:
    from temporalio.client import Client

    client = await Client.connect(temporal_address)
    async with store.session() as s:
        rows = (await s.execute(select(WorkItem.id, WorkItem.workflow_id).where(WorkItem.id.in_(ids)))).all()
    sem = asyncio.Semaphore(16)

    async def one(workflow_id: str) -> list[CompletedStep]:
        async with sem:
            return completed_steps(await client.get_workflow_handle(workflow_id).fetch_history())

    steps = await asyncio.gather(*(one(w) for _, w in rows))
    return {wid: st for (wid, _), st in zip(rows, steps, strict=True)}


async def analyse(url: str, temporal_address: str, ids: list[str], faults: list[Fault]) -> dict[str, Any]:
    store = Store(url)
    try:
        histories = await _histories(temporal_address, store, ids)
        report = await check_invariants(store, ids, check_git=True, histories=histories)
        async with store.session() as s:
            events = list((await s.scalars(select(Event).where(Event.work_item_id.in_(ids)))).all())
            rows = (await s.execute(select(WorkItem.id, WorkItem.state).where(WorkItem.id.in_(ids)))).all()
            dead_rows = (
                await s.execute(
                    select(WorkItem.id, WorkItem.reason).where(WorkItem.id.in_(ids), WorkItem.state == "dead")
                )
            ).all()
    finally:
        await store.close()
    states = Counter(st for _wid, st in rows)
    # Why each `dead` item died, with the tail of its events: `dead` is legitimate only when Temporal's bounded
    # infrastructure retries ran out, and the figures must say so item by item.
    by_item: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_item[e.work_item_id].append(e)
    dead_items = [
        {
            "id": wid,
            "reason": reason,
            "last_events": [
                f"{e.type} {json.dumps(e.data, default=str)[:200]}"
                for e in sorted(by_item[wid], key=lambda e: e.id)[-8:]
            ],
        }
        for wid, reason in dead_rows
    ]
    # Each activity attempt that writes starts with a fenced `state_changed` (running / validating) carrying its
    # work-item attempt number; accepted or refused, every execution leaves one write or one rejection.
    executions: dict[tuple[str, str, Any], int] = defaultdict(int)
    retried: set[str] = set()
    finished_at: list[float] = []
    landed: Counter[str] = Counter()
    stale = after_terminal = 0
    for e in events:
        if e.type == "write_after_terminal_rejected":
            after_terminal += 1
            retried.add(e.work_item_id)
        if e.type == "state_changed" and e.data.get("state") in ("running", "validating") and "attempt" in e.data:
            executions[(e.work_item_id, e.data["state"], e.data.get("attempt"))] += 1
        if e.type == "stale_write_rejected":
            stale += 1
            retried.add(e.work_item_id)
        if e.type == "landed":
            landed[e.work_item_id] += 1
        if e.type == "state_changed" and e.data.get("state") in TERMINAL:
            finished_at.append(float(e.created_at))
    duplicates = 0
    for (wid, _state, _n), count in executions.items():
        if count > 1:
            duplicates += count - 1
            retried.add(wid)
    finished_at.sort()
    recover: list[float | None] = []
    for f in faults:
        if not f.injected:
            continue
        after = [t for t in finished_at if t > f.at]
        recover.append(after[0] - f.at if after else None)
    return {
        "report": report,
        "states": dict(states),
        "items_retried": len(retried),
        "duplicates": duplicates,
        "stale": stale,
        "after_terminal": after_terminal,
        "double_landings": sum(1 for n in landed.values() if n > 1),
        "recover": recover,
        "dead_items": dead_items,
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
                out.extend(f"  event {e.id} {e.type} rank={e.rank} {e.data}" for e in evs)
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
    items: int,
    max_faults: int,
    fault_every_s: float = 4.0,
    chaos_deadline_s: float = 120.0,
    finish_timeout_s: float = 240.0,
    task_delay_s: float = 1.0,
    submit_spread_s: float = 30.0,
    pools: dict[str, int] | None = None,
    seed: int = 9,
    sandbox: str = "bwrap",
    log: Any = print,
) -> SoakResult:
    """The soak on its own PostgreSQL server and Temporal dev server (both restarted by the chaos)."""
    rng = random.Random(seed)
    control_dir = root / "chaos-control"
    control_dir.mkdir(parents=True)
    with private_postgres() as pg:
        stack = Stack(
            root / "stack",
            temporal_port=free_port(),
            ui_port=free_port(),
            api_port=free_port(),
            database_url=pg.url,
            pool_counts=pools or {"control": 2, "agent": 2, "validate": 2},
            ui=False,
            worker_argv=lambda pool: [sys.executable, "-m", "tests.soak.chaos_worker", str(control_dir), pool],
            extra_env={
                "CREWWORK_TASK_QUEUE_PREFIX": f"soak{uuid.uuid4().hex[:6]}",
                "CREWWORK_SANDBOX_BACKEND": sandbox,
                "CREWWORK_API_RATE_PER_S": "100000",
                "CREWWORK_API_RATE_BURST": "100000",
                "CREWWORK_TENANT_MAX_IN_FLIGHT": "100000",
                "CREWWORK_LOG_LEVEL": "WARNING",
                "CREWWORK_DB_POOL_SIZE": "4",
                "PYTHONPATH": str(REPO_ROOT),
            },
            on_event=lambda msg: log(f"stack: {msg}"),
        )
        started = time.monotonic()
        stack.start()
        try:
            log(f"submitting {items} work items over {submit_spread_s:.0f}s; chaos: up to {max_faults} faults")
            driver = ChaosDriver(stack, pg, control_dir, rng, max_faults, fault_every_s, log)
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
            finished = wait_terminal(pg.url, ids, finish_timeout_s)
            log(f"all terminal: {finished}")
            temporal = f"127.0.0.1:{stack.temporal_port}"
            a = asyncio.run(analyse(pg.url, temporal, ids, driver.faults))
            if not finished:
                a["stuck"] = asyncio.run(describe_stuck(stack, pg.url, ids))
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
        recover_s=[r for r in a["recover"] if r is not None],
        invariants=a["report"],
        wall_s=time.monotonic() - started,
        extra={
            "writes_after_terminal_rejected": a["after_terminal"],
            "double_landings": a["double_landings"],
            "recover_by_fault": a["recover"],
            "pool_restarts": {p.name: p.restarts_total for p in stack.processes},
            "stuck": a.get("stuck", []),
            "dead_items": a["dead_items"],
        },
    )
