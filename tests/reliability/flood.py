"""The flood scenario shared by tests/reliability/test_flood.py and bench/flood.py: tenant A floods the agent pool
with hostile items while tenant B submits ordinary ones, one at a time, and B's submit-to-done latency is measured
before and during the flood.

A's flood mixes everything agent code can do to a slot: block its event loop (`block_s`), spin (`spin_s`), become a
zombie that ignores cancellation (`stall_s`), exit its process (`crash`), or just take a while (`delay_s`). A also
cancels its blocking items after they have held a slot for a moment (a cancel storm), so slots are killed and
replaced all the time. What keeps B's latency bounded: A has at most `tenant_max_in_flight` items admitted (the
rest wait durably in `queued`), the pool has more agent slots than that, and a killed slot's child is replaced at
once (crewwork.agents.isolation).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from crewwork.models import WorkItemSpec

HOSTILE = (
    {"block_s": 600},
    {"crash": True},
    {"spin_s": 600},
    {"stall_s": 600},
    {"delay_s": 2},
    {"crash": True, "on_activity_attempt": "all"},
)
"""One round of A's items; the flood repeats it."""
HOLD_BEFORE_CANCEL_S = 2.0
"""How long A lets a blocking item hold its slot before cancelling it."""


def task(config: dict[str, Any]) -> WorkItemSpec:
    return WorkItemSpec.model_validate({"kind": "task", "input": {}, "agent": {"name": "scripted", "config": config}})


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


@dataclass
class Figures:
    baseline_s: list[float] = field(default_factory=list)
    flood_s: list[float] = field(default_factory=list)
    a_submitted: int = 0
    a_cancelled: int = 0
    a_states: dict[str, int] = field(default_factory=dict)

    def row(self, name: str, values: list[float]) -> dict[str, float]:
        return {
            "n": len(values),
            "median_s": round(statistics.median(values), 3),
            "p95_s": round(pct(values, 95), 3),
            "max_s": round(max(values), 3),
        }

    def summary(self) -> dict[str, Any]:
        return {
            "baseline": self.row("baseline", self.baseline_s),
            "flood": self.row("flood", self.flood_s),
            "a_submitted": self.a_submitted,
            "a_cancelled": self.a_cancelled,
            "a_states": self.a_states,
        }


async def _ended(crew: Any, wid: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = await crew.store.get_work_item(wid)
        if row is not None and row.result is not None:
            return row
        await asyncio.sleep(0.05)
    raise AssertionError(f"{wid} did not end in {timeout_s}s")


async def b_latency(crew: Any, tenant_b: str, n: int, *, min_s: float = 0.0, timeout_s: float = 120) -> list[float]:
    """B's items one after another (at least `n`, and for at least `min_s`): seconds from submit to `succeeded`."""
    out: list[float] = []
    started = time.monotonic()
    i = 0
    while i < n or time.monotonic() - started < min_s:
        i += 1
        t0 = time.monotonic()
        res = await crew.service.submit(tenant_b, task({"output": {"b": i}}))
        row = await _ended(crew, str(res.row.id), timeout_s)
        assert row.state == "succeeded", f"B's item {row.id} ended {row.state}: {row.reason}"
        out.append(time.monotonic() - t0)
    return out


async def run_flood(crew: Any, *, b_items: int = 8, a_rounds: int = 5, flood_s: float = 20.0) -> Figures:
    tenant_a = await crew.store.ensure_tenant("flood-a")
    tenant_b = await crew.store.ensure_tenant("flood-b")
    figures = Figures()
    await b_latency(crew, tenant_b, 2)  # warm-up: first workflow tasks, first child processes
    figures.baseline_s = await b_latency(crew, tenant_b, b_items)

    a_items: list[tuple[str, dict[str, Any]]] = []
    for _ in range(a_rounds):
        for cfg in HOSTILE:
            res = await crew.service.submit(tenant_a, task(cfg))
            a_items.append((str(res.row.id), cfg))
    figures.a_submitted = len(a_items)
    blocking = {wid for wid, cfg in a_items if {"block_s", "spin_s", "stall_s"} & set(cfg)}
    stop = asyncio.Event()

    async def cancel_storm() -> None:
        seen_running: dict[str, float] = {}
        while not stop.is_set():
            for wid in list(blocking):
                row = await crew.store.get_work_item(wid)
                if row is None or row.state != "running":
                    continue
                first = seen_running.setdefault(wid, time.monotonic())
                if time.monotonic() - first >= HOLD_BEFORE_CANCEL_S:
                    await crew.service.cancel(row)
                    blocking.discard(wid)
                    figures.a_cancelled += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    storm = asyncio.create_task(cancel_storm())
    try:
        await asyncio.sleep(1.0)  # let the flood reach the pool first
        figures.flood_s = await b_latency(crew, tenant_b, b_items, min_s=flood_s)
    finally:
        stop.set()
        await storm
        # Leave nothing running: cancel what is left of A's flood and wait for it to end.
        for wid, _cfg in a_items:
            row = await crew.store.get_work_item(wid)
            if row is not None and row.result is None:
                with contextlib.suppress(Exception):
                    await crew.service.cancel(row)
        for wid, _cfg in a_items:
            with contextlib.suppress(AssertionError):
                row = await _ended(crew, wid, 60)
                figures.a_states[row.state] = figures.a_states.get(row.state, 0) + 1
    return figures
