"""Fair sharing under a hostile flood: tenant A floods the agent pool (blocking, spinning, zombie and crashing agent
code, a cancel storm) and tenant B's items still finish within a stated bound of B's own baseline, measured in the
same run (tests/reliability/flood.py has the scenario; bench/flood.py prints its figures).

Pool: 3 agent slots, `tenant_max_in_flight` 2, so A can never hold every slot, and whatever A's agent code does to
the slots it holds, a cancel takes them back (crewwork.agents.isolation). Real Temporal dev server, real PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crewwork.temporal.devserver import DevServer
from tests.conftest import make_settings, running_crew
from tests.reliability.flood import pct, run_flood

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

BOUND_FACTOR = 3.0
BOUND_SLACK_S = 5.0
"""The bound: B's p95 under the flood <= 3 x B's baseline p95 + 5 s (docs/operations.md, 'Fair sharing')."""


async def test_tenant_b_latency_stays_bounded_while_tenant_a_floods_the_pool(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREWWORK_TEST_FAULTS", "1")  # the scripted agent's fault keys are a test-only switch
    settings = make_settings(
        tmp_path, temporal_server, pg_url, sandbox_backend=sandbox_backend, agent_concurrency=3, tenant_max_in_flight=2
    )
    async with running_crew(settings) as crew:
        figures = await run_flood(crew, b_items=8, a_rounds=4)
    base, flood = pct(figures.baseline_s, 95), pct(figures.flood_s, 95)
    print("flood figures:", figures.summary())
    assert figures.a_cancelled >= 4, f"the cancel storm must have killed slots: {figures.summary()}"
    assert flood <= BOUND_FACTOR * base + BOUND_SLACK_S, (
        f"B's p95 went from {base:.2f}s to {flood:.2f}s under A's flood: {figures.summary()}"
    )
