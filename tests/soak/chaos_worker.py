"""A real crewwork pool process with the chaos soak's fault hooks: `python -m tests.soak.chaos_worker CONTROL_DIR POOL`.

The chaos driver arms a process by creating CONTROL_DIR/<pid>.before or CONTROL_DIR/<pid>.after. The next activity
attempt that process receives then freezes the whole process with a real SIGSTOP, sent to itself:

- `before`: when the attempt is delivered, before its first write (the zombie of the fencing issue: a GC pause, a VM
  freeze or a slow start between dispatch and the first write);
- `after`: at the attempt's first heartbeat, which comes after its first write (a zombie that has started its work).

The process writes CONTROL_DIR/<pid>.stopped-<kind> just before it stops, so the driver knows the fault is in place;
the driver SIGCONTs it later. When it wakes, the SDK notices the attempt's heartbeat timeout has passed and cancels
it; the frozen attempt ignores that (as code blocked in a thread or in C does), the worst case, so it goes on and
tries its writes, which the store must refuse. Test machinery only: it lives in tests/, and no production process
loads it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from crewwork.config import get_settings
from crewwork.workers.pools import run_pool

ZOMBIES: set[tuple[str, str, int]] = set()
"""The activity attempts of this process that were frozen: they ignore cancellation from then on."""


def _key() -> tuple[str, str, int]:
    info = activity.info()
    return info.workflow_id, info.activity_id, info.attempt


def _claim(control: Path, kind: str) -> bool:
    try:
        (control / f"{os.getpid()}.{kind}").unlink()
    except FileNotFoundError:
        return False
    return True


def _freeze(control: Path, kind: str) -> None:
    try:
        info = activity.info()
        note = f"{info.activity_type} attempt {info.attempt} of {info.workflow_id}"
    except RuntimeError:
        note = "?"
    ZOMBIES.add(_key())
    (control / f"{os.getpid()}.stopped-{kind}").write_text(note)
    os.kill(os.getpid(), signal.SIGSTOP)


class ChaosHooks(Interceptor):
    def __init__(self, control: Path) -> None:
        self.control = control

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self.control)


class _Inbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, control: Path) -> None:
        super().__init__(next)
        self.control = control

    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        super().init(_Outbound(outbound, self.control))

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        if _claim(self.control, "before"):
            _freeze(self.control, "before")
        key = _key()
        work = asyncio.ensure_future(self.next.execute_activity(input))
        me = asyncio.current_task()
        try:
            while True:
                try:
                    return await asyncio.shield(work)
                except asyncio.CancelledError:
                    if key not in ZOMBIES or work.done():
                        work.cancel()
                        raise
                    if me is not None:
                        me.uncancel()  # a zombie carries on regardless
        finally:
            ZOMBIES.discard(key)


class _Outbound(ActivityOutboundInterceptor):
    def __init__(self, next: ActivityOutboundInterceptor, control: Path) -> None:
        super().__init__(next)
        self.control = control

    def heartbeat(self, *details: Any) -> None:
        if _claim(self.control, "after"):
            _freeze(self.control, "after")
        super().heartbeat(*details)


def main() -> None:
    control, pool = Path(sys.argv[1]), sys.argv[2]
    control.mkdir(parents=True, exist_ok=True)
    asyncio.run(run_pool(pool, get_settings(), extra_interceptors=[ChaosHooks(control)]))


if __name__ == "__main__":
    main()
