"""Upgrading the store with items in flight: the previous release (the code as it was just before the newest
migration was added, taken from git) runs the API and the pools on its own migration head; items start there (one
waits for review, one runs a long agent attempt); `crewwork db upgrade` of this release migrates the store under them
(the previous release's processes keep running on the new schema: migrations only expand); then the processes are
rolled to this release (the API last: the previous release's API serves on the new schema meanwhile), and every
item ends as it would have, on the new code, with its diff and evidence readable.

Real processes, real PostgreSQL, real Temporal; the previous release is run from a `git archive` of its commit with
this virtualenv's packages (its imports win over this checkout's editable install: `OLD_BOOT`)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from crewwork.cli.demo import RIGHT
from crewwork.cli.stack import ManagedProcess
from crewwork.store.db import current_revision
from crewwork.temporal.devserver import DevServer, free_port
from tests.conftest import PG_ADMIN, _psql, run_sync
from tests.deploy.test_migrate_step import head_revision
from tests.integration.test_lifecycle import VALIDATION

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

REPO_ROOT = Path(__file__).resolve().parents[2]
OLD_BOOT = (
    "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
    # As `python -m crewwork`, which every release has (its CLI's module moved).
    "sys.path.insert(0, {old!r}); import runpy; runpy.run_module('crewwork', run_name='__main__', alter_sys=True)"
)


def git(*args: str, cwd: Path = REPO_ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def previous_release(dest: Path) -> tuple[Path, str]:
    """The code from just before the commit of main that added the newest migration (HEAD when it is not committed
    yet), and that code's migration head (an ancestor of ours)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from crewwork.store.db import alembic_config

    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    head = script.get_revision(head_revision())
    assert head is not None and isinstance(head.down_revision, str)
    path = Path(head.path).resolve().relative_to(REPO_ROOT)
    # Along main's first parents, with each merge's diff against main before it: a migration that came in with a
    # merge was added by that merge, and the release before it is main just before the merge.
    added = git("log", "--first-parent", "-m", "--diff-filter=A", "--format=%H", "--", str(path))
    rev = f"{added.splitlines()[-1]}^" if added else "HEAD"
    archive = dest.with_suffix(".tar")
    with archive.open("wb") as f:
        subprocess.run(["git", "archive", rev, "crewwork"], cwd=REPO_ROOT, check=True, stdout=f)
    with tarfile.open(archive) as t:
        t.extractall(dest, filter="data")
    assert not (dest / "crewwork" / "store" / "migrations" / "versions" / path.name).exists()
    # Its own head: the migration before ours when that migration landed alone, an older one when several landed in
    # one commit (then this release's upgrade runs them all, as it would for a user of that release).
    cfg = Config()
    cfg.set_main_option("script_location", str(dest / "crewwork" / "store" / "migrations"))
    old_head = ScriptDirectory.from_config(cfg).get_current_head()
    assert old_head is not None and old_head in {r.revision for r in script.iterate_revisions(head.revision, "base")}
    return dest, old_head


@pytest.fixture
def fresh_pg() -> Iterator[str]:
    name = f"crewwork_upgrade_{uuid.uuid4().hex[:8]}"
    _psql(f"CREATE DATABASE {name}")
    yield f"{PG_ADMIN}/{name}"
    _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def run(argv: list[str], env: dict[str, str]) -> str:
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def started(p: ManagedProcess, marker: str, count: int = 1) -> ManagedProcess:
    """`p` started, once its log holds `marker` `count` times, or, for a URL, once that answers 200."""
    p.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        text = p.log_path.read_text(errors="replace") if p.log_path.exists() else ""
        if marker.startswith("http"):
            try:
                if httpx.get(marker, timeout=1).status_code == 200:
                    return p
            except httpx.HTTPError:
                pass
        elif text.count(marker) >= count:
            return p
        if not p.alive():
            raise RuntimeError(f"{p.name} exited:\n{text}")
        time.sleep(0.1)
    raise RuntimeError(f"{p.name} did not start:\n{p.log_path.read_text(errors='replace')}")


async def wait_state(c: httpx.AsyncClient, wid: str, states: set[str], timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    body: dict = {}
    while time.monotonic() < deadline:
        body = (await c.get(f"/v1/work-items/{wid}", params={"live": "false"})).json()
        if body.get("state") in states:
            return body
        await asyncio.sleep(0.2)
    raise AssertionError(f"{wid} never reached {states}: {body.get('state')}")


async def test_items_in_flight_survive_a_store_upgrade_and_a_roll_to_the_new_release(
    tmp_path: Path, temporal_server: DevServer, fresh_pg: str, sandbox_backend: str, calc_repo: Path
) -> None:
    old_dir, old_head = previous_release(tmp_path / "previous")
    old = [sys.executable, "-c", OLD_BOOT.format(old=str(old_dir))]
    new = [sys.executable, "-m", "crewwork"]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    env.update(
        CREWWORK_DATA_DIR=str(tmp_path / "data"),
        CREWWORK_DATABASE_URL=fresh_pg,
        CREWWORK_TEMPORAL_ADDRESS=temporal_server.address,
        CREWWORK_TASK_QUEUE_PREFIX=f"up{uuid.uuid4().hex[:6]}",
        CREWWORK_SANDBOX_BACKEND=sandbox_backend,
        CREWWORK_AUTO_REGISTER_REPOS="true",
        CREWWORK_AGENT_ISOLATION="inline",  # no child interpreter, which would import this checkout's code
        CREWWORK_RECONCILE_INTERVAL_S="0",
        CREWWORK_API_PORT=str(port),
        CREWWORK_LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    run([*old, "db", "upgrade"], env)
    assert run_sync(current_revision(fresh_pg)) == old_head
    key = json.loads(run([*old, "--json", "keys", "create", "--tenant", "upgrader"], env))["key"]

    procs: list[ManagedProcess] = []

    def proc(name: str, argv: list[str], marker: str, count: int = 1) -> ManagedProcess:
        p = started(ManagedProcess(name, argv, env, tmp_path / f"{name}.log"), marker, count)
        procs.append(p)
        return p

    def item(delay_s: float, review: bool, branch: str) -> dict:
        return {
            "kind": "code_change",
            "repo": {"url": str(calc_repo), "ref": "main"},
            "target_branch": branch,
            "instruction": "Fix add() so the tests pass",
            "validation": VALIDATION,
            "agent": {"name": "scripted", "config": {"attempts": [{"files": {"calc.py": RIGHT}, "delay_s": delay_s}]}},
            "review": {"required": review},
        }

    try:
        health = f"http://127.0.0.1:{port}/healthz"
        proc("old-api", [*old, "api"], health)
        old_pools = proc("old-pools", [*old, "worker", "--pool", "control,agent,validate"], "polling", 3)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as c:
            running = (await c.post("/v1/work-items", json=item(12, False, "running"))).json()["id"]
            reviewed = (await c.post("/v1/work-items", json=item(0, True, "reviewed"))).json()["id"]
            await wait_state(c, running, {"running"})
            await wait_state(c, reviewed, {"awaiting_review"})
            # Still in flight when the store is upgraded under it (its agent takes 12 s).
            assert (await c.get(f"/v1/work-items/{running}", params={"live": "false"})).json()["state"] in {
                "running",
                "validating",
            }

            # This release's migration, under the previous release's running processes.
            run([*new, "db", "upgrade"], env)
            assert run_sync(current_revision(fresh_pg)) == head_revision()

            # Roll the pools (docs/operations.md, "Upgrades": the API goes last, so the previous release's API
            # serves on the new schema meanwhile): this release's come up, the previous release's drain (SIGTERM).
            proc("new-pools", [*new, "worker", "--pool", "control,agent,validate"], "polling", 3)
            old_pools.stop(grace_s=30)

            r = await c.post(f"/v1/work-items/{reviewed}/review", json={"action": "approve"})
            assert r.status_code == 200, r.text
            fresh = (await c.post("/v1/work-items", json=item(0, False, "fresh"))).json()["id"]
            for wid in (reviewed, running, fresh):
                done = await wait_state(c, wid, {"succeeded", "failed", "dead", "cancelled", "rejected"})
                assert done["state"] == "succeeded", done["reason"]
                assert done["delivery_branch"] == f"crewwork/{wid}"
                d = await c.get(f"/v1/work-items/{wid}/diff")
                assert d.status_code == 200 and "calc.py" in d.text
                evidence = (await c.get(f"/v1/work-items/{wid}/evidence")).json()
                assert [e["verdict"] for e in evidence] == ["passed"]
            for p in procs:
                text = p.log_path.read_text(errors="replace")
                assert "Traceback" not in text and "Nondeterminism" not in text, f"{p.name}:\n{text[-3000:]}"
    finally:
        for p in procs:
            p.stop(grace_s=10)
