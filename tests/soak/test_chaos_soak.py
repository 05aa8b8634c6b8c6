"""Chaos soak at small M (CI): work items on real subprocess pools survive every fault kind the chaos driver has --
SIGKILL of each pool, a pool process frozen (SIGSTOP past the heartbeat timeout, then SIGCONT) before and after an
attempt's first write, a Temporal dev-server restart, a full restart of the soak's own PostgreSQL server and
terminated connections -- and the invariant checker, against the store and Temporal's histories, finds nothing
lost, no stale write accepted, no state regression and no double landing. bench/chaos.py runs the same at large M
(>= 1,000 items, >= 100 faults) and prints the figures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.soak.chaos import FAULT_KINDS, run_soak

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

M = int(os.environ.get("CREWWORK_SOAK_ITEMS", "24"))


def test_chaos_soak_loses_nothing_and_accepts_no_stale_write(tmp_path: Path, sandbox_backend: str) -> None:
    res = run_soak(
        root=tmp_path,
        items=M,
        max_faults=len(FAULT_KINDS) + 2,
        fault_every_s=2.0,
        chaos_deadline_s=240.0,
        finish_timeout_s=300.0,
        task_delay_s=1.5,
        submit_spread_s=60.0,
        sandbox=sandbox_backend,
    )
    fig = res.figures()
    print(fig)
    # Every kind of fault was injected while work was in flight.
    assert set(fig["faults_by_kind"]) == set(FAULT_KINDS), fig["faults_by_kind"]
    # Zero lost: every submitted item is in the store and terminal; none ended dead for infrastructure reasons.
    assert res.items == M and fig["items_lost"] == 0
    assert res.states == {"succeeded": M}, res.states
    # Zero accepted stale writes, no state regression, no double landing, results from the newest rank.
    assert (fig["stale_writes_accepted"], fig["state_regressions"], fig["double_landings"]) == (0, 0, 0)
    res.invariants.assert_ok()
