"""Observability: a real worker pool process serves crewwork metrics and the Temporal SDK's runtime metrics on the
ports given by the environment and writes JSON logs; activity log lines carry the work item and workflow ids."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from crewwork.config import Settings
from crewwork.observability.logs import ContextFilter, JsonFormatter, log_context
from crewwork.temporal.devserver import DevServer, free_port
from tests.api.conftest import Stack, task_item, wait_state

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


def test_json_log_lines_carry_the_work_item_context() -> None:
    records: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Capture()
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("crewwork.test.jsonlog")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("outside")
        with log_context(workflow_id="work-item-wi_abc"):
            logger.info("inside %s", "x", extra={"attempt": 2})
    finally:
        logger.removeHandler(handler)
    outside, inside = (json.loads(r) for r in records)
    assert outside["work_item_id"] is None and outside["msg"] == "outside"
    assert inside["workflow_id"] == "work-item-wi_abc" and inside["work_item_id"] == "wi_abc"
    assert inside["msg"] == "inside x" and inside["attempt"] == 2 and inside["level"] == "info"


async def test_activity_log_lines_name_their_work_item_and_workflow(stack: Stack) -> None:
    lines: list[dict[str, object]] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(self.format(record)))

    handler = Capture(level=logging.DEBUG)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("crewwork.activity")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        async with stack.client() as c:
            wid = (await c.post("/v1/work-items", json=task_item())).json()["id"]
            await wait_state(c, wid, {"succeeded"})
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    mine = [ln for ln in lines if ln["work_item_id"] == wid]
    assert mine, lines[:3]
    assert all(ln["workflow_id"] == f"work-item-{wid}" for ln in mine)
    activities = {ln.get("activity") for ln in mine}
    # Admitted in the submission's request (crewwork/admission/starts.py): its workflow runs no admit step.
    assert {"run_agent", "finish"} <= activities and "admit" not in activities, activities


async def test_pool_process_serves_crewwork_and_temporal_sdk_metrics_and_logs_json(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, api_settings: Settings
) -> None:
    prefix = f"m{uuid.uuid4().hex[:8]}"
    port, sdk_port = free_port(), free_port()
    env = {
        **os.environ,
        "CREWWORK_DATABASE_URL": pg_url,
        "CREWWORK_TEMPORAL_ADDRESS": temporal_server.address,
        "CREWWORK_TASK_QUEUE_PREFIX": prefix,
        "CREWWORK_DATA_DIR": str(tmp_path),
        "CREWWORK_METRICS_PORT": str(port),
        "CREWWORK_TEMPORAL_METRICS_PORT": str(sdk_port),
        "CREWWORK_LOG_FORMAT": "json",
    }
    log_path = tmp_path / "control.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "crewwork", "worker", "--pool", "control"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
    try:
        body = ""
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(timeout=5) as http:
            while time.monotonic() < deadline:
                try:
                    body = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                    sdk = (await http.get(f"http://127.0.0.1:{sdk_port}/metrics")).text
                    break
                except httpx.HTTPError:
                    await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"pool metrics never came up: {log_path.read_text()[-2000:]}")
        assert f'crewwork_pool_info{{pool="control",task_queue="{prefix}-control"}} 1' in body
        assert "crewwork_activity_duration_seconds" in body
        # prometheus-client's process collector comes free; the store's projections are the API's, not a pool's.
        assert "process_cpu_seconds_total" in body and "crewwork_work_items" not in body
        assert "temporal_" in sdk, sdk[:500]
        # The metrics endpoint answers from the process's start; its first log lines come once it has connected.
        while time.monotonic() < deadline and "polling task queue" not in log_path.read_text():
            await asyncio.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(30)
    json_lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    assert json_lines, log_path.read_text()[-2000:]
    assert all({"ts", "level", "logger", "msg", "work_item_id", "workflow_id"} <= set(j) for j in json_lines)
