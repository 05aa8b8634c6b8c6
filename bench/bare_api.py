"""The floor of a submission route, for bench/api_cost.py: a bare FastAPI app whose one route does what a crewwork
submission must do at the least: parse and validate the JSON body, insert the work item row and its `submitted`
event (crewwork's own tables, one statement, asyncpg without an ORM), and start its workflow. No authentication,
rate limit, policy, idempotency or admission.

    python bench/bare_api.py PORT POSTGRES_DSN TEMPORAL_ADDRESS TASK_QUEUE [AGENT_QUEUE]

With AGENT_QUEUE it starts bench/bare_load.py's `BareStoredTask` (one activity on AGENT_QUEUE that stores the
result), the store floor of bench/load.py; without, a `BareSubmission` workflow nobody runs (bench/api_cost.py).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from temporalio.client import Client

INSERT = """
WITH clock AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
ev AS (
    INSERT INTO events (work_item_id, tenant_id, type, data, rank, created_at)
    SELECT $1, $2, 'submitted', $5::json, 0, now FROM clock
)
INSERT INTO work_items (id, tenant_id, kind, state, spec, labels, workflow_id, reason, attempt_count, mock,
    fence_rank, created_at, updated_at)
SELECT $1, $2, $3, 'submitted', $4::json, $6::json, $7, '', 0, false, 0, now, now FROM clock
RETURNING created_at
"""


class Submission(BaseModel):
    kind: str
    input: dict[str, Any] = {}
    agent: dict[str, Any] = {}
    labels: dict[str, str] = {}


def make_app(dsn: str, temporal: str, task_queue: str, agent_queue: str = "") -> FastAPI:
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        state["pool"] = await asyncpg.create_pool(dsn, min_size=2, max_size=10)
        state["client"] = await Client.connect(temporal)
        state["tenant"] = await state["pool"].fetchval("SELECT id FROM tenants LIMIT 1")
        yield
        await state["pool"].close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/work-items", status_code=202)
    async def submit(body: Submission) -> dict[str, Any]:
        wid = f"wi_{uuid.uuid4().hex[:24]}"
        spec = body.model_dump(mode="json")
        await state["pool"].fetchval(
            INSERT,
            wid,
            state["tenant"],
            body.kind,
            json.dumps(spec),
            json.dumps({"kind": body.kind}),
            json.dumps(body.labels),
            f"work-item-{wid}",
        )
        if agent_queue:
            args: Any = {"agent_queue": agent_queue, "id": wid}
            await state["client"].start_workflow("BareStoredTask", args, id=f"work-item-{wid}", task_queue=task_queue)
        else:
            await state["client"].start_workflow("BareSubmission", spec, id=f"work-item-{wid}", task_queue=task_queue)
        return {"id": wid, "state": "submitted", "at": time.time()}

    return app


if __name__ == "__main__":
    port, dsn, temporal, queue = sys.argv[1:5]
    agents = sys.argv[5] if len(sys.argv) > 5 else ""
    uvicorn.run(make_app(dsn, temporal, queue, agents), host="127.0.0.1", port=int(port), log_level="warning")
