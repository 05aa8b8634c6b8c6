"""Agent-pool and validate-pool activities: run the agent in its own workspace, then judge the change.

The agent runs in a fresh workspace per activity attempt (named by its rank), so a zombie attempt still
writing files cannot touch the workspace of the attempt that superseded it. The platform captures the diff itself,
treating everything in the workspace as untrusted input (`crewwork.workspace`: no host git in the workspace, no
link followed, every read bounded).

Validation never runs in the agent's workspace: the captured diff is applied to the base tree in the host's
private git directory, protected test infrastructure is put back to the base commit (a change must not weaken
the tests that judge it; `crewwork.validation.protect`), the result is written into a fresh workspace, the
command runs in a fresh sandbox, the report is read back without trusting it (`crewwork.safefs`), and the saved
evidence is graded with a pure function.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from crewwork.activities.common import AttemptWriter, watch
from crewwork.activities.execute_base import (
    MAX_REPORT_BYTES,
    REPORT_DIR,
    pick_sandbox,
    read_report,
    sandbox_limits,
)
from crewwork.activities.validate_step import ValidateStep
from crewwork.agents.base import AgentConfigError, AgentContext, AgentError, AgentInfraError
from crewwork.agents.isolation import call_for
from crewwork.agents.registry import get_agent_class
from crewwork.models import (
    AgentOutcome,
    ArtifactRef,
    ValidationOutcome,
    WorkItemKind,
    WorkItemState,
)
from crewwork.repos.mirror import MirrorHold
from crewwork.sandbox.base import SandboxError
from crewwork.steps.agent import AgentStepInput
from crewwork.steps.errors import AGENT_ERROR, bad_input
from crewwork.steps.validate import ValidateInput
from crewwork.workers.slots import agent_done
from crewwork.workspace import CaptureLimits, CaptureRefused, Workspace

log = logging.getLogger("crewwork.activities.execute")


class ExecuteActivities(ValidateStep):
    @activity.defn(name="run_agent")
    async def run_agent(self, inp: AgentStepInput) -> AgentOutcome:
        info = activity.info()
        spec = inp.spec
        from crewwork.agents.command import choose_agent

        chosen, why = choose_agent(
            spec.agent.name, spec.agent.config, repo=spec.repo.url if spec.repo else None, labels=spec.labels
        )
        config = spec.agent.config
        if chosen != spec.agent.name:
            # The command agent's config carries the built-in agent's config to fall back on.
            config = dict(spec.agent.config.get("model") or {})
        try:
            agent_cls = get_agent_class(chosen)
            agent_cls.validate_config(spec.kind, config)
        except AgentConfigError as exc:
            raise bad_input(str(exc)) from exc

        w = AttemptWriter.of(self.store, inp)
        # The attempt's first write, before anything else: refused if a later-scheduled attempt has written.
        started = await w.set_state(
            WorkItemState.running,
            f"attempt {inp.attempt}: agent {spec.agent.name} running",
            event_data={"attempt": inp.attempt, "activity_attempt": info.attempt},
        )
        if started.stale:
            raise w.stale(started, "run_agent")
        ws: Workspace | None = None
        workspace: Path | None = None
        sandbox = None
        limits = None
        if agent_cls.needs_sandbox:
            sandbox = pick_sandbox(spec.sandbox, self.settings)
            limits = sandbox_limits(spec.sandbox, None, self.settings.sandbox)
        mirror: MirrorHold | None = None
        if spec.kind != WorkItemKind.task:
            assert inp.repo_path and inp.base_commit
            mirror = await self._mirror(w, inp.repo_path, inp.base_commit, inp.attempt)
            try:
                ws = await self._workspace(
                    mirror.gitdir,
                    inp.work_item_id,
                    f"attempt-{inp.attempt}-s{inp.step}a{info.attempt}",
                    inp.base_commit,
                    limits or sandbox_limits(spec.sandbox, None, self.settings.sandbox),
                )
            except BaseException:
                mirror.release()
                raise
            workspace = ws.path
        started_at = time.monotonic()

        async def save(name: str, data: bytes, ctype: str = "text/plain") -> ArtifactRef:
            return await self._save(inp.work_item_id, inp.tenant_id, name, data, ctype)

        try:
            async with watch(w, workspace_ttl_s=self.settings.lease_ttl_s * 10 if workspace else None) as live:
                ctx = AgentContext(
                    work_item_id=inp.work_item_id,
                    attempt=inp.attempt,
                    activity_attempt=info.attempt,
                    kind=spec.kind,
                    config=config,
                    instruction=spec.instruction,
                    input=spec.input,
                    workspace=workspace,
                    diagnostics=inp.diagnostics,
                    review_comment=inp.review_comment,
                    sandbox=sandbox,
                    limits=limits,
                    host_workspace=ws,
                    heartbeat=live.heartbeat,
                    ensure_current=live.ensure_current,
                    resume_details=(info.heartbeat_details[0] if info.heartbeat_details else None),
                    save_artifact=save,
                    extra={
                        "repo": spec.repo.url if spec.repo else None,
                        # The repository map in a model agent's prompt (crewwork.codeintel.prompt): cached per
                        # registration, the tenant's own.
                        "repo_id": spec.repo.id if spec.repo else None,
                        "codeintel": self.settings.codeintel,
                        "codeintel_dir": str(self.settings.resolved_codeintel_dir()),
                        "labels": dict(spec.labels),
                        # Test-only fault injection (the scripted agent's `stall_s`): turn this attempt into a zombie.
                        "fault_partition": live.simulate_partition,
                        "test_faults": self.settings.test_faults,
                    },
                )
                try:
                    if agent_cls.runs_inline or self.settings.agent_isolation == "inline":
                        result = await agent_cls().run(ctx)
                    else:
                        call = call_for(
                            chosen, self.settings.agent_plugins, ctx, allow_unsafe=self.settings.allow_unsafe_sandbox
                        )
                        result = await self.agent_processes.run(
                            call, ctx, deaf=lambda: live.partitioned and live.superseded_because is None
                        )
                except AgentError as exc:
                    failed = AgentOutcome(
                        agent=agent_cls.name,
                        mock=agent_cls.mock,
                        error=str(exc),
                        selected_because=why,
                        tokens_used=int(getattr(exc, "tokens_used", 0) or 0),
                        cost_usd=float(getattr(exc, "cost_usd", 0.0) or 0.0),
                    )
                    transcript = getattr(exc, "transcript", None)
                    left: list[dict[str, Any]] = []
                    if transcript:
                        failed.transcript_ref, row = self._pending(
                            inp, f"attempt-{inp.attempt}-transcript.txt", str(transcript).encode(), "text/plain"
                        )
                        left.append(row)
                    return await self._agent_finished(w, inp, failed, left)
                except AgentInfraError as exc:
                    delay = timedelta(seconds=min(exc.retry_after_s, 600)) if exc.retry_after_s else None
                    raise ApplicationError(str(exc), type="AgentInfraError", next_retry_delay=delay) from exc
                except SandboxError as exc:
                    raise ApplicationError(f"sandbox failure: {exc}", type="SandboxError") from exc
                outcome = AgentOutcome(
                    agent=agent_cls.name,
                    mock=agent_cls.mock,
                    output=result.output,
                    claims=result.claims,
                    selected_because=why,
                    tokens_used=result.tokens_used,
                    cost_usd=result.cost_usd,
                )
                pending: list[dict[str, Any]] = []
                if result.transcript:
                    # Inserted by the attempt's last write, in its transaction.
                    outcome.transcript_ref, row = self._pending(
                        inp, f"attempt-{inp.attempt}-transcript.txt", result.transcript.encode(), "text/plain"
                    )
                    pending.append(row)
                if ws is not None:
                    try:
                        captured = await ws.capture(
                            CaptureLimits(
                                max_diff_bytes=self.settings.max_artifact_bytes,
                                max_file_bytes=self.settings.max_artifact_bytes,
                            )
                        )
                    except CaptureRefused as exc:
                        # What the agent left cannot be a change (too large, too deep, ...): the attempt fails
                        # with that reason, recorded like any agent error; the loop goes on.
                        outcome.error = f"the change could not be captured: {exc}"
                        return await self._agent_finished(w, inp, outcome, pending)
                    outcome.diff_stats = captured.stats
                    outcome.diff_ref = await save(f"attempt-{inp.attempt}.diff", captured.diff, "text/x-diff")
                log.info(
                    "agent %s finished attempt %s of %s in %.2fs",
                    agent_cls.name,
                    inp.attempt,
                    inp.work_item_id,
                    time.monotonic() - started_at,
                )
                return await self._agent_finished(w, inp, outcome, pending)
        finally:
            if ws is not None:
                await ws.remove()
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._forget_item_dir(w))
            if mirror is not None:
                mirror.release()

    async def _agent_finished(
        self, w: AttemptWriter, inp: AgentStepInput, outcome: AgentOutcome, pending: list[dict[str, Any]]
    ) -> AgentOutcome:
        """The attempt's last write: the refs of what it produced, and the `pending` artifacts (its transcript) in
        the same transaction. Refused (and the attempt ends) if a later attempt has written meanwhile, so the event
        log only ever names the accepted attempt's artifacts."""
        agent_done()  # what is left is this write and the completion: the slot may poll for its next task
        done = await w.event(
            "agent_finished",
            {
                "attempt": inp.attempt,
                "activity_attempt": w.rank.attempt,
                "diff_ref": outcome.diff_ref.id if outcome.diff_ref else None,
                "transcript_ref": outcome.transcript_ref.id if outcome.transcript_ref else None,
                "error": outcome.error,
            },
            pending,
        )
        if done.stale:
            raise w.stale(done, "run_agent")
        return outcome

    # ------------------------------------------------------------------ validation

    @activity.defn(name="validate_change")
    async def validate_change(self, inp: ValidateInput) -> ValidationOutcome:
        w = AttemptWriter.of(self.store, inp)
        started = await w.set_state(
            WorkItemState.validating,
            f"attempt {inp.attempt}: validating",
            event_data={"attempt": inp.attempt, "activity_attempt": w.rank.attempt},
        )
        if started.stale:
            raise w.stale(started, "validate_change")
        async with watch(w, workspace_ttl_s=self.settings.lease_ttl_s * 10) as live:
            outcome = await self._validate(inp, w, live.heartbeat)
        done = await w.event(
            "validation_finished",
            {
                "attempt": inp.attempt,
                "activity_attempt": w.rank.attempt,
                "passed": outcome.passed,
                "cause": outcome.cause,
                "log_ref": outcome.log_ref.id if outcome.log_ref else None,
            },
        )
        if done.stale:
            raise w.stale(done, "validate_change")
        return outcome


__all__ = [
    "AGENT_ERROR",
    "MAX_REPORT_BYTES",
    "REPORT_DIR",
    "ExecuteActivities",
    "pick_sandbox",
    "read_report",
    "sandbox_limits",
]
