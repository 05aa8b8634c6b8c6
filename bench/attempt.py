"""A whole `code_change` attempt on a real repository through crewwork, against its own floor: the same work bare.

The repository is toolz 1.0.0 as bench/realrepo.py builds it (its sdist with a planted bug, served by `git daemon` on
loopback; a venv from /usr/bin/python3 with pytest installed by setup from a PEP 503 index on loopback). The change is
the upstream fix, written by the scripted agent. Two things are timed, alternating round by round (the order flips
every round) so both see the same machine noise:

- **crewwork**: one work item submitted to crewwork's pools (in this process, on a Temporal dev server and
  PostgreSQL): admit, workspace lease, `run_agent` (the attempt's fenced first write, a workspace materialised from
  the mirror, the scripted agent writing the fix in its isolated child process, the diff captured and saved, the
  fenced last write), `validate_change` (a fresh workspace from the mirror, the diff applied in the private git
  directory with protected paths put back, the runner-reach and weakening scans, the prepared environment mounted,
  the tests in a fresh bwrap sandbox with the witness, the log/report/witness saved, the report parsed and graded),
  record, land (push), finish, release, cleanup: submit to result. The mirror and the prepared environment are
  warm (one item before the rounds makes them).
- **floor**: the same work bare, with nothing else: `git worktree add` of the base commit from a local clone, the
  fix written into it, one run of the same test command in the same bwrap sandbox crewwork uses (same prepared
  venv mounted, same limits), the worktree removed.

The crewwork side is split into phases from two sources: the item's Temporal history (each activity's run time,
the time it waited to be started, and the workflow's own tasks), and timers around the building blocks the two
activities are made of (wrapped in this process for the run; the code is not changed). Printed as medians over the
rounds, next to the floor's phases and the ratios. The load average is recorded: on a loaded machine the figures
say where the time goes, not whether a target is met.

Then the landing's git work alone, side by side: as it is (the compare-and-swap push decides whether the delivery
branch exists) and with the `ls-remote` it used to make before the push, alternating (`--land-rounds`).

    .venv/bin/python bench/attempt.py [--rounds 7] [--no-witness-floor] [--land-rounds 21]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import bench_settings, dev_server, in_process_pools, machine, pg_database, table, write_results  # noqa: E402
from bench.realrepo import COMMAND, JUNIT, PYTHON  # noqa: E402
from bench.realrepo import prerequisites as realrepo_prerequisites  # noqa: E402

# ------------------------------------------------------------------------------------------------ phase timers


class Recorder:
    """Seconds spent per phase label in the current round (one item at a time, so no overlap between items)."""

    def __init__(self) -> None:
        self.cur: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)

    def add(self, key: str, dt: float) -> None:
        self.cur[key] += dt
        self.calls[key] += 1

    def take(self) -> dict[str, float]:
        out = dict(self.cur)
        out.update({f"_calls: {k}": float(n) for k, n in self.calls.items()})
        self.cur.clear()
        self.calls.clear()
        return out


REC = Recorder()


def _key(key: str | Callable[..., str], args: tuple[Any, ...]) -> str:
    return key(*args) if callable(key) else key


def time_async(owner: Any, name: str, key: str | Callable[..., str]) -> None:
    orig = getattr(owner, name)

    @functools.wraps(orig)
    async def wrapper(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return await orig(*a, **kw)
        finally:
            REC.add(_key(key, a), time.perf_counter() - t)

    setattr(owner, name, wrapper)


def time_sync(owner: Any, name: str, key: str | Callable[..., str]) -> None:
    orig = getattr(owner, name)

    @functools.wraps(orig)
    def wrapper(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return orig(*a, **kw)
        finally:
            REC.add(_key(key, a), time.perf_counter() - t)

    setattr(owner, name, wrapper)


def by_workspace(prefix: str) -> Callable[..., str]:
    def key(ws: Any, *_: Any) -> str:
        return f"{'validate' if ws.home.name.startswith('validate-') else 'agent'}: {prefix}"

    return key


def instrument() -> None:
    """Timers around the building blocks of run_agent and validate_change (module globals they call through)."""
    import crewwork.steps.agent.activity as agent
    import crewwork.steps.validate.activity as validate
    from crewwork.sandbox.bwrap import BwrapSandbox
    from crewwork.steps.attempt import AttemptWriter
    from crewwork.steps.validate.witnessing import WitnessRun
    from crewwork.workspace.tree import Workspace

    time_async(agent, "hold_mirror", "agent: mirror check")
    time_async(agent, "make_workspace", "agent: workspace from the mirror (materialised)")
    time_async(agent, "run", "agent: scripted agent writes the fix (isolated child)")
    time_async(agent, "capture", "agent: diff capture + save")
    time_async(validate, "hold_mirror", "validate: mirror check")
    time_async(validate, "make_workspace", "validate: workspace from the mirror (private git dir)")
    time_async(validate, "artifact_bytes", "validate: read the diff artifact")
    time_async(validate.Validation, "apply", "validate: apply + protection + reach/weakening scans + write")
    time_async(validate.Validation, "prepare_environment", "validate: prepared env (cache hit) + update to change")
    time_async(validate.Validation, "run_tests", "validate: run_tests (all)")
    time_async(validate, "save", "validate: evidence saves (log, report, witness)")
    time_sync(WitnessRun, "prepare", "validate: witness prepare")
    time_sync(validate, "read_streams", "validate: witness streams read")
    time_sync(validate.Validation, "judge", "validate: report parsing + grading")
    time_async(BwrapSandbox, "run", "sandbox run: tests (start + suite)")
    time_async(Workspace, "remove", by_workspace("workspace removal"))
    import crewwork.workspace.tree as tree
    from crewwork.workspace.gitops import PrivateGit

    time_async(tree, "claim", "workspace detail: claim the home's lock")
    time_async(PrivateGit, "create", "workspace detail: private git dir")
    time_async(PrivateGit, "ls_tree", "workspace detail: git ls-tree")
    time_async(Workspace, "write_entries", by_workspace("detail: write tree entries"))
    import crewwork.sandbox.disk as disk

    time_async(tree, "unmount_all_under", "workspace detail: removal's unmount (disk cap image)")
    time_async(disk.WorkspaceDisk, "create", "workspace detail: disk cap image (make + mount)")
    time_sync(tree.safefs, "delete_tree", "workspace detail: removal's delete_tree")
    import crewwork.steps.land.activity as land
    from crewwork.repos.worker import Repositories

    time_async(Repositories, "land", "land: commit in the private index + push by compare-and-swap (git)")
    time_async(land, "_note_unsigned", "land: evidence note (unsigned: no key configured)")
    time_async(land, "_publish_evidence", "land: evidence signed and pushed as a note")
    time_async(land, "_record_landed", "land: `landed` recorded")
    time_async(AttemptWriter, "set_state", "fenced state writes (set_state)")
    time_async(AttemptWriter, "event", "fenced event writes (event)")


# ------------------------------------------------------------------------------------------------ history


def history_phases(events: list[Any]) -> dict[str, float]:
    """From an item's Temporal history (server clock): each activity type's run (started -> completed) and wait
    (scheduled -> started), the workflow tasks' time, the local activities counted, and the whole workflow."""
    from temporalio.api.enums.v1 import EventType

    out: dict[str, float] = collections.defaultdict(float)
    sched: dict[int, tuple[str, float]] = {}
    started: dict[int, float] = {}
    wft_started: dict[int, float] = {}
    wft_scheduled: dict[int, float] = {}
    first = events[0].event_time.ToDatetime().timestamp()
    last = first
    for e in events:
        t = e.event_time.ToDatetime().timestamp()
        last = t
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            sched[e.event_id] = (e.activity_task_scheduled_event_attributes.activity_type.name, t)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            sid = e.activity_task_started_event_attributes.scheduled_event_id
            name, ts = sched[sid]
            started[sid] = t
            out[f"activity wait: {name}"] += t - ts
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sid = e.activity_task_completed_event_attributes.scheduled_event_id
            name, _ = sched[sid]
            out[f"activity run: {name}"] += t - started[sid]
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            wft_scheduled[e.event_id] = t
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            sid = e.workflow_task_started_event_attributes.scheduled_event_id
            wft_started[sid] = t
            out["workflow task waits (scheduled -> started)"] += t - wft_scheduled.get(sid, t)
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            sid = e.workflow_task_completed_event_attributes.scheduled_event_id
            out["workflow tasks (incl. local activities)"] += t - wft_started.get(sid, t)
            out["_workflow_tasks"] += 1
        elif e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            out["_local_activities"] += 1
    out["workflow: start -> completed"] = last - first
    out["_history_events"] = len(events)
    return dict(out)


# ------------------------------------------------------------------------------------------------ the landing


async def landing_side_by_side(rounds: int, tmp: Path, url: str, base: str, diff: str, settings: Any) -> dict[str, Any]:
    """The landing's git work as it is (the compare-and-swap push decides whether the delivery branch exists) against
    the same landing preceded by the `ls-remote` it used to make first (until 2026-12-07), alternating, each on a
    fresh delivery branch of the same served repository."""
    from crewwork.models import TenantRef
    from crewwork.repos.landing import delivery_branch, land_by_push
    from crewwork.repos.worker import Repositories

    repos = Repositories(settings.model_copy(update={"data_dir": tmp / "land-data"}))
    remote = repos.remote(repos.locate(url), TenantRef(id="tn_land", name="land"))
    await repos.mirrors.ensure(remote, base)
    counter = iter(range(10**6))

    async def land(ls_remote_first: bool) -> float:
        wid = f"wi_land_{next(counter)}"
        t = time.perf_counter()
        if ls_remote_first:
            await remote.ls_remote(f"refs/heads/{delivery_branch(wid)}")
        landed = await land_by_push(
            repos.mirrors, remote, work_item_id=wid, base_commit=base, diff=diff, message="fix", scratch=tmp / wid
        )
        if not landed.created:
            raise SystemExit(f"landing {wid} did not create its branch")
        return time.perf_counter() - t

    await land(False)
    now: list[float] = []
    before: list[float] = []
    for i in range(rounds):
        if i % 2:
            now.append(await land(False))
            before.append(await land(True))
        else:
            before.append(await land(True))
            now.append(await land(False))
    return {
        "rounds": rounds,
        "ls_remote_first_s": before,
        "push_decides_s": now,
        "median_ls_remote_first_s": statistics.median(before),
        "median_push_decides_s": statistics.median(now),
        "paired_ratio": statistics.median(a / b for a, b in zip(now, before, strict=True)),
    }


# ------------------------------------------------------------------------------------------------ the run


def prerequisites() -> list[str]:
    problems = realrepo_prerequisites()
    r = subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qAtc", "select 1"], capture_output=True)
    if r.returncode != 0:
        problems.append("PostgreSQL on 127.0.0.1:5432 (user postgres) does not answer: " + r.stderr.decode()[-200:])
    from crewwork.temporal.devserver import DevServer

    with contextlib.suppress(AttributeError):
        ok, why = DevServer.available()  # type: ignore[attr-defined]
        if not ok:
            problems.append(f"Temporal dev server: {why}")
    return problems


async def run(rounds: int, with_witness: bool, land_rounds: int) -> dict[str, Any]:
    from crewwork.admission.starts import workflow_result
    from crewwork.models import EnvironmentSpec, TenantRef, WorkItemResult, WorkItemSpec
    from crewwork.sandbox.backends import get_sandbox
    from crewwork.sandbox.base import SandboxLimits
    from crewwork.sandbox.envplan import CacheOwner
    from crewwork.sandbox.prepare import PreparedEnvCache
    from crewwork.steps.validate.setup import setup_plan
    from crewwork.steps.validate.witnessing import WitnessRun
    from tests.repos.pkgindex import TOOLZ, PackageIndex, toolz_repo
    from tests.repos.servers import GitDaemon, bare_from, git

    tmp = Path(tempfile.mkdtemp(prefix="crewwork-attempt-"))
    try:
        work, upstream = toolz_repo(tmp / "toolz")
        bare_from(work, tmp / "served" / "oss" / "toolz.git")
        base = git(work, "rev-parse", "HEAD")
        fixed = tmp / "fixed"
        shutil.copytree(work, fixed, symlinks=True)
        (fixed / "toolz" / "itertoolz.py").write_text(upstream)
        diff = subprocess.run(["git", "diff", "--binary"], cwd=fixed, capture_output=True, text=True, check=True).stdout
        with (
            PackageIndex(tmp / "index") as index,
            GitDaemon(tmp / "served", tmp / "daemon.log") as daemon,
            pg_database("crewwork_bench_attempt") as (db_url, _),
            dev_server(tmp / "temporal") as temporal,
        ):
            url = daemon.url("oss/toolz.git")
            settings = bench_settings(
                tmp / "data", temporal, db_url, sandbox_backend="bwrap", setup_network_allowlist=index.hostport
            )
            env = {
                "python": PYTHON,
                "setup": [
                    [
                        "python",
                        "-m",
                        "pip",
                        "install",
                        "--no-cache-dir",
                        "-q",
                        "--index-url",
                        index.url,
                        "pytest==8.3.5",
                    ]
                ],
                "network": True,
            }
            spec = WorkItemSpec.model_validate(
                {
                    "kind": "code_change",
                    "repo": {"url": url, "ref": "main"},
                    "instruction": "fix frequencies",
                    "validation": {"command": COMMAND, "junit_path": JUNIT, "timeout_s": 300},
                    "environment": env,
                    "agent": {"name": "scripted", "config": {"files": {"toolz/itertoolz.py": upstream}}},
                    "budget": {"max_attempts": 1},
                    "review": {"required": False},
                }
            )

            # The floor: a local clone (made once, as crewwork's mirror is), its own prepared venv (made once, as
            # crewwork's is), then per round worktree + fix + one bwrap run + worktree removal.
            clone = tmp / "floor-clone"
            git(tmp, "clone", "--quiet", "--no-local", str(work), str(clone))
            sandbox = get_sandbox("bwrap")
            limits = SandboxLimits(timeout_s=300)
            envspec = EnvironmentSpec.model_validate(env)
            seed = tmp / "floor-seed"
            git(clone, "worktree", "add", "--quiet", "--detach", str(seed), base)
            prepared = await PreparedEnvCache(tmp / "floor-prepared").get_or_prepare(
                owner=CacheOwner(tenant_id="tn_floor", repository="rp_floor"),
                sandbox=sandbox, repo=url, base_commit=base, setup=envspec.setup, source=seed, limits=limits,
                plan=setup_plan(envspec, settings, TenantRef(id="tn_floor", name="floor")),
            )  # fmt: skip
            git(clone, "worktree", "remove", "--force", str(seed))
            counter = iter(range(10**6))

            async def floor(witness: bool = False) -> dict[str, float]:
                ws = tmp / "floor" / f"w{next(counter)}"
                p: dict[str, float] = {}
                t0 = t = time.perf_counter()
                await asyncio.to_thread(git, clone, "worktree", "add", "--quiet", "--detach", str(ws), base)
                p["workspace: git worktree add"] = time.perf_counter() - t
                t = time.perf_counter()
                (ws / "toolz" / "itertoolz.py").write_text(upstream)
                (ws / ".crewwork").mkdir()
                p["apply the fix (write the file)"] = time.perf_counter() - t
                t = time.perf_counter()
                run_env, run_mounts = prepared.env(), list(prepared.mounts())
                if witness:  # the same run carrying crewwork's outcome witness (its plugin, mount and env)
                    w = WitnessRun.prepare(sandbox, tmp / "floor-data", ws, run_env)
                    run_env, run_mounts = {**run_env, **w.env}, [*run_mounts, w.mount]
                r = await sandbox.run(COMMAND, workspace=ws, limits=limits, env=run_env, mounts=run_mounts)
                p["sandbox run: tests (start + suite)"] = time.perf_counter() - t
                if r.exit_code != 0 or not (ws / JUNIT).is_file():
                    raise SystemExit(f"floor run failed ({r.exit_code}): {r.stdout[-500:]!r} {r.stderr[-500:]!r}")
                t = time.perf_counter()
                await asyncio.to_thread(git, clone, "worktree", "remove", "--force", str(ws))
                p["workspace removal"] = time.perf_counter() - t
                p["total"] = time.perf_counter() - t0
                return p

            instrument()
            async with in_process_pools(settings) as (service, _store, tenant):
                client = service.client
                assert client is not None

                async def crew() -> dict[str, float]:
                    REC.take()
                    t0 = time.perf_counter()
                    sub = await service.submit(tenant, spec)
                    res = await workflow_result(client, sub.row.workflow_id, WorkItemResult)
                    total = time.perf_counter() - t0
                    if res.state.value != "succeeded":
                        raise SystemExit(f"crewwork item ended {res.state.value}: {res.model_dump_json()[:800]}")
                    p = REC.take()
                    events = list((await client.get_workflow_handle(sub.row.workflow_id).fetch_history()).events)
                    p.update(history_phases(events))
                    p["total: submit -> result"] = total
                    return p

                first = await crew()  # cold mirror and environment
                await floor()  # the floor's page cache the same way
                crew_rounds: list[dict[str, float]] = []
                floor_rounds: list[dict[str, float]] = []
                witness_rounds: list[dict[str, float]] = []
                loads = []
                for i in range(rounds):
                    loads.append(os.getloadavg()[0])
                    if i % 2 == 0:
                        floor_rounds.append(await floor())
                        crew_rounds.append(await crew())
                        if with_witness:
                            witness_rounds.append(await floor(witness=True))
                    else:
                        if with_witness:
                            witness_rounds.append(await floor(witness=True))
                        crew_rounds.append(await crew())
                        floor_rounds.append(await floor())
                    print(
                        f"round {i + 1}: crewwork {crew_rounds[-1]['total: submit -> result']:.2f} s, "
                        f"floor {floor_rounds[-1]['total']:.2f} s, load {loads[-1]:.2f}",
                        flush=True,
                    )
                landing = await landing_side_by_side(land_rounds, tmp, url, base, diff, settings) if land_rounds else {}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def med(rows: list[dict[str, float]]) -> dict[str, float]:
        keys = {k for r in rows for k in r}
        return {k: statistics.median(r.get(k, 0.0) for r in rows) for k in sorted(keys)}

    return {
        "repository": TOOLZ,
        "command": " ".join(COMMAND),
        "rounds": rounds,
        "first_item_cold_s": first["total: submit -> result"],
        "crewwork": crew_rounds,
        "floor": floor_rounds,
        "floor_with_witness": witness_rounds,
        "median": {
            "crewwork": med(crew_rounds),
            "floor": med(floor_rounds),
            "floor_with_witness": med(witness_rounds) if witness_rounds else {},
        },
        "paired_total_ratio": statistics.median(
            c["total: submit -> result"] / f["total"] for c, f in zip(crew_rounds, floor_rounds, strict=True)
        ),
        "loadavg_1m_per_round": loads,
        "landing_side_by_side": landing,
    }


Row = tuple[str, Callable[[dict[str, float]], float], Callable[[dict[str, float]], float] | None]


def _g(*keys: str) -> Callable[[dict[str, float]], float]:
    return lambda r: sum(r.get(k, 0.0) for k in keys)


def _minus(
    a: Callable[[dict[str, float]], float], b: Callable[[dict[str, float]], float]
) -> Callable[[dict[str, float]], float]:
    return lambda r: a(r) - b(r)


AGENT_WS = _g("agent: mirror check", "agent: workspace from the mirror (materialised)")
VAL_WS = _g("validate: mirror check", "validate: workspace from the mirror (private git dir)")
REMOVAL = _g("agent: workspace removal", "validate: workspace removal")
AGENT_FIX = _g("agent: scripted agent writes the fix (isolated child)")
CAPTURE = _g("agent: diff capture + save")
RUN = _g("sandbox run: tests (start + suite)")
APPLY = _g("validate: read the diff artifact", "validate: apply + protection + reach/weakening scans + write")
ENV = _g("validate: prepared env (cache hit) + update to change")
JUDGE = _g("validate: report parsing + grading")
FLOOR_RUN = _g("sandbox run: tests (start + suite)")
FLOOR_AROUND = _minus(_g("total"), _g("sandbox run: tests (start + suite)", "apply the fix (write the file)"))

ROWS: list[Row] = [
    ("workspace: the agent's (mirror check + materialised)", AGENT_WS, _g("workspace: git worktree add")),
    ("workspace: the validation's (mirror check + private git dir)", VAL_WS, None),
    ("  of them: disk cap images made + mounted (both)", _g("workspace detail: disk cap image (make + mount)"), None),
    ("workspace removal (both)", REMOVAL, _g("workspace removal")),
    ("  of it: disk cap images unmounted (both)", _g("workspace detail: removal's unmount (disk cap image)"), None),
    ("agent writes the fix (isolated child) / the fix written", AGENT_FIX, _g("apply the fix (write the file)")),
    ("diff capture + save", CAPTURE, None),
    ("validate: read diff, apply, protection, reach/weakening scans, write", APPLY, None),
    ("validate: prepared env (cache hit) + update to the change", ENV, None),
    ("sandbox run of the tests (start + suite)", RUN, FLOOR_RUN),
    (
        "validate: run_tests besides the run (witness, saves, report read)",
        _minus(_g("validate: run_tests (all)"), RUN),
        None,
    ),
    ("  of it: evidence saves (log, report, witness)", _g("validate: evidence saves (log, report, witness)"), None),
    ("validate: report parsing + grading", JUDGE, None),
    (
        "fenced writes (set_state + event), every step",
        _g("fenced state writes (set_state)", "fenced event writes (event)"),
        None,
    ),
    (
        "run_agent besides the above (fenced writes, watch, result)",
        _minus(
            _g("activity run: run_agent"),
            lambda r: AGENT_WS(r) + _g("agent: workspace removal")(r) + AGENT_FIX(r) + CAPTURE(r),
        ),
        None,
    ),
    (
        "validate_change besides the above (fenced writes, watch, result)",
        _minus(
            _g("activity run: validate_change"),
            lambda r: (
                VAL_WS(r)
                + _g("validate: workspace removal")(r)
                + APPLY(r)
                + ENV(r)
                + _g("validate: run_tests (all)")(r)
                + JUDGE(r)
            ),
        ),
        None,
    ),
    ("activity run: run_agent", _g("activity run: run_agent"), None),
    ("activity run: validate_change", _g("activity run: validate_change"), None),
    ("activity run: land_change (evidence signed, push by compare-and-swap)", _g("activity run: land_change"), None),
    (
        "  of it: commit + push by compare-and-swap (git over git://)",
        _g("land: commit in the private index + push by compare-and-swap (git)"),
        None,
    ),
    (
        "activity waits (scheduled -> started), all",
        _g("activity wait: run_agent", "activity wait: validate_change", "activity wait: land_change"),
        None,
    ),
    (
        "workflow tasks (incl. 5 local activities: admit, lease, record, finish, release)",
        _g("workflow tasks (incl. local activities)"),
        None,
    ),
    ("workflow task waits (scheduled -> started)", _g("workflow task waits (scheduled -> started)"), None),
    (
        "submit -> workflow start (API call, admission)",
        _minus(_g("total: submit -> result"), _g("workflow: start -> completed")),
        None,
    ),
    ("TOTAL: submit -> result / the floor's total", _g("total: submit -> result"), _g("total")),
    (
        "platform time around the agent and the tests",
        _minus(_g("total: submit -> result"), lambda r: RUN(r) + AGENT_FIX(r)),
        FLOOR_AROUND,
    ),
]


def report(result: dict[str, Any]) -> None:
    crew, floor = result["crewwork"], result["floor"]
    rows: list[list[Any]] = []
    for name, cf, ff in ROWS:
        c = statistics.median(cf(r) for r in crew)
        if ff is None:
            rows.append([name, c, "-", "-", "-"])
            continue
        f = statistics.median(ff(r) for r in floor)
        paired = statistics.median(cf(a) / ff(b) if ff(b) else float("inf") for a, b in zip(crew, floor, strict=True))
        rows.append([name, c, f, c / f if f else "-", paired])
    fw = result["floor_with_witness"]
    if fw:
        w = statistics.median(FLOOR_RUN(r) for r in fw)
        f = statistics.median(FLOOR_RUN(r) for r in floor)
        paired = statistics.median(FLOOR_RUN(a) / FLOOR_RUN(b) for a, b in zip(fw, floor, strict=True))
        rows.append(["the floor's run carrying the outcome witness, vs the floor's run", w, f, w / f, paired])
    m = result["median"]["crewwork"]
    print(f"\n{result['repository']}: `{result['command']}`, {result['rounds']} alternating rounds, medians\n")
    print(table(["phase", "crewwork s", "floor s", "x floor (medians)", "x floor (paired)"], rows))
    print(
        f"\nhistory: {m.get('_history_events', 0):.0f} events, {m.get('_workflow_tasks', 0):.0f} workflow tasks, "
        f"{m.get('_local_activities', 0):.0f} local activities; first (cold) item {result['first_item_cold_s']:.2f} s"
    )
    result["table"] = rows
    land = result.get("landing_side_by_side")
    if land:
        print(
            f"\nlanding's git work, {land['rounds']} alternating rounds: with the ls-remote first (before) "
            f"{land['median_ls_remote_first_s']:.3f} s, the push deciding (now) {land['median_push_decides_s']:.3f} s, "
            f"paired now/before {land['paired_ratio']:.3f}"
        )
    print("\nevery timer (crewwork medians; a timer inside another is counted in both):\n")
    print(table(["timer", "s"], [[k, v] for k, v in m.items() if not k.startswith("_")]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7, help="alternating crewwork/floor pairs")
    ap.add_argument(
        "--no-witness-floor",
        action="store_true",
        help="skip the third run per round (the floor's sandbox run carrying crewwork's outcome witness)",
    )
    ap.add_argument(
        "--land-rounds",
        type=int,
        default=21,
        help="alternating landings with and without the ls-remote the landing used to make first (0: none)",
    )
    args = ap.parse_args()
    problems = prerequisites()
    if problems:
        print("bench/attempt.py cannot run here:\n  " + "\n  ".join(problems), file=sys.stderr)
        raise SystemExit(2)
    load_before = os.getloadavg()
    result = asyncio.run(run(args.rounds, not args.no_witness_floor, args.land_rounds))
    result["loadavg_at_start"] = load_before
    result["loadavg_at_end"] = os.getloadavg()
    report(result)
    print(
        f"\nload average: {load_before} at start, {result['loadavg_at_end']} at end; {machine()['cpus']} cores"
        + (
            " — LOADED machine: ratios only, no target claimed"
            if max(load_before[0], result["loadavg_at_end"][0]) > 1
            else ""
        )
    )
    write_results("attempt", result)


if __name__ == "__main__":
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    main()
