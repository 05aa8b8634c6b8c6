"""Contract fuzzing with schemathesis against the running app's OpenAPI: no generated input produces a 5xx.

Bounded: a fixed number of examples per operation (CREWWORK_FUZZ_EXAMPLES, default 15), no example database."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from tests.api.conftest import Stack

if TYPE_CHECKING:
    import schemathesis

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

EXAMPLES = int(os.environ.get("CREWWORK_FUZZ_EXAMPLES", "15"))
STREAMING = ("/events/stream",)  # endless responses; their parameters are covered through /events


async def test_no_generated_request_gets_a_server_error(stack: Stack) -> None:
    # Hypothesis drives synchronous calls; run them in a thread so the in-process worker pools (on this event
    # loop) keep working while the API is fuzzed.
    await asyncio.to_thread(fuzz, stack)


def fuzz(stack: Stack) -> None:
    # Imported here, not at collection: importing schemathesis costs every pytest process that collects this module
    # (each xdist worker, the fast tier that never runs it) about a second of CPU.
    import schemathesis

    schema = schemathesis.openapi.from_url(f"{stack.api.url}/openapi.json")
    headers = {**stack.alpha.headers, "Accept": "application/json"}
    failures: list[str] = []
    operations = 0
    calls = [0]
    with httpx.Client(base_url=stack.api.url, timeout=30) as http:
        # A real work item, so that routes with an id reach their handlers, not only the 404 path.
        wid = http.post("/v1/work-items", json={"kind": "task", "input": {}}, headers=headers).json()["id"]
        for result in schema.get_all_operations():
            op = result.ok()  # type: ignore[union-attr]  # an invalid operation fails the run here
            if any(op.path.endswith(s) for s in STREAMING):
                continue
            operations += 1

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=op.as_strategy())
            def run(case: schemathesis.Case) -> None:
                calls[0] += 1
                if case.path_parameters and "work_item_id" in case.path_parameters and calls[0] % 2 == 0:
                    case.path_parameters["work_item_id"] = wid  # every other case targets a real item
                if case.headers:
                    case.headers.pop("Authorization", None)
                    case.headers.pop("Accept", None)
                resp = case.call(base_url=stack.api.url, headers=headers, timeout=30)
                if resp.status_code >= 500:
                    failures.append(f"{case.method} {case.formatted_path} -> {resp.status_code}: {resp.text[:300]}")

            run()
    assert operations >= 15
    assert not failures, "\n".join(failures[:20])
