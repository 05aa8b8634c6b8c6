"""Replay: run a recorded attempt's agent again, with the gateway answering from the attempt's transcript, so no model
is called (`crewwork replay ITEM ATTEMPT`; docs/gateway.md).

The agent runs for real, as the attempt ran it: the same agent and config, the same instruction, diagnostics and
review comment (kept in the transcript's header), in a fresh workspace on the same base commit, in a fresh sandbox.
Only the model's answers come from the record (crewwork/gateway/replayer.py). The report says whether the agent asked
the same questions (and where it first diverged), whether it produced the same diff, and the verdict: the recorded one
when the diff is the same (the same change on the same base, judged by the same checks), "not judged" when it differs
(replay does not run validation; submit the change to have it judged).

Replay writes nothing to the work item: its writer's events go nowhere, it holds no lease, and its workspace is its
own. It runs where an agent pool runs (it needs the sandbox, the repository mirror and the agent CLIs).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

from crewwork.agents.classes import get_agent_class
from crewwork.gateway.exchanges import parse
from crewwork.gateway.replayer import Replayer
from crewwork.models import WorkItemSpec
from crewwork.steps.agent import AgentStepInput
from crewwork.steps.agent.activity import Chosen, attempt_workspace, run
from crewwork.steps.attempt import AttemptWriter, Watch
from crewwork.steps.execution import pick_sandbox, sandbox_limits
from crewwork.steps.ports import Ports
from crewwork.steps.replay.contract import ReplayInput, ReplayOutcome
from crewwork.store.fencing import Rank, WriteResult
from crewwork.store.views import NewArtifact
from crewwork.workspace.tree import CaptureLimits, CaptureRefused

MAX_REPORTED_DIFF = 64 * 1024


class ReplayError(Exception):
    """The attempt cannot be replayed; the message says why."""


@dataclass(frozen=True)
class _ReplayWriter(AttemptWriter):
    """Writes nothing: a replay is not part of the work item's record."""

    async def event(self, type_: str, data: dict[str, Any], artifacts: Any = ()) -> WriteResult[None]:
        return WriteResult(ok=True)

    async def superseded(self) -> str | None:
        return None


@dataclass
class ReplayReport:
    work_item_id: str
    attempt: int
    agent: str
    recorded_calls: int
    replayed_calls: int
    provider_calls: int
    """Calls that reached a model provider: 0, by construction (the replayer is the only upstream)."""
    same_questions: bool
    divergences: list[dict[str, Any]] = field(default_factory=list)
    """Calls where the agent asked something else (the first difference of each)."""
    observations: list[dict[str, Any]] = field(default_factory=list)
    """Calls where only its tools' output differed (a clock, a random id): the agent asked the same."""
    same_diff: bool = False
    recorded_diff_sha256: str | None = None
    replayed_diff_sha256: str | None = None
    recorded_verdict: str | None = None
    verdict: str = "not judged"
    error: str | None = None
    replayed_diff: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def replay_attempt(ports: Ports, work_item_id: str, attempt: int) -> ReplayReport:
    store = ports.store
    item = await store.get_work_item(work_item_id)
    if item is None:
        raise ReplayError(f"no work item {work_item_id}")
    record = next((a for a in await store.list_attempts(work_item_id) if a.number == attempt), None)
    if record is None or not record.agent:
        raise ReplayError(f"work item {work_item_id} has no recorded attempt {attempt}")
    ref = (record.agent.get("model_transcript_ref") or {}).get("id")
    if not ref:
        raise ReplayError(
            f"attempt {attempt} has no model transcript (its agent called no model through the gateway): nothing to "
            "replay from"
        )
    data = await store.artifact_content(ref)
    if data is None:
        raise ReplayError(f"the transcript artifact {ref} is missing")
    try:
        header, exchanges = parse(data)
    except ValueError as exc:
        raise ReplayError(f"the transcript of attempt {attempt} cannot be read: {exc}") from None
    inputs = header.get("inputs") or {}
    spec = WorkItemSpec.model_validate(item.spec)
    inp = AgentStepInput(
        work_item_id=work_item_id,
        tenant_id=item.tenant_id,
        step=0,
        attempt=attempt,
        spec=spec,
        repo_path=inputs.get("repo_path"),
        base_commit=inputs.get("base_commit"),
        diagnostics=inputs.get("diagnostics"),
        review_comment=inputs.get("review_comment"),
    )
    name, config = str(inputs.get("agent") or ""), dict(inputs.get("config") or {})
    chosen = Chosen(get_agent_class(name, plugins=ports.settings.agent_plugins), name, config, "replay")
    replayer = Replayer(exchanges)
    # A rank of its own, never written: the workspace's name is unique to this replay.
    w = _ReplayWriter(store, work_item_id, item.tenant_id, Rank(0, 100_000 + secrets.randbelow(900_000)), "replay")
    sandbox, limits = None, None
    if chosen.cls.needs_sandbox:
        sandbox = pick_sandbox(spec.sandbox, ports.settings)
        limits = sandbox_limits(spec.sandbox, None, ports.settings.sandbox)
    report = ReplayReport(
        work_item_id=work_item_id,
        attempt=attempt,
        agent=name,
        recorded_calls=replayer.recorded_calls,
        replayed_calls=0,
        provider_calls=0,
        same_questions=False,
        recorded_verdict=record.verdict,
    )
    replayed_diff = b""
    async with attempt_workspace(ports, w, inp, limits) as ws:
        produced = await run(ports, inp, chosen, ws, sandbox, limits, Watch(w), replay=replayer)
        report.error = produced.outcome.error
        if ws is not None:
            limit = ports.settings.max_artifact_bytes
            try:
                replayed_diff = (await ws.capture(CaptureLimits(max_diff_bytes=limit, max_file_bytes=limit))).diff
            except CaptureRefused as exc:
                report.error = report.error or f"the change could not be captured: {exc}"
    _unused: list[NewArtifact] = produced.pending  # the replay's own transcript is not stored
    report.replayed_calls = replayer.calls
    report.divergences = [asdict(d) for d in replayer.divergences]
    report.observations = [asdict(d) for d in replayer.observations]
    report.same_questions = not replayer.divergences and replayer.calls == report.recorded_calls
    if replayer.calls < report.recorded_calls and not replayer.divergences:
        report.divergences.append(
            {"call": replayer.calls + 1, "dialect": "", "detail": "the agent stopped before asking every recorded call"}
        )
    recorded_ref = (record.agent.get("diff_ref") or {}).get("id")
    recorded_diff = (await store.artifact_content(recorded_ref) if recorded_ref else None) or b""
    report.recorded_diff_sha256 = hashlib.sha256(recorded_diff).hexdigest() if recorded_ref else None
    report.replayed_diff_sha256 = hashlib.sha256(replayed_diff).hexdigest()
    report.same_diff = recorded_ref is not None and recorded_diff == replayed_diff
    report.replayed_diff = replayed_diff[:MAX_REPORTED_DIFF].decode("utf-8", "replace")
    if report.same_diff:
        report.verdict = f"{record.verdict} (recorded; the same diff on the same base)"
    else:
        report.verdict = "not judged: the replayed diff differs from the recorded one"
    return report


async def replay(ports: Ports, inp: ReplayInput) -> ReplayOutcome:
    """The activity (ReplayWorkflow, on the agent pool): the report, or why the attempt cannot be replayed."""
    item = await ports.store.get_work_item(inp.work_item_id)
    if item is None or item.tenant_id != inp.tenant_id:
        return ReplayOutcome(error=f"no work item {inp.work_item_id}")
    try:
        report = await replay_attempt(ports, inp.work_item_id, inp.attempt)
    except ReplayError as exc:
        return ReplayOutcome(error=str(exc))
    return ReplayOutcome(report=report.to_dict())
