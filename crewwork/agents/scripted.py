"""The deterministic scripted agent: applies, per attempt, the change its config gives. Always labelled mock.

Config (a work item's `agent.config`):

```json
{
  "attempts": [
    {"files": {"calc.py": "def add(a, b):\n    return a - b\n"}},
    {"diff": "--- a/calc.py\n+++ b/calc.py\n..."},
    {"output": {"answer": 42}, "delay_s": 0.1}
  ],
  "output": {"answer": 42},
  "delay_s": 0
}
```

Attempt k uses `attempts[k-1]` (the last entry repeats when there are more attempts than entries); top-level
`output`/`delay_s`/`files`/`diff` are the default. A `task` returns `output`; a code change writes `files`
(whole-file contents; `null` deletes) and/or applies `diff` in the attempt's workspace.

Every path (a `files` key, a path named by `diff`) is a `crewwork.boundary.paths.RelPath`, checked at submission: inside
the repository, never `.git` in any spelling, never the platform's `.crewwork/`. This agent runs on the host
(no sandbox), before any untrusted process has touched its fresh workspace, so the only untrusted things it
meets are its own config and the repository's content (a committed symlink, say). It writes through
`crewwork.boundary.safefs` (beneath the workspace, no link followed at any component, only single-link regular files
replaced), and applies `diff` to the workspace's tree in the host's private git directory, writing the result
back the same way; git never touches the workspace.

**Fault injection, for tests only** (documented in docs/reliability.md). Each step may also carry, keyed by the
Temporal activity attempt it fires on (`on_activity_attempt`, default 1; `"all"` fires on every attempt):
- `"fail": "message"`  raise an infrastructure error (retried by the activity retry policy);
- `"stall_s": N`       become a zombie: stop heartbeating and renewing the lease for good, block for N seconds
                       ignoring cancellation (as blocking code does), then carry on and try to write normally
                       (the store must reject those writes);
- `"crash": true`      hard-exit the process running the agent (`os._exit`): the agent pool's child process
                       (crewwork.agents.isolation), as if it was killed; the pool itself carries on;
- `"block_s": N`       blocking agent code: a synchronous `time.sleep(N)` on the agent's event loop (it heartbeats
                       nothing, hears no cancellation); the platform must still be able to take the slot back;
- `"spin_s": N`        the same as a busy loop burning CPU.
- `"error": "message"` raise a non-retryable agent error (the attempt fails, the loop goes on).
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from typing import Any

from crewwork.agents.base import (
    Agent,
    AgentContext,
    AgentError,
    AgentInfraError,
    AgentRunResult,
)
from crewwork.agents.scripted_config import FAULT_KEYS, safe_rel, validate_scripted_config
from crewwork.boundary import safefs
from crewwork.models import WorkItemKind
from crewwork.models.errors import CaptureRefused


class ScriptedAgent(Agent):
    name = "scripted"
    mock = True
    needs_sandbox = False

    @classmethod
    def validate_config(cls, kind: WorkItemKind, config: dict[str, Any]) -> None:
        validate_scripted_config(kind, config)

    @staticmethod
    def step_for(config: dict[str, Any], attempt: int) -> dict[str, Any]:
        base = {k: v for k, v in config.items() if k != "attempts"}
        steps = config.get("attempts") or []
        if steps:
            base.update(steps[min(attempt, len(steps)) - 1])
        return base

    async def run(self, ctx: AgentContext) -> AgentRunResult:
        step = self.step_for(ctx.config, ctx.attempt)
        if not ctx.extra.get("test_faults", False):
            # Refused at submission already; an item submitted before the switch was turned off gets no faults.
            step = {k: v for k, v in step.items() if k not in FAULT_KEYS}
        on = step.get("on_activity_attempt", 1)
        fires = on == "all" or ctx.activity_attempt == int(on)
        if fires and step.get("crash"):
            os._exit(137)
        if fires and step.get("block_s"):
            time.sleep(float(step["block_s"]))  # noqa: ASYNC251 - deliberately blocking: what killable slots are for
        if fires and step.get("spin_s"):
            end = time.monotonic() + float(step["spin_s"])
            while time.monotonic() < end:
                pass
        if fires and step.get("fail"):
            raise AgentInfraError(f"scripted fault: {step['fail']}")
        if fires and step.get("stall_s"):
            # A zombie: this attempt stops heartbeating and renewing its lease for good (as if cut off from
            # Temporal), sleeps, then carries on and tries its writes, which the store must reject.
            partition = ctx.extra.get("fault_partition")
            if callable(partition):
                partition()
            await _ignoring_cancellation(asyncio.to_thread(time.sleep, float(step["stall_s"])))
        if step.get("error"):
            raise AgentError(f"scripted error: {step['error']}")
        delay = float(step.get("delay_s", 0))
        if delay:
            end = time.monotonic() + delay
            while (left := end - time.monotonic()) > 0:
                await asyncio.sleep(min(left, 1.0))
                ctx.heartbeat()
        if ctx.kind != WorkItemKind.task:
            if ctx.workspace is None:
                raise AgentError("scripted agent: a code change needs a workspace")
            await self._apply_step(ctx, step)
        return AgentRunResult(
            output=step.get("output") if ctx.kind == WorkItemKind.task else None,
            claims=step.get("claims", "scripted change applied (mock agent)"),
            transcript=(
                f"scripted agent, attempt {ctx.attempt}: applied step keys {sorted(step)}\n"
                f"review comment received: {ctx.review_comment!r}\n"
                f"diagnostics received:\n{ctx.diagnostics or '(none)'}\n"
            ),
            tokens_used=int(step.get("tokens", 0)),
            cost_usd=float(step.get("cost_usd", 0.0)),
        )

    async def _apply_step(self, ctx: AgentContext, step: dict[str, Any]) -> None:
        assert ctx.workspace is not None
        handle = ctx.host_workspace
        owner = getattr(handle, "owner", None)
        root_fd = safefs.open_root(ctx.workspace)
        try:
            for raw, content in (step.get("files") or {}).items():
                rel = safe_rel(raw, "files key")
                try:
                    if content is None:
                        with safefs.opened(safefs.lookup(root_fd, rel)) as fd:
                            if stat.S_ISDIR(os.fstat(fd).st_mode):
                                raise AgentError(f"scripted agent: cannot delete {rel}: it is a directory")
                        safefs.remove(root_fd, rel)
                    else:
                        safefs.write_file(root_fd, rel, [content.encode()], owner=owner)
                except FileNotFoundError:
                    continue
                except safefs.Refused as exc:
                    raise AgentError(f"scripted agent: cannot write {rel}: {exc.reason}") from None
        finally:
            os.close(root_fd)
        if step.get("diff"):
            if handle is None:
                raise AgentError("scripted agent: applying a diff needs the platform's workspace handle")

            try:
                ok, err = await handle.apply_in_place(step["diff"].encode())
            except (CaptureRefused, safefs.Refused) as exc:
                raise AgentError(f"scripted agent: configured diff cannot be applied: {exc}") from None
            if not ok:
                raise AgentError(f"scripted agent: configured diff does not apply: {err}")


async def _ignoring_cancellation(coro: Any) -> None:
    """Run `coro` to the end even if this task is cancelled meanwhile (a zombie that does not honour cancellation,
    like code blocked in a thread or in C). The cancellation is swallowed, so the caller carries on afterwards."""
    fut = asyncio.ensure_future(coro)
    task = asyncio.current_task()
    while not fut.done():
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            if task is not None:
                task.uncancel()
