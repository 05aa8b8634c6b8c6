"""How WorkItemWorkflow calls each step: one call path (`StepCalls._call`) for all of them. It gives the call the next
step number (writes rank by (step, Temporal attempt), crewwork/store/fencing/rule.py), runs the step by its activity
name as its policy says (crewwork/steps/: task queue or local, timeouts, retry policy) and turns its failure into what
it means for the item (`crewwork.steps.step.outcome`). A base class of the workflow, so that
crewwork/workflows/work_item.py reads as the lifecycle alone. Workflow code: deterministic."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from crewwork.models import (
        AgentOutcome,
        AttemptSummary,
        LoopCarry,
        ReviewRecord,
        ValidationOutcome,
        WorkItemInput,
        WorkItemResult,
        WorkItemState,
        WorkItemStatus,
    )
    from crewwork.models.review import clean_line, describe
    from crewwork.steps.agent import RUN_AGENT, AgentStepInput
    from crewwork.steps.finish import FINISH, FinishInput
    from crewwork.steps.lease import (
        ACQUIRE_WORKSPACE,
        CLEANUP,
        END,
        RELEASE_WORKSPACE,
        WORKSPACE_LEASE_TTL_S,
        WORKSPACE_POLL,
        WORKSPACE_POLL_MAX,
        CleanupInput,
        ReleaseInput,
        WorkspaceLeaseInput,
    )
    from crewwork.steps.record import RECORD_ATTEMPT, RecordInput
    from crewwork.steps.step import Dead, Step, outcome
    from crewwork.steps.validate import VALIDATE, ValidateInput
    from crewwork.workflows.loop import Workspace, slim
    from crewwork.workflows.policies import SA_STATE

I = TypeVar("I", bound=BaseModel)  # noqa: E741
R = TypeVar("R")


async def execute(step: Step[I, R], inp: I, *, task_queue: str | None = None, summary: str | None = None) -> R:
    """Run one step as its policy says: a local activity of the workflow, or an activity on `task_queue` (None: the
    workflow's own), by the step's activity name, with its timeouts and retry policy."""
    if step.local:
        res = await workflow.execute_local_activity(
            step.name,
            inp,
            result_type=step.result,
            start_to_close_timeout=step.timeout(inp),
            retry_policy=step.retry,
            summary=summary,
        )
    else:
        res = await workflow.execute_activity(
            step.name,
            inp,
            result_type=step.result,
            task_queue=task_queue,
            start_to_close_timeout=step.timeout(inp),
            heartbeat_timeout=step.heartbeat,
            retry_policy=step.retry,
            summary=summary,
        )
    return cast(R, res)


class StepCalls:
    """Step calls and the workflow's own bookkeeping (the status the query answers, the state search attribute)."""

    _inp: WorkItemInput
    _step: int
    _queues: dict[str, str]
    _status: WorkItemStatus
    _continuing: bool
    _sa_state: str | None

    def _ref(self, step: int) -> dict[str, Any]:
        return {"work_item_id": self._inp.work_item_id, "tenant_id": self._inp.tenant_id, "step": step}

    def _next_step(self) -> int:
        self._step += 1
        return self._step

    async def _call(self, step: Step[I, R], make: Callable[[int], I], summary: str, *, what: str | None = None) -> R:
        """The one way the workflow runs a step: the next step number, the step's own policy, and its failure turned
        into what it means for the item (`crewwork.steps.step.outcome`; `what` names the step in that reason)."""
        inp = make(self._next_step())
        queue = self._queues[step.pool] if step.pool is not None and not step.local else None
        try:
            return await execute(step, inp, task_queue=queue, summary=summary)
        except ActivityError as exc:
            raise outcome(step, exc, what or summary) from exc

    async def _agent(self, attempt: int, *, diagnostics: str | None, review_comment: str | None) -> AgentOutcome:
        inp = self._inp
        return await self._call(
            RUN_AGENT,
            lambda step: AgentStepInput(
                **self._ref(step),
                attempt=attempt,
                spec=inp.spec,
                repo_path=inp.repo_path,
                base_commit=inp.base_commit,
                diagnostics=diagnostics,
                review_comment=review_comment,
            ),
            f"attempt {attempt}: agent {inp.spec.agent.name}",
            what=f"attempt {attempt}: agent",
        )

    async def _validate(self, attempt: int, outcome: AgentOutcome, review_comment: str | None) -> ValidationOutcome:
        inp = self._inp
        spec = inp.spec
        assert spec.validation is not None and inp.repo_path and inp.base_commit
        validation, repo_path, base_commit = spec.validation, inp.repo_path, inp.base_commit
        return await self._call(
            VALIDATE,
            lambda step: ValidateInput(
                **self._ref(step),
                attempt=attempt,
                repo_path=repo_path,
                base_commit=base_commit,
                validation=validation,
                sandbox=spec.sandbox,
                diff_ref=outcome.diff_ref,
                diff_stats=outcome.diff_stats,
                review_comment=review_comment,
                environment=spec.environment,
            ),
            f"attempt {attempt}: validate",
        )

    async def _record(self, record: RecordInput) -> list[str | None]:
        res = await self._call(
            RECORD_ATTEMPT,
            lambda step: record.model_copy(update={"step": step}),
            f"record attempt {record.attempt}",
        )
        if res.stale:
            raise Dead("attempt record refused: the item was written by a later step or has ended")
        return list(res.fingerprints)

    def _attempt(
        self,
        attempt: int,
        verdict: str,
        reason: str,
        *,
        cause: str | None = None,
        fingerprint: str | None = None,
        agent: AgentOutcome | None = None,
        validation: ValidationOutcome | None = None,
    ) -> RecordInput:
        """An attempt's record for the store, also kept (slimmed) in the status the query returns."""
        summary = AttemptSummary(number=attempt, agent=agent, validation=validation, verdict=verdict, reason=reason)
        self._status.attempts = [a for a in self._status.attempts if a.number != attempt] + [slim(summary)]
        return RecordInput(
            **self._ref(0),
            attempt=attempt,
            verdict=verdict,
            reason=reason,
            cause=cause,
            fingerprint=fingerprint,
            agent=agent,
            validation=validation,
        )

    async def _acquire_workspace(self) -> Workspace:
        """Wait durably (timers in the workflow, not polling in an activity) until the workspace is free."""
        inp = self._inp
        key = f"ws:{inp.repo_path}#{inp.spec.target_branch or (inp.spec.repo.ref if inp.spec.repo else '')}"
        delay = WORKSPACE_POLL
        announced = False
        while True:
            res = await self._call(
                ACQUIRE_WORKSPACE,
                lambda step: WorkspaceLeaseInput(**self._ref(step), key=key, ttl_s=WORKSPACE_LEASE_TTL_S),
                "take the workspace lease",
            )
            if res.grant is not None:
                return Workspace(key, int(res.grant))
            if not announced:
                self._set(WorkItemState.admitted, f"waiting for workspace held by {res.holder}")
                announced = True
            await workflow.sleep(delay)
            delay = min(delay * 2, WORKSPACE_POLL_MAX)

    async def _finish(
        self,
        state: WorkItemState,
        reason: str,
        *,
        output: dict | None = None,
        branch: str | None = None,
        commit: str | None = None,
        mock: bool = False,
        record: RecordInput | None = None,
        pull_request_url: str | None = None,
        review: ReviewRecord | None = None,
    ) -> WorkItemResult:
        result = WorkItemResult(
            work_item_id=self._inp.work_item_id,
            state=state,
            reason=reason,
            attempts=self._status.attempts,
            output=output,
            delivery_branch=branch,
            landed_commit=commit,
            mock=mock or self._inp.mock,
            pull_request_url=pull_request_url,
            review=review,
        )
        self._set(state, reason)
        await self._call(
            FINISH,
            lambda step: FinishInput(**self._ref(step), result=result, record=record),
            f"finish: {state.value}",
        )
        return result

    async def _safe_finish(self, state: WorkItemState, reason: str) -> None:
        try:
            await self._finish(state, reason)
        except Dead:
            workflow.logger.warning("could not record %s for %s", state, self._inp.work_item_id)

    async def _release(self, workspace: Workspace) -> None:
        try:
            await self._call(
                RELEASE_WORKSPACE,
                lambda step: ReleaseInput(**self._ref(step), key=workspace.key, grant=workspace.grant),
                "release the workspace lease",
            )
        except Dead:
            workflow.logger.warning("could not release %s; it expires on its own", workspace.key)

    async def _cleanup(self) -> None:
        try:
            await self._call(
                CLEANUP,
                lambda step: CleanupInput(**self._ref(step), repo_path=self._inp.repo_path),
                "remove worktrees",
            )
        except Dead:
            workflow.logger.warning("cleanup of %s failed", self._inp.work_item_id)

    async def _end(self, workspace: Workspace | None) -> None:
        """A code change's end in one local activity: the workspace lease given up (when it holds one), then the
        item's worktrees removed. Given up after retries, the lease expires on its own and the host's sweep removes
        what is left (crewwork/steps/sweep.py)."""
        try:
            await self._call(
                END,
                lambda step: CleanupInput(
                    **self._ref(step),
                    repo_path=self._inp.repo_path,
                    workspace_key=workspace.key if workspace is not None else None,
                    workspace_grant=workspace.grant if workspace is not None else None,
                ),
                "release the workspace lease, remove worktrees",
            )
        except Dead:
            workflow.logger.warning("the end of %s (lease release, cleanup) failed", self._inp.work_item_id)

    def _continue_as_new(self, carry: LoopCarry) -> None:
        self._continuing = True
        inp = self._inp
        workflow.continue_as_new(
            WorkItemInput(
                work_item_id=inp.work_item_id,
                tenant_id=inp.tenant_id,
                spec=inp.spec,
                repo_path=inp.repo_path,
                base_commit=inp.base_commit,
                mock=inp.mock,
                carry=carry.model_copy(update={"next_step": self._step + 1}),
            )
        )

    def _set(self, state: WorkItemState, detail: str, attempt: int | None = None, upsert: bool = True) -> None:
        """The status the query answers, the workflow's current details the Temporal Web UI shows (no history event),
        and the state search attribute (only when it changes: each upsert is a history event and a visibility write
        on the server)."""
        self._status.state = state
        self._status.detail = detail
        if attempt is not None:
            self._status.attempt = attempt
        workflow.set_current_details(current_details(self._inp, self._status))
        if not upsert or state.value == self._sa_state or not search_attributes_enabled():
            return
        self._sa_state = state.value
        workflow.upsert_search_attributes([SA_STATE.value_set(state.value)])


def current_details(inp: WorkItemInput, status: WorkItemStatus) -> str:
    """What the Temporal Web UI shows as the workflow's current details (markdown): the work item's own state, so
    an item that waits for review, or ended failed or rejected, does not read as just RUNNING or COMPLETED."""
    lines = [
        f"**crewwork state: {status.state.value.replace('_', ' ')}**",
        f"{clean_line(status.detail, 500)}",
        f"attempt {status.attempt} of at most {status.max_attempts}" if status.attempt else "",
    ]
    if status.state == WorkItemState.awaiting_review:
        lines.append(f"waiting for a person to approve, reject or request changes to attempt {status.attempt}")
    if status.reviews:
        lines.append(f"last review: {describe(status.reviews[-1])}")
    lines.append(f"work item `{inp.work_item_id}`")
    return "\n\n".join(line for line in lines if line)


def search_attributes_enabled() -> bool:
    # Upserting an attribute the namespace does not know fails the workflow task; only do it when the typed
    # attributes are present (registered at start by the API/dev server).
    return SA_STATE.name in {p.key.name for p in workflow.info().typed_search_attributes}
