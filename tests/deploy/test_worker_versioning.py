"""A deploy that never breaks an item in flight, on Temporal's Worker Versioning (crewwork/temporal/deployment.py).

Build b1 runs (one process with the three pools, CREWWORK_DEPLOYMENT_BUILD_ID=b1) and is made current; items start on
it: one waits for review, one is in the middle of a long agent attempt. Build b2 is deployed beside it (its own
process, a deliberately different WorkItemWorkflow: tests/deploy/build_b2.py, whose extra timer makes a b1 history
fail to replay) and made current. New items start on b2; b1's items run to their end on b1, each as it would have
(no `[b2]` commit, no nondeterminism), while b1's processes keep running. Then b2 is rolled back: b1 is current again,
a new item starts on b1, and b2's item still waiting for review ends on b2. The API's item view says which build each
item ran on, as Temporal reports it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from crewwork.cli.demo import RIGHT
from crewwork.cli.stack import ManagedProcess
from crewwork.config.operations import DeploymentSettings
from crewwork.models import ReviewDecision
from crewwork.temporal.deployment import _queues_route_to, describe_deployment, set_current_build
from crewwork.temporal.devserver import DevServer
from tests.conftest import make_settings, running_crew
from tests.deploy.procs import pool_env
from tests.integration.test_lifecycle import code_change

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

REPO_ROOT = Path(__file__).resolve().parents[2]
POOLS = "control,agent,validate"
REVIEW = {"required": True}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def start_build(env: dict[str, str], build: str, log_dir: Path, *, module: str = "crewwork") -> ManagedProcess:
    argv = [sys.executable, "-m", module, "worker", "--pool", POOLS]
    p = ManagedProcess(
        f"build-{build}", argv, {**env, "CREWWORK_DEPLOYMENT_BUILD_ID": build}, log_dir / f"build-{build}.log"
    )
    p.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = p.log_path.read_text(errors="replace") if p.log_path.exists() else ""
        if text.count("polling") >= 3:
            return p
        if not p.alive():
            raise RuntimeError(f"build {build} exited:\n{text}")
        time.sleep(0.1)
    raise RuntimeError(f"build {build} did not start polling")


async def promote(client: Any, name: str, build: str) -> None:
    """Make `build` current once Temporal has seen its workers poll every queue (it refuses before)."""
    # Generous: on a loaded 2-core machine the dev server took over a minute to apply a routing change.
    deadline = time.monotonic() + 300
    while True:
        try:
            await set_current_build(client, name, build, wait_s=max(30.0, deadline - time.monotonic()))
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_items_end_on_the_build_they_started_on_across_a_deploy_and_a_rollback(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, calc_repo: Path
) -> None:
    deployment = f"crewwork-{uuid.uuid4().hex[:6]}"
    settings = make_settings(
        tmp_path,
        temporal_server,
        pg_url,
        sandbox_backend=sandbox_backend,
        deployment=DeploymentSettings(name=deployment),
    )
    env = {
        **pool_env(settings),
        "CREWWORK_DEPLOYMENT_NAME": deployment,
        "CREWWORK_RETENTION_INTERVAL_S": "0",
        "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    procs: list[ManagedProcess] = []
    # The test's own process acts as the API: it starts workflows and reviews, and runs no pool (pools=()).
    async with running_crew(settings, pools=()) as crew:
        try:
            procs.append(start_build(env, "b1", tmp_path))
            await promote(crew.client, deployment, "b1")

            reviewed_b1 = await crew.submit(code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], review=REVIEW))
            running_b1 = await crew.submit(
                code_change(
                    calc_repo,
                    [{"files": {"calc.py": RIGHT}, "delay_s": 8}],
                    review={"required": False},
                    target_branch="slow",
                )
            )
            await crew.wait_state(reviewed_b1, "awaiting_review", 90)
            await crew.wait_state(running_b1, "running", 60)

            # Deploy b2 beside b1 and make it current while b1's items wait for review and run an attempt.
            procs.append(start_build(env, "b2", tmp_path, module="tests.deploy.build_b2"))
            await promote(crew.client, deployment, "b2")
            reviewed_b2 = await crew.submit(
                code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], review=REVIEW, target_branch="b2")
            )
            await crew.wait_state(reviewed_b2, "awaiting_review", 90)

            builds = {
                wid: await crew.service.build_of(await crew.store.get_work_item(wid))  # type: ignore[arg-type]
                for wid in (reviewed_b1, running_b1, reviewed_b2)
            }
            assert {w: (b.build_id, b.behavior) if b else None for w, b in builds.items()} == {
                reviewed_b1: ("b1", "pinned"),
                running_b1: ("b1", "pinned"),
                reviewed_b2: ("b2", "pinned"),
            }
            state = await describe_deployment(crew.client, deployment)
            assert state is not None and state.current == "b2"
            # What set_current_build falls back to when Temporal's update state stays IN_PROGRESS: each queue's word.
            assert await _queues_route_to(crew.client, deployment, "b2")
            assert not await _queues_route_to(crew.client, deployment, "b1")

            # b1's items end on b1, as they would have.
            row = await crew.store.get_work_item(reviewed_b1)
            await crew.service.review(row, ReviewDecision(action="approve"))  # type: ignore[arg-type]
            for wid in (reviewed_b1, running_b1):
                res = await crew.result(wid, 120)
                assert res.state == "succeeded", res.reason
                message = git(calc_repo, "log", "-1", "--format=%s", res.delivery_branch)
                assert not message.startswith("[b2]"), message

            # Roll back: b1 is current again. A new item starts on b1; b2's item still open ends on b2.
            await promote(crew.client, deployment, "b1")
            after_rollback = await crew.submit(
                code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], review=REVIEW, target_branch="rolled-back")
            )
            await crew.wait_state(after_rollback, "awaiting_review", 90)
            rb = await crew.service.build_of(await crew.store.get_work_item(after_rollback))  # type: ignore[arg-type]
            assert rb is not None and rb.build_id == "b1"
            for wid in (reviewed_b2, after_rollback):
                row = await crew.store.get_work_item(wid)
                await crew.service.review(row, ReviewDecision(action="approve"))  # type: ignore[arg-type]
            landed = {}
            for wid in (reviewed_b2, after_rollback):
                res = await crew.result(wid, 120)
                assert res.state == "succeeded", res.reason
                landed[wid] = git(calc_repo, "log", "-1", "--format=%s", res.delivery_branch)
            assert landed[reviewed_b2].startswith("[b2] ") and not landed[after_rollback].startswith("[b2]")

            for p in procs:
                log = p.log_path.read_text(errors="replace")
                assert "Nondeterminism" not in log and "nondeterminism" not in log, log[-3000:]
        finally:
            for p in procs:
                p.stop(grace_s=25)
