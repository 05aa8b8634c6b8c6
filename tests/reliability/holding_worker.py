"""A real worker pool process that holds attempt 1 of one activity *before its first write*, for the late-starting
zombie tests: `python -m tests.reliability.holding_worker POOL ACTIVITY MARKER_DIR`.

When attempt 1 of ACTIVITY arrives, the process writes MARKER_DIR/<activity>.held and waits (without heartbeating)
until MARKER_DIR/go exists; the test SIGSTOPs the whole process meanwhile, as a GC pause, a VM freeze or a slow
start would, lets Temporal time the attempt out and retry it on another worker, then creates `go` and SIGCONTs the
process. The activity then runs as a zombie would: from its very first write.

When the process wakes, the SDK notices the attempt's heartbeat or start-to-close timeout has passed and cancels it;
a zombie that honours that stops even before its first write. The held attempt here ignores cancellation (as code
blocked in a thread or in C does), the worst case: it *does* reach its first write, which the store must refuse.
Test machinery only: it lives in tests/, and no production process loads it."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from crewwork.config import get_settings
from crewwork.workers.pools import run_pool


class HoldFirstAttempt(Interceptor):
    def __init__(self, activity_type: str, marker_dir: Path) -> None:
        self.activity_type = activity_type
        self.marker_dir = marker_dir

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Hold(next, self)


class _Hold(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, cfg: HoldFirstAttempt) -> None:
        super().__init__(next)
        self.cfg = cfg

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        if info.activity_type == self.cfg.activity_type and info.attempt == 1:
            if HOLD_AT is None:
                await hold(self.cfg.marker_dir, info.activity_type, info.workflow_id)
            try:
                return await _ignoring_cancellation(self.next.execute_activity(input))
            finally:
                (self.cfg.marker_dir / f"{info.activity_type}.done").write_text(info.workflow_id)
        return await self.next.execute_activity(input)


HOLD_AT = os.environ.get("CREWWORK_TEST_HOLD_AT") or None
"""Where attempt 1 holds: at its start (unset), or `publish_evidence`: land_change holds *after* its first write (it
has set `landing` and pushed the branch), just before it signs and publishes the evidence bundle: a zombie that
stalled mid-landing."""


async def hold(marker_dir: Path, activity_type: str, workflow_id: str) -> None:
    (marker_dir / f"{activity_type}.held").write_text(workflow_id)
    while not (marker_dir / "go").exists():
        await asyncio.sleep(0.05)


def _hold_before_publishing_evidence(marker_dir: Path) -> None:
    from crewwork.steps.land import activity as land

    original = land._publish_evidence

    async def held(ports: Any, inp: Any, w: Any, landed: Any) -> str:
        if activity.info().attempt == 1:
            await hold(marker_dir, activity.info().activity_type, activity.info().workflow_id)
        return await original(ports, inp, w, landed)

    land._publish_evidence = held


async def _ignoring_cancellation(coro: Any) -> Any:
    work = asyncio.ensure_future(coro)
    me = asyncio.current_task()
    while True:
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            if work.done():
                return work.result()
            if me is not None:
                me.uncancel()


def main() -> None:
    pool, activity_type, marker_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    marker_dir.mkdir(parents=True, exist_ok=True)
    if HOLD_AT == "publish_evidence":
        _hold_before_publishing_evidence(marker_dir)
    asyncio.run(run_pool(pool, get_settings(), extra_interceptors=[HoldFirstAttempt(activity_type, marker_dir)]))


if __name__ == "__main__":
    main()
