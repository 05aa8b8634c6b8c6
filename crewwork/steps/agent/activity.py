"""The agent step's activity: run the agent in a workspace of its own, then capture the change.

The agent runs in a fresh workspace per activity attempt (named by its rank), so a zombie attempt still writing
files cannot touch the workspace of the attempt that superseded it. The platform captures the diff itself, treating
everything in the workspace as untrusted input (`crewwork.workspace.tree`: no host git in the workspace, no link followed,
every read bounded).

`run_agent` reads as its phases: choose the agent, the attempt's first write, the workspace, the run, the capture,
the attempt's last write. Whatever the agent does, the attempt ends in that one last write (an agent error and a
change that cannot be captured are outcomes with an `error`, which the workflow records and repairs); only
infrastructure faults raise, for Temporal's retry policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from crewwork.agents.base import (
    Agent,
    AgentConfigError,
    AgentContext,
    AgentError,
    AgentInfraError,
    AgentRunResult,
    OperatorAgentSettings,
)
from crewwork.agents.classes import get_agent_class
from crewwork.agents.command import choose_agent
from crewwork.agents.isolation import call_for
from crewwork.forge.pr_review import ReviewOutputError, read_agent_review
from crewwork.gateway.forwarder import AttemptGateway
from crewwork.gateway.replayer import Replayer
from crewwork.models import AgentOutcome, ArtifactRef, WorkItemKind, WorkItemState
from crewwork.sandbox.base import Sandbox, SandboxError, SandboxLimits
from crewwork.steps.agent import AgentStepInput
from crewwork.steps.agent.metering import attempt_gateway
from crewwork.steps.attempt import AttemptWriter, Watch, watch
from crewwork.steps.errors import bad_input
from crewwork.steps.execution import (
    bounded,
    forget_item_dir,
    hold_mirror,
    make_workspace,
    pick_sandbox,
    sandbox_limits,
    save,
)
from crewwork.steps.ports import Ports
from crewwork.store.artifacts import new_artifact
from crewwork.store.views import NewArtifact
from crewwork.workspace.tree import CaptureLimits, CaptureRefused, Workspace

log = logging.getLogger("crewwork.steps.agent")
T = TypeVar("T")


@dataclass(frozen=True)
class Chosen:
    """The agent that runs (the command agent, or the built-in one the submission names), with its config."""

    cls: type[Agent]
    name: str
    config: dict[str, Any]
    why: str | None


@dataclass
class Produced:
    """What an agent run produced: its outcome, and the artifacts its last write inserts (its transcript)."""

    outcome: AgentOutcome
    pending: list[NewArtifact]


async def run_agent(ports: Ports, inp: AgentStepInput) -> AgentOutcome:
    chosen = choose(inp, OperatorAgentSettings.of(ports.settings), ports.settings.delegated_runner)
    w = AttemptWriter.of(ports.store, inp)
    # The attempt's first write, before anything else: refused if a later-scheduled attempt has written.
    started = await w.set_state(
        WorkItemState.running,
        f"attempt {inp.attempt}: agent {inp.spec.agent.name} running",
        event_data={"attempt": inp.attempt, "activity_attempt": w.rank.attempt},
    )
    if started.stale:
        raise w.stale(started, "run_agent")
    sandbox, limits = None, None
    if chosen.cls.needs_sandbox:
        sandbox = pick_sandbox(inp.spec.sandbox, ports.settings)
        limits = sandbox_limits(inp.spec.sandbox, None, ports.settings.sandbox)
    async with attempt_workspace(ports, w, inp, limits) as ws:
        async with watch(w, workspace_ttl_s=ports.settings.lease_ttl_s * 10 if ws else None) as live:
            started_at = time.monotonic()
            produced = await run(ports, inp, chosen, ws, sandbox, limits, live)
            if ws is not None and produced.outcome.error is None:
                await capture(ports, w, inp, ws, produced.outcome)
            if ws is not None and produced.outcome.error is None and inp.spec.kind == WorkItemKind.pr_review:
                review_written(ws, produced.outcome)
            if produced.outcome.error is None:
                log.info(
                    "agent %s finished attempt %s of %s in %.2fs",
                    chosen.cls.name,
                    inp.attempt,
                    inp.work_item_id,
                    time.monotonic() - started_at,
                )
            return await finished(w, inp, produced, ports.agent_done)


def choose(inp: AgentStepInput, operator: OperatorAgentSettings, delegated: str = "") -> Chosen:
    """The agent for this attempt (by the operator's settings the worker was given), its config checked for the
    item's kind (bad input if it does not fit)."""
    spec = inp.spec
    name, why = choose_agent(
        spec.agent.name,
        spec.agent.config,
        repo=spec.repo.url if spec.repo else None,
        labels=spec.labels,
        operator=operator,
        delegated=delegated,
        code_change=spec.kind != WorkItemKind.task,
    )
    if name == spec.agent.name:
        config = spec.agent.config
    elif name == "command":  # the operator's delegated runner, with the item's model config as its fallback
        config = {"command": delegated, "model": dict(spec.agent.config)}
    else:  # the command agent's config carries the built-in agent's config to fall back on
        config = dict(spec.agent.config.get("model") or {})
    try:
        cls = get_agent_class(name, plugins=operator.agent_plugins)
        cls.validate_config(spec.kind, config)
    except AgentConfigError as exc:
        raise bad_input(str(exc)) from exc
    return Chosen(cls, name, config, why)


@contextlib.asynccontextmanager
async def attempt_workspace(
    ports: Ports, w: AttemptWriter, inp: AgentStepInput, limits: SandboxLimits | None
) -> AsyncIterator[Workspace | None]:
    """The attempt's own workspace on the base commit (None for a `task`), removed when the attempt ends."""
    if inp.spec.kind == WorkItemKind.task:
        yield None
        return
    assert inp.repo_path and inp.base_commit
    mirror = await hold_mirror(ports, w, inp.repo_path, inp.base_commit, inp.attempt)
    ws: Workspace | None = None
    try:
        ws = await make_workspace(
            ports,
            mirror.gitdir,
            inp.work_item_id,
            f"attempt-{inp.attempt}-s{inp.step}a{w.rank.attempt}",
            inp.base_commit,
            limits or sandbox_limits(inp.spec.sandbox, None, ports.settings.sandbox),
        )
        yield ws
    finally:
        if ws is not None:
            await ws.remove()
            with contextlib.suppress(Exception):
                await asyncio.shield(forget_item_dir(ports, w))
        mirror.release()


async def run(
    ports: Ports,
    inp: AgentStepInput,
    chosen: Chosen,
    ws: Workspace | None,
    sandbox: Sandbox | None,
    limits: SandboxLimits | None,
    live: Watch,
    replay: Replayer | None = None,
) -> Produced:
    """Run the agent: its result, or its error as the attempt's outcome. Infrastructure faults raise (retried)."""
    ctx = context(ports, inp, chosen, ws, sandbox, limits, live)
    async with attempt_gateway(ports, live.writer, inp, chosen.name, chosen.config, replay) as gw:
        if gw is not None:
            ctx.extra["gateway"] = gw.handle
        produced = await run_metered(ports, inp, chosen, ctx, live, gw)
        if gw is not None:
            produced.outcome.tokens_used, produced.outcome.cost_usd = gw.ledger.tokens, round(gw.ledger.cost_usd, 8)
            produced.outcome.model_calls = gw.transcript.calls - gw.refused
            produced.pending += model_transcript(ports, inp, produced.outcome, gw.transcript_bytes())
        return produced


async def run_metered(
    ports: Ports, inp: AgentStepInput, chosen: Chosen, ctx: AgentContext, live: Watch, gw: AttemptGateway | None
) -> Produced:
    """The agent's run, cancelled when its gateway stops it (budget spent, superseded); its failure as an outcome."""
    settings = ports.settings
    try:
        if chosen.cls.runs_inline or settings.agent_isolation == "inline":
            work: Any = chosen.cls().run(ctx)
        else:
            call = call_for(chosen.name, settings.agent_plugins, ctx, allow_unsafe=settings.allow_unsafe_sandbox)
            work = ports.agent_processes.run(
                call, ctx, deaf=lambda: live.partitioned and live.superseded_because is None
            )
        result: AgentRunResult = await until_stopped(work, gw)
        if gw is not None and gw.stop_kind not in (None, "ended") and gw.refused:
            raise AgentError(f"the model gateway stopped the attempt: {gw.stop_reason}")
    except (AgentError, AgentInfraError) as exc:
        if isinstance(exc, AgentInfraError) and not (gw is not None and gw.refused and gw.stop_reason):
            delay = timedelta(seconds=min(exc.retry_after_s, 600)) if exc.retry_after_s else None
            raise ApplicationError(str(exc), type="AgentInfraError", next_retry_delay=delay) from exc
        message = str(exc)
        if gw is not None and gw.refused and gw.stop_reason and gw.stop_reason not in message:
            message = f"the model gateway stopped the attempt: {gw.stop_reason} ({message})"
        failed = AgentOutcome(
            agent=chosen.cls.name,
            mock=chosen.cls.mock,
            error=message,
            selected_because=chosen.why,
            tokens_used=int(getattr(exc, "tokens_used", 0) or 0),
            cost_usd=float(getattr(exc, "cost_usd", 0.0) or 0.0),
        )
        return Produced(failed, transcript(ports, inp, failed, getattr(exc, "transcript", None)))
    except SandboxError as exc:
        raise ApplicationError(f"sandbox failure: {exc}", type="SandboxError") from exc
    outcome = AgentOutcome(
        agent=chosen.cls.name,
        mock=chosen.cls.mock,
        output=result.output,
        claims=result.claims,
        selected_because=chosen.why,
        tokens_used=result.tokens_used,
        cost_usd=result.cost_usd,
    )
    return Produced(outcome, transcript(ports, inp, outcome, result.transcript))


async def until_stopped(work: Awaitable[T], gw: AttemptGateway | None) -> T:
    """`work`'s result; cancelled (AgentError with the reason) when the gateway stops the attempt first."""
    if gw is None:
        return await work
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(gw.stopped.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise AgentError(f"the model gateway stopped the attempt: {gw.stop_reason}")
    finally:
        for t in (task, stop):
            if not t.done():
                t.cancel()


def model_transcript(ports: Ports, inp: AgentStepInput, outcome: AgentOutcome, data: bytes) -> list[NewArtifact]:
    """The gateway's transcript as an artifact of the attempt's last write (bounded), its ref on `outcome`."""
    limit = ports.settings.max_artifact_bytes
    art = new_artifact(
        work_item_id=inp.work_item_id,
        tenant_id=inp.tenant_id,
        name=f"attempt-{inp.attempt}-model-transcript.jsonl",
        data=bounded(data, limit),
        content_type="application/x-ndjson",
        max_bytes=limit,
    )
    outcome.model_transcript_ref = art.ref()
    return [art]


def context(
    ports: Ports,
    inp: AgentStepInput,
    chosen: Chosen,
    ws: Workspace | None,
    sandbox: Sandbox | None,
    limits: SandboxLimits | None,
    live: Watch,
) -> AgentContext:
    spec, settings = inp.spec, ports.settings
    try:
        activity_attempt = activity.info().attempt
        details = activity.info().heartbeat_details
    except RuntimeError:  # outside an activity: a replay (crewwork/steps/agent/replay.py)
        activity_attempt, details = 1, []
    workspace: Path | None = ws.path if ws is not None else None
    w = live.writer

    async def save_artifact(name: str, data: bytes, ctype: str = "text/plain") -> ArtifactRef:
        return await save(ports, w, name, data, ctype)

    return AgentContext(
        work_item_id=inp.work_item_id,
        attempt=inp.attempt,
        activity_attempt=activity_attempt,
        kind=spec.kind,
        config=chosen.config,
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
        resume_details=(details[0] if details else None),
        save_artifact=save_artifact,
        extra={
            "repo": spec.repo.url if spec.repo else None,
            # The repository map in a model agent's prompt (crewwork.codeintel.prompt): cached per registration,
            # the tenant's own.
            "repo_id": spec.repo.id if spec.repo else None,
            "codeintel": settings.codeintel,
            "codeintel_dir": str(settings.resolved_codeintel_dir()),
            "labels": dict(spec.labels),
            # Test-only fault injection (the scripted agent's `stall_s`): turn this attempt into a zombie.
            "fault_partition": live.simulate_partition,
            "test_faults": settings.test_faults,
        },
    )


def transcript(ports: Ports, inp: AgentStepInput, outcome: AgentOutcome, text: object) -> list[NewArtifact]:
    """The agent's transcript as an artifact the attempt's last write inserts (it exists only if that write is
    accepted, in the same transaction), its ref set on `outcome`."""
    if not text:
        return []
    limit, name = ports.settings.max_artifact_bytes, f"attempt-{inp.attempt}-transcript.txt"
    art = new_artifact(
        work_item_id=inp.work_item_id,
        tenant_id=inp.tenant_id,
        name=name,
        data=bounded(str(text).encode(), limit),
        content_type="text/plain",
        max_bytes=limit,
    )
    outcome.transcript_ref = art.ref()
    return [art]


async def capture(ports: Ports, w: AttemptWriter, inp: AgentStepInput, ws: Workspace, outcome: AgentOutcome) -> None:
    """The change the agent left, as the attempt's diff artifact. What cannot be a change (too large, too deep, ...)
    fails the attempt with that reason, recorded like any agent error; the loop goes on."""
    limit = ports.settings.max_artifact_bytes
    try:
        captured = await ws.capture(CaptureLimits(max_diff_bytes=limit, max_file_bytes=limit))
    except CaptureRefused as exc:
        outcome.error = f"the change could not be captured: {exc}"
        return
    outcome.diff_stats = captured.stats
    outcome.diff_ref = await save(ports, w, f"attempt-{inp.attempt}.diff", captured.diff, "text/x-diff")


def review_written(ws: Workspace, outcome: AgentOutcome) -> None:
    """A pull request review's result: the review the agent wrote in its workspace, read as data (bounded, no link
    followed, strictly parsed: crewwork/forge/pr_review.py) into the outcome; what cannot be read fails the attempt
    with the reason, and nothing is posted."""
    try:
        outcome.output = {"review": read_agent_review(ws.path).model_dump()}
    except ReviewOutputError as exc:
        outcome.output, outcome.error = None, str(exc)


async def finished(
    w: AttemptWriter, inp: AgentStepInput, produced: Produced, agent_done: Callable[[], None]
) -> AgentOutcome:
    """The attempt's last write: the refs of what it produced, and the pending artifacts (its transcript) in the
    same transaction. Refused (and the attempt ends) if a later attempt has written meanwhile, so the event log only
    ever names the accepted attempt's artifacts."""
    agent_done()  # what is left is this write and the completion: the slot may poll for its next task
    outcome = produced.outcome
    done = await w.event(
        "agent_finished",
        {
            "attempt": inp.attempt,
            "activity_attempt": w.rank.attempt,
            "diff_ref": outcome.diff_ref.id if outcome.diff_ref else None,
            "transcript_ref": outcome.transcript_ref.id if outcome.transcript_ref else None,
            "model_transcript_ref": outcome.model_transcript_ref.id if outcome.model_transcript_ref else None,
            "model_calls": outcome.model_calls,
            "tokens_used": outcome.tokens_used,
            "error": outcome.error,
        },
        produced.pending,
    )
    if done.stale:
        raise w.stale(done, "run_agent")
    return outcome
