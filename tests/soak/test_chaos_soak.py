"""Chaos soak at small M (CI): work items on real subprocess pools survive SIGKILLed pools, a zombie agent process
(SIGSTOP past its heartbeat timeout, then SIGCONT), a Temporal dev-server restart and terminated PostgreSQL
connections, and the invariant checker finds the store consistent afterwards. bench/chaos.py runs the same at large M
and prints the figures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.soak.chaos import FAULT_KINDS, run_soak

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

M = int(os.environ.get("CREWWORK_SOAK_ITEMS", "12"))


def test_chaos_soak_loses_nothing_and_accepts_no_stale_write(tmp_path: Path, pg_url: str, sandbox_backend: str) -> None:
    db_name = pg_url.rsplit("/", 1)[1]
    res = run_soak(
        root=tmp_path,
        db_url=pg_url,
        db_name=db_name,
        items=M,
        max_faults=len(FAULT_KINDS) + 1,
        fault_every_s=3.0,
        chaos_deadline_s=90.0,
        finish_timeout_s=240.0,
        task_delay_s=2.0,
        submit_spread_s=25.0,
        sandbox=sandbox_backend,
    )
    print(res.figures())
    # Every kind of fault was injected while work was in flight.
    assert {f.kind for f in res.faults} == set(FAULT_KINDS), [f.kind for f in res.faults]
    # Zero lost: every submitted item is in the store and terminal; none ended dead for infrastructure reasons.
    assert res.items == M
    assert sum(res.states.values()) == M
    assert res.states == {"succeeded": M}, res.states
    # Zero accepted stale writes, results from the newest token, no double landing, leases never shared.
    res.invariants.assert_ok()
