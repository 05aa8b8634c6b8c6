"""How WorkItemWorkflow calls each step: the activity, its task queue, timeouts and retry policy, and the step
number every call takes (writes rank by (step, Temporal attempt), crewwork/store/fencing.py). A base class of the
workflow, so that crewwork/workflows/work_item.py reads as the lifecycle alone. Workflow code: deterministic."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from crewwork.activities.control import ControlActivities
    from crewwork.activities.errors import BAD_INPUT
    from crewwork.activities.execute import ExecuteActivities
    from crewwork.contracts import (
        AgentStepInput,
        CleanupInput,
        FinishInput,
        RecordInput,
        ReleaseInput,
        ValidateInput,
        WorkspaceLeaseInput,
    )
    from crewwork.models import (
        AgentOutcome,
        AttemptSummary,
        LoopCarry,
        ValidationOutcome,
        WorkItemInput,
        WorkItemResult,
        WorkItemState,
        WorkItemStatus,
    )
    from crewwork.workflows.policies import (
        AGENT_START_TO_CLOSE,
        CONTROL_RETRY,
        CONTROL_TIMEOUT,
        EXECUTION_HEARTBEAT,
        EXECUTION_RETRY,
        SA_STATE,
        VALIDATE_MARGIN,
        WORKSPACE_LEASE_TTL_S,
        WORKSPACE_POLL,
        WORKSPACE_POLL_MAX,
    )
    from crewwork.workflows.steps import (
        Dead,
        Workspace,
        cause,
        has_type,
        raise_item_failure,
        reraise_cancellation,
        slim,
        tries,
        validation_budget_s,
    )

R = TypeVar("R")
A = TypeVar("A")


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

    async def _local(self, fn: Callable[[Any, A], Awaitable[R]], make: Callable[[int], A], summary: str) -> R:
        """A control-pool store write as a local activity of this workflow: no task-queue round trip through the
        server, and far fewer history events."""
        try:
            return await workflow.execute_local_activity_method(
                fn,
                make(self._next_step()),
                start_to_close_timeout=CONTROL_TIMEOUT,
                retry_policy=CONTROL_RETRY,
                summary=summary,
            )
        except ActivityError as exc:
            reraise_cancellation(exc)
            raise_item_failure(exc, summary)
            raise Dead(f"{summary} failed after retries: {cause(exc)}") from exc

    async def _control(self, fn: Callable[[Any, A], Awaitable[R]], make: Callable[[int], A], summary: str) -> R:
        """A control-pool activity that does more than a store write (git), on the control task queue."""
        try:
            return await workflow.execute_activity_method(
                fn,
                make(self._next_step()),
                task_queue=self._queues["control"],
                start_to_close_timeout=CONTROL_TIMEOUT,
                retry_policy=CONTROL_RETRY,
                summary=summary,
            )
        except ActivityError as exc:
            reraise_cancellation(exc)
            raise_item_failure(exc, summary)
            raise Dead(f"{summary} failed after retries: {cause(exc)}") from exc

    async def _agent(self, attempt: int, *, diagnostics: str | None, review_comment: str | None) -> AgentOutcome:
        inp = self._inp
        try:
            return await workflow.execute_activity_method(
                ExecuteActivities.run_agent,
                AgentStepInput(
                    **self._ref(self._next_step()),
                    attempt=attempt,
                    spec=inp.spec,
                    repo_path=inp.repo_path,
                    base_commit=inp.base_commit,
                    diagnostics=diagnostics,
                    review_comment=review_comment,
                ),
                task_queue=self._queues["agent"],
                start_to_close_timeout=AGENT_START_TO_CLOSE,
                heartbeat_timeout=EXECUTION_HEARTBEAT,
                retry_policy=EXECUTION_RETRY,
                summary=f"attempt {attempt}: agent {inp.spec.agent.name}",
            )
        except ActivityError as exc:
            reraise_cancellation(exc)
            raise_item_failure(exc, f"attempt {attempt}: agent")
            if has_type(exc, BAD_INPUT):
                raise Dead(f"bad input: {cause(exc)}") from exc
            raise Dead(f"agent step failed{tries(exc)}: {cause(exc)}") from exc

    async def _validate(self, attempt: int, outcome: AgentOutcome, review_comment: str | None) -> ValidationOutcome:
        inp = self._inp
        spec = inp.spec
        assert spec.validation is not None and inp.repo_path and inp.base_commit
        try:
            return await workflow.execute_activity_method(
                ExecuteActivities.validate_change,
                ValidateInput(
                    **self._ref(self._next_step()),
                    attempt=attempt,
                    repo_path=inp.repo_path,
                    base_commit=inp.base_commit,
                    validation=spec.validation,
                    sandbox=spec.sandbox,
                    diff_ref=outcome.diff_ref,
                    diff_stats=outcome.diff_stats,
                    review_comment=review_comment,
                    environment=spec.environment,
                ),
                task_queue=self._queues["validate"],
                start_to_close_timeout=timedelta(seconds=validation_budget_s(inp)) + VALIDATE_MARGIN,
                heartbeat_timeout=EXECUTION_HEARTBEAT,
                retry_policy=EXECUTION_RETRY,
                summary=f"attempt {attempt}: validate",
            )
        except ActivityError as exc:
            reraise_cancellation(exc)
            raise_item_failure(exc, f"attempt {attempt}: validate")
            raise Dead(f"validation failed{tries(exc)}: {cause(exc)}") from exc

    async def _record(self, record: RecordInput) -> list[str | None]:
        res = await self._local(
            ControlActivities.record_attempt,
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
            res = await self._local(
                ControlActivities.acquire_workspace,
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
        )
        self._set(state, reason)
        await self._local(
            ControlActivities.finish,
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
            await self._local(
                ControlActivities.release_workspace,
                lambda step: ReleaseInput(**self._ref(step), key=workspace.key, grant=workspace.grant),
                "release the workspace lease",
            )
        except Dead:
            workflow.logger.warning("could not release %s; it expires on its own", workspace.key)

    async def _cleanup(self) -> None:
        try:
            await self._control(
                ControlActivities.cleanup,
                lambda step: CleanupInput(**self._ref(step), repo_path=self._inp.repo_path),
                "remove worktrees",
            )
        except Dead:
            workflow.logger.warning("cleanup of %s failed", self._inp.work_item_id)

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
        """The status the query answers, and the state search attribute (only when it changes: each upsert is a
        history event and a visibility write on the server)."""
        self._status.state = state
        self._status.detail = detail
        if attempt is not None:
            self._status.attempt = attempt
        if not upsert or state.value == self._sa_state or not _search_attributes_enabled():
            return
        self._sa_state = state.value
        workflow.upsert_search_attributes([SA_STATE.value_set(state.value)])


def _search_attributes_enabled() -> bool:
    # Upserting an attribute the namespace does not know fails the workflow task; only do it when the typed
    # attributes are present (registered at start by the API/dev server).
    return SA_STATE.name in {p.key.name for p in workflow.info().typed_search_attributes}
