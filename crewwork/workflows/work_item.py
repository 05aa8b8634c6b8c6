"""WorkItemWorkflow: the lifecycle of one work item, and the single authority on its progress.

admit -> (code changes: wait for the workspace lease) -> attempt loop [agent -> validate -> record] ->
optional review -> land on `crewwork/<id>` -> finish -> release and clean up.

Deterministic code only: no I/O, no clock, no randomness. Everything that touches the world is an activity, routed
to its pool's task queue. Long loops continue-as-new with their state carried over, and the same-cause breaker is
fed from the persisted attempt history, so neither a restart nor continue-as-new resets it.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from crewwork.contracts import (
        AdmitInput,
        AgentStepInput,
        CleanupInput,
        FinishInput,
        LandInput,
        RecordInput,
        ReleaseInput,
        SetStateInput,
        ValidateInput,
        WorkspaceLeaseInput,
    )
    from crewwork.limits import Limits, LoopState
    from crewwork.models import (
        AgentOutcome,
        AttemptSummary,
        LoopCarry,
        ReviewDecision,
        ValidationOutcome,
        WorkItemInput,
        WorkItemKind,
        WorkItemResult,
        WorkItemState,
        WorkItemStatus,
    )

# ---------------------------------------------------------------- timeouts and retry policies (docs/reliability.md)

NON_RETRYABLE = ["BadInput", "AgentError", "AgentConfigError", "LandingConflict", "StaleWrite", "RepositoryError"]
# Failures that are the work item's, not the machinery's: the item ends `failed` with the message (which names the
# remote), never `dead` (RepositoryUnavailable only once its retries are exhausted).
ITEM_FAILURES = ("RepositoryError", "RepositoryUnavailable", "LandingConflict", "PullRequestFailed")

CONTROL_TIMEOUT = timedelta(seconds=30)
CONTROL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=8,
    non_retryable_error_types=NON_RETRYABLE,
)
AGENT_START_TO_CLOSE = timedelta(minutes=30)
AGENT_HEARTBEAT = timedelta(seconds=10)
AGENT_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
    non_retryable_error_types=NON_RETRYABLE,
)
VALIDATE_MARGIN = timedelta(minutes=2)
VALIDATE_HEARTBEAT = timedelta(seconds=10)
VALIDATE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
    non_retryable_error_types=NON_RETRYABLE,
)
WORKSPACE_POLL = timedelta(seconds=2)
WORKSPACE_POLL_MAX = timedelta(seconds=30)
WORKSPACE_LEASE_TTL_S = 600.0
BREAKER_K = 3
# While awaiting review, renew the workspace lease this often (well inside its TTL).
WORKSPACE_RENEW_EVERY = timedelta(seconds=120)
PATCH_RENEW_WORKSPACE_IN_REVIEW = "renew-workspace-during-review"
# Control-pool store writes as local activities (executions recorded before this patch replay the old way).
PATCH_LOCAL_CONTROL = "local-control-activities"
LOCAL_CONTROL_ACTIVITIES = frozenset(
    {"admit", "set_state", "acquire_workspace", "renew_workspace", "release_workspace", "record_attempt", "finish"}
)
# New executions (one marker instead of two): local control activities as above, no search-attribute upsert for
# transient states (`admitted` right after admission, a state equal to the last one upserted; each upsert is a
# history event and a visibility write on the server), and a `task` item's passing attempt is recorded by `finish` in
# the same write as the result. Histories recorded before replay the old way.
PATCH_LEAN_HISTORY = "lean-history"
# Attempts per workflow run before continue-as-new (Temporal may suggest it sooner).
ATTEMPTS_PER_RUN = 20

SA_STATE = SearchAttributeKey.for_keyword("CrewworkState")
SA_KIND = SearchAttributeKey.for_keyword("CrewworkKind")
SA_TENANT = SearchAttributeKey.for_keyword("CrewworkTenant")
SA_REPO = SearchAttributeKey.for_keyword("CrewworkRepo")


class _Dead(Exception):
    """Infrastructure retries are exhausted: the item ends `dead` with the last error."""


class _Failed(Exception):
    """The repository or the landing refused the item (see ITEM_FAILURES): the item ends `failed`."""


@workflow.defn(name="WorkItemWorkflow")
class WorkItemWorkflow:
    def __init__(self) -> None:
        self._status: WorkItemStatus | None = None
        self._review: ReviewDecision | None = None
        self._awaiting_review = False
        self._queues: dict[str, str] = {}
        self._continuing = False
        self._local_control = False
        self._lean = False
        self._sa_state: str | None = None

    # ------------------------------------------------------------------ interface

    @workflow.query
    def status(self) -> WorkItemStatus:
        assert self._status is not None
        return self._status

    @workflow.update
    async def review(self, decision: ReviewDecision) -> str:
        self._review = decision
        self._awaiting_review = False
        return f"review recorded: {decision.action}"

    @review.validator
    def _validate_review(self, decision: ReviewDecision) -> None:
        if not self._awaiting_review or self._review is not None:
            state = self._status.state.value if self._status else "starting"
            raise ValueError(f"this work item is not awaiting review (state: {state})")
        if decision.action == "request_changes" and not (decision.comment or "").strip():
            raise ValueError("request_changes needs a comment for the agent")

    # ------------------------------------------------------------------ lifecycle

    @workflow.run
    async def run(self, inp: WorkItemInput) -> WorkItemResult:
        spec = inp.spec
        # `or` keeps new executions at one patch marker: `lean-history` implies local control activities.
        self._lean = workflow.patched(PATCH_LEAN_HISTORY)
        self._local_control = self._lean or workflow.patched(PATCH_LOCAL_CONTROL)
        prefix = workflow.info().task_queue.rsplit("-", 1)[0]
        self._queues = {p: f"{prefix}-{p}" for p in ("control", "agent", "validate")}
        carry = inp.carry or LoopCarry()
        self._status = WorkItemStatus(
            work_item_id=inp.work_item_id,
            state=WorkItemState.admitted,
            attempt=carry.next_attempt - 1,
            max_attempts=spec.budget.max_attempts,
        )
        ws_key: str | None = None
        ws_token: int | None = None
        try:
            admit = await self._control(
                "admit", AdmitInput(work_item_id=inp.work_item_id, tenant_id=inp.tenant_id, spec=spec)
            )
            if not admit.admitted:
                return await self._finish(inp, WorkItemState.failed, f"not admitted: {admit.reason}")
            self._set(WorkItemState.admitted, "admitted", upsert=not self._lean)
            if spec.kind == WorkItemKind.task:
                return await self._run_task(inp, carry)
            assert spec.repo is not None and inp.repo_path and inp.base_commit
            ws_key = f"ws:{inp.repo_path}#{spec.target_branch or spec.repo.ref}"
            ws_token = await self._acquire_workspace(inp, ws_key)
            return await self._run_code_change(inp, carry, admit.past_fingerprints, ws_key, ws_token)
        except asyncio.CancelledError:
            # Cancellation: record it and release what we hold; these activities run after the cancel was
            # delivered, so they are not cancelled themselves.
            await self._safe_finish(inp, WorkItemState.cancelled, "cancelled by request")
            raise
        except _Dead as exc:
            return await self._finish(inp, WorkItemState.dead, str(exc))
        except _Failed as exc:
            return await self._finish(inp, WorkItemState.failed, str(exc))
        finally:
            if ws_key is not None and not self._continuing:
                await self._release(inp, ws_key, ws_token)
            if not self._continuing and spec.kind != WorkItemKind.task:
                await self._cleanup(inp)

    async def _run_task(self, inp: WorkItemInput, carry: LoopCarry) -> WorkItemResult:
        spec = inp.spec
        last_error = ""
        for attempt in range(carry.next_attempt, spec.budget.max_attempts + 1):
            self._set(WorkItemState.running, f"attempt {attempt}", attempt=attempt)
            outcome = await self._agent(inp, attempt, None, None)
            if outcome.stale:
                raise _Dead("superseded by a newer writer")
            verdict = "passed" if outcome.error is None else "failed"
            reason = "agent returned its output" if outcome.error is None else f"agent error: {outcome.error}"
            if self._lean and outcome.error is None:
                # The attempt's record and the item's result in one write: one local activity, one transaction.
                record = self._attempt(inp, attempt, verdict, reason, None, None, outcome, None)
                return await self._finish(
                    inp,
                    WorkItemState.succeeded,
                    "task completed",
                    output=outcome.output,
                    mock=outcome.mock,
                    record=record,
                )
            await self._record(
                self._attempt(
                    inp, attempt, verdict, reason, None if verdict == "passed" else "agent_error", None, outcome, None
                )
            )
            if outcome.error is None:
                return await self._finish(
                    inp, WorkItemState.succeeded, "task completed", output=outcome.output, mock=outcome.mock
                )
            last_error = outcome.error
        return await self._finish(
            inp, WorkItemState.failed, f"budget: {spec.budget.max_attempts} attempts used; last: {last_error}"
        )

    async def _run_code_change(
        self,
        inp: WorkItemInput,
        carry: LoopCarry,
        past_fingerprints: list[str | None],
        ws_key: str,
        ws_token: int | None,
    ) -> WorkItemResult:
        spec = inp.spec
        assert spec.validation is not None and inp.repo_path and inp.base_commit
        diagnostics = carry.diagnostics_ref
        review_comment = carry.review_comment
        fingerprints = list(past_fingerprints)
        passed: tuple[AgentOutcome, ValidationOutcome] | None = None
        attempt = carry.next_attempt
        mock = False
        limits = Limits.from_spec(spec.budget, breaker_k=BREAKER_K)
        started_at = carry.started_at_s if carry.started_at_s is not None else workflow.now().timestamp()
        tokens, cost = carry.tokens_used, carry.cost_usd
        while passed is None:
            hit = limits.check(
                LoopState(
                    attempts_made=attempt - 1,
                    now_s=workflow.now().timestamp(),
                    started_at_s=started_at,
                    tokens_used=tokens,
                    cost_usd=cost,
                    fingerprints=tuple(fingerprints),
                )
            )
            if hit is not None:
                reason = hit.reason if hit.reason.startswith(f"{hit.kind}:") else f"{hit.kind}: {hit.reason}"
                return await self._finish(inp, WorkItemState.failed, reason, mock=mock)
            if workflow.info().is_continue_as_new_suggested() or attempt - carry.next_attempt >= ATTEMPTS_PER_RUN:
                # Keep each run's history small however long the loop: start afresh with the loop state carried.
                self._continuing = True
                workflow.continue_as_new(
                    WorkItemInput(
                        work_item_id=inp.work_item_id,
                        tenant_id=inp.tenant_id,
                        spec=spec,
                        repo_path=inp.repo_path,
                        base_commit=inp.base_commit,
                        carry=LoopCarry(
                            next_attempt=attempt,
                            diagnostics_ref=diagnostics,
                            review_comment=review_comment,
                            started_at_s=started_at,
                            tokens_used=tokens,
                            cost_usd=cost,
                        ),
                    )
                )
            self._set(WorkItemState.running, f"attempt {attempt}: agent running", attempt=attempt)
            outcome = await self._agent(inp, attempt, diagnostics, review_comment)
            mock = mock or outcome.mock
            tokens += outcome.tokens_used
            cost += outcome.cost_usd
            if outcome.stale:
                raise _Dead("superseded by a newer writer")
            if outcome.error is not None:
                fingerprints = await self._record(
                    self._attempt(
                        inp,
                        attempt,
                        "failed",
                        f"agent error: {outcome.error}",
                        "agent_error",
                        "agent_error",
                        outcome,
                        None,
                    )
                )
                diagnostics = f"Attempt {attempt} failed: the agent reported an error: {outcome.error}"
                attempt += 1
                continue
            self._set(WorkItemState.validating, f"attempt {attempt}: validating", attempt=attempt)
            validation = await self._validate(inp, attempt, outcome, review_comment)
            if validation.stale:
                raise _Dead("superseded by a newer writer")
            verdict = "passed" if validation.passed else "failed"
            fingerprints = await self._record(
                self._attempt(
                    inp,
                    attempt,
                    verdict,
                    validation.reason,
                    validation.cause,
                    validation.fingerprint,
                    outcome,
                    validation,
                )
            )
            if validation.passed:
                passed = (outcome, validation)
                break
            diagnostics = validation.diagnostics or validation.reason
            review_comment = None
            attempt += 1
        agent_out, _val = passed
        if spec.review.required:
            decision = await self._await_review(inp, spec.review.timeout_s, ws_key, ws_token)
            if decision is None:
                return await self._finish(inp, WorkItemState.failed, "review timed out", mock=mock)
            if decision.action == "reject":
                return await self._finish(
                    inp,
                    WorkItemState.rejected,
                    f"rejected by reviewer: {decision.comment or ''}".strip(),
                    mock=mock,
                )
            if decision.action == "request_changes":
                self._review = None
                # A reviewer's "no" is not a same-cause failure: it breaks any run the breaker counts.
                fingerprints.append(None)
                return await self._run_code_change(
                    inp,
                    LoopCarry(
                        next_attempt=attempt + 1,
                        diagnostics_ref=None,
                        review_comment=decision.comment,
                        started_at_s=started_at,
                        tokens_used=tokens,
                        cost_usd=cost,
                    ),
                    fingerprints,
                    ws_key,
                    ws_token,
                )
        assert agent_out.diff_ref is not None
        self._set(WorkItemState.landing, "landing", attempt=attempt)
        landed = await self._control(
            "land_change",
            LandInput(
                work_item_id=inp.work_item_id,
                tenant_id=inp.tenant_id,
                repo_path=inp.repo_path,
                base_commit=inp.base_commit,
                diff_ref=agent_out.diff_ref,
                message=_commit_message(inp, attempt),
                workspace_key=ws_key,
                workspace_token=ws_token,
                pull_request=spec.repo.pull_request if spec.repo else None,
                ref=spec.repo.ref if spec.repo else None,
            ),
        )
        self._status.delivery_branch = landed.branch  # type: ignore[union-attr]
        self._status.landed_commit = landed.commit  # type: ignore[union-attr]
        self._status.pull_request_url = landed.pull_request_url  # type: ignore[union-attr]
        pr = f" (pull request {landed.pull_request_url})" if landed.pull_request_url else ""
        return await self._finish(
            inp,
            WorkItemState.succeeded,
            f"validated on attempt {attempt} and landed on {landed.branch}{pr}",
            branch=landed.branch,
            commit=landed.commit,
            mock=mock,
            pull_request_url=landed.pull_request_url,
        )

    # ------------------------------------------------------------------ steps

    async def _control(self, name: str, arg: object, result_type: type | None = None) -> Any:
        try:
            if self._local_control and name in LOCAL_CONTROL_ACTIVITIES:
                # Short store writes run as local activities in the control worker that runs this workflow:
                # no task-queue round trip through the server, and far fewer history events.
                return await workflow.execute_local_activity(
                    name,
                    arg,
                    start_to_close_timeout=CONTROL_TIMEOUT,
                    retry_policy=CONTROL_RETRY,
                    result_type=result_type or _RESULT_TYPES[name],
                )
            return await workflow.execute_activity(
                name,
                arg,
                task_queue=self._queues["control"],
                start_to_close_timeout=CONTROL_TIMEOUT,
                retry_policy=CONTROL_RETRY,
                result_type=result_type or _RESULT_TYPES[name],
            )
        except ActivityError as exc:
            _reraise_cancellation(exc)
            _raise_item_failure(exc, name)
            raise _Dead(f"{name} failed after retries: {_cause(exc)}") from exc

    async def _agent(
        self, inp: WorkItemInput, attempt: int, diagnostics: str | None, review_comment: str | None
    ) -> AgentOutcome:
        try:
            return await workflow.execute_activity(
                "run_agent",
                AgentStepInput(
                    work_item_id=inp.work_item_id,
                    tenant_id=inp.tenant_id,
                    attempt=attempt,
                    spec=inp.spec,
                    repo_path=inp.repo_path,
                    base_commit=inp.base_commit,
                    diagnostics=diagnostics,
                    review_comment=review_comment,
                ),
                task_queue=self._queues["agent"],
                start_to_close_timeout=AGENT_START_TO_CLOSE,
                heartbeat_timeout=AGENT_HEARTBEAT,
                retry_policy=AGENT_RETRY,
                result_type=AgentOutcome,
            )
        except ActivityError as exc:
            _reraise_cancellation(exc)
            _raise_item_failure(exc, "run_agent")
            if _is_non_retryable(exc, "BadInput"):
                raise _Dead(f"bad input: {_cause(exc)}") from exc
            raise _Dead(f"agent step failed after {AGENT_RETRY.maximum_attempts} tries: {_cause(exc)}") from exc

    async def _validate(
        self, inp: WorkItemInput, attempt: int, outcome: AgentOutcome, review_comment: str | None
    ) -> ValidationOutcome:
        spec = inp.spec
        assert spec.validation is not None and inp.repo_path and inp.base_commit
        try:
            return await workflow.execute_activity(
                "validate_change",
                ValidateInput(
                    work_item_id=inp.work_item_id,
                    tenant_id=inp.tenant_id,
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
                start_to_close_timeout=timedelta(seconds=_validation_budget_s(inp)) + VALIDATE_MARGIN,
                heartbeat_timeout=VALIDATE_HEARTBEAT,
                retry_policy=VALIDATE_RETRY,
                result_type=ValidationOutcome,
            )
        except ActivityError as exc:
            _reraise_cancellation(exc)
            _raise_item_failure(exc, "validate_change")
            raise _Dead(f"validation failed after {VALIDATE_RETRY.maximum_attempts} tries: {_cause(exc)}") from exc

    async def _record(self, record: RecordInput) -> list[str | None]:
        res = await self._control("record_attempt", record)
        if res.stale:
            raise _Dead("attempt record superseded by a newer writer")
        return list(res.fingerprints)

    def _attempt(
        self,
        inp: WorkItemInput,
        attempt: int,
        verdict: str,
        reason: str,
        cause: str | None,
        fingerprint: str | None,
        agent: AgentOutcome | None,
        validation: ValidationOutcome | None,
    ) -> RecordInput:
        """An attempt's record for the store, also kept (slimmed) in the status the query returns."""
        summary = AttemptSummary(number=attempt, agent=agent, validation=validation, verdict=verdict, reason=reason)
        assert self._status is not None
        self._status.attempts = [a for a in self._status.attempts if a.number != attempt] + [_slim(summary)]
        return RecordInput(
            work_item_id=inp.work_item_id,
            tenant_id=inp.tenant_id,
            attempt=attempt,
            verdict=verdict,
            reason=reason,
            cause=cause,
            fingerprint=fingerprint,
            agent=agent,
            validation=validation,
        )

    async def _acquire_workspace(self, inp: WorkItemInput, key: str) -> int | None:
        """Wait durably (timers in the workflow, not polling in an activity) until the workspace is free."""
        delay = WORKSPACE_POLL
        announced = False
        while True:
            res = await self._control(
                "acquire_workspace",
                WorkspaceLeaseInput(
                    work_item_id=inp.work_item_id,
                    tenant_id=inp.tenant_id,
                    key=key,
                    ttl_s=WORKSPACE_LEASE_TTL_S,
                ),
            )
            if res.token is not None:
                return int(res.token)
            if not announced:
                self._set(WorkItemState.admitted, f"waiting for workspace held by {res.holder}")
                announced = True
            await workflow.sleep(delay)
            delay = min(delay * 2, WORKSPACE_POLL_MAX)

    async def _await_review(
        self, inp: WorkItemInput, timeout_s: float | None, ws_key: str | None = None, ws_token: int | None = None
    ) -> ReviewDecision | None:
        self._review = None
        self._awaiting_review = True
        self._set(WorkItemState.awaiting_review, "awaiting review")
        await self._control(
            "set_state",
            SetStateInput(
                work_item_id=inp.work_item_id,
                tenant_id=inp.tenant_id,
                state=WorkItemState.awaiting_review,
                reason="validated; awaiting review",
            ),
        )
        if ws_key is not None and workflow.patched(PATCH_RENEW_WORKSPACE_IN_REVIEW):
            # A review can outlast the workspace lease: renew it on a timer so no other item takes the branch.
            decided = await self._wait_review_renewing(inp, timeout_s, ws_key, ws_token)
        else:
            try:
                await workflow.wait_condition(
                    lambda: self._review is not None,
                    timeout=timedelta(seconds=timeout_s) if timeout_s else None,
                )
                decided = True
            except TimeoutError:
                decided = False
        self._awaiting_review = False
        return self._review if decided else None

    async def _wait_review_renewing(
        self, inp: WorkItemInput, timeout_s: float | None, ws_key: str, ws_token: int | None
    ) -> bool:
        deadline = workflow.now() + timedelta(seconds=timeout_s) if timeout_s else None
        while self._review is None:
            wait = WORKSPACE_RENEW_EVERY
            if deadline is not None:
                remaining = deadline - workflow.now()
                if remaining <= timedelta(0):
                    return False
                wait = min(wait, remaining)
            try:
                await workflow.wait_condition(lambda: self._review is not None, timeout=wait)
            except TimeoutError:
                if deadline is not None and workflow.now() >= deadline:
                    return False
                await self._control(
                    "renew_workspace",
                    ReleaseInput(work_item_id=inp.work_item_id, tenant_id=inp.tenant_id, key=ws_key, token=ws_token),
                )
        return True

    async def _finish(
        self,
        inp: WorkItemInput,
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
        assert self._status is not None
        result = WorkItemResult(
            work_item_id=inp.work_item_id,
            state=state,
            reason=reason,
            attempts=self._status.attempts,
            output=output,
            delivery_branch=branch,
            landed_commit=commit,
            mock=mock,
            pull_request_url=pull_request_url,
        )
        self._set(state, reason)
        await self._control(
            "finish", FinishInput(work_item_id=inp.work_item_id, tenant_id=inp.tenant_id, result=result, record=record)
        )
        return result

    async def _safe_finish(self, inp: WorkItemInput, state: WorkItemState, reason: str) -> None:
        try:
            await self._finish(inp, state, reason)
        except _Dead:
            workflow.logger.warning("could not record %s for %s", state, inp.work_item_id)

    async def _release(self, inp: WorkItemInput, key: str, token: int | None) -> None:
        try:
            await self._control(
                "release_workspace",
                ReleaseInput(work_item_id=inp.work_item_id, tenant_id=inp.tenant_id, key=key, token=token),
            )
        except _Dead:
            workflow.logger.warning("could not release %s; it expires on its own", key)

    async def _cleanup(self, inp: WorkItemInput) -> None:
        try:
            await self._control(
                "cleanup",
                CleanupInput(work_item_id=inp.work_item_id, tenant_id=inp.tenant_id, repo_path=inp.repo_path),
            )
        except _Dead:
            workflow.logger.warning("cleanup of %s failed", inp.work_item_id)

    def _set(self, state: WorkItemState, detail: str, attempt: int | None = None, upsert: bool = True) -> None:
        assert self._status is not None
        self._status.state = state
        self._status.detail = detail
        if attempt is not None:
            self._status.attempt = attempt
        if self._lean and (not upsert or state.value == self._sa_state):
            return
        self._sa_state = state.value
        if _search_attributes_enabled():
            try:
                workflow.upsert_search_attributes([SA_STATE.value_set(state.value)])
            except Exception:
                pass


def _search_attributes_enabled() -> bool:
    # Upserting an attribute the namespace does not know fails the workflow task; only do it when the typed
    # attributes are present (registered at start by the API/dev server).
    return SA_STATE.name in {p.key.name for p in workflow.info().typed_search_attributes}


def _slim(summary: AttemptSummary) -> AttemptSummary:
    """The status query keeps summaries small: no test lists or diagnostics."""
    s = summary.model_copy(deep=True)
    if s.validation is not None:
        s.validation.tests = s.validation.tests[:20]
        s.validation.diagnostics = None
    return s


def _commit_message(inp: WorkItemInput, attempt: int) -> str:
    title = (inp.spec.instruction or "change").strip().splitlines()[0][:72]
    return (
        f"{title}\n\ncrewwork work item {inp.work_item_id}, validated on attempt {attempt}.\n"
        f"Crewwork-Work-Item: {inp.work_item_id}\n"
    )


def _cause(exc: BaseException) -> str:
    cur: BaseException | None = exc
    msg = str(exc)
    while cur is not None:
        if isinstance(cur, ApplicationError):
            return f"{cur.type or 'error'}: {cur.message}"
        msg = str(cur) or msg
        cur = cur.__cause__
    return msg


def _reraise_cancellation(exc: ActivityError) -> None:
    """A cancelled workflow sees its running activity fail with a cancelled cause: that is the cancellation itself,
    not an infrastructure failure, so it must reach `run`'s cancellation handler (ending `cancelled`, not `dead`)."""
    if is_cancelled_exception(exc):
        raise asyncio.CancelledError(str(exc)) from exc


def _raise_item_failure(exc: BaseException, step: str) -> None:
    """An ITEM_FAILURES error (a repository or landing refusal) ends the item `failed`, with its message."""
    cur: BaseException | None = exc
    while cur is not None:
        if isinstance(cur, ApplicationError) and cur.type in ITEM_FAILURES:
            raise _Failed(f"{step}: {cur.type}: {cur.message}") from exc
        cur = cur.__cause__


def _validation_budget_s(inp: WorkItemInput) -> float:
    """Start-to-close budget of one validation: its run, each setup command, and the environment's setup."""
    v = inp.spec.validation
    assert v is not None
    total = v.timeout_s * (1 + len(v.setup))
    env = inp.spec.environment
    if env is not None:
        total += env.setup_timeout_s * (len(env.setup) + (1 if env.python else 0))
    return total


def _is_non_retryable(exc: BaseException, type_: str) -> bool:
    cur: BaseException | None = exc
    while cur is not None:
        if isinstance(cur, ApplicationError) and cur.type == type_:
            return True
        cur = cur.__cause__
    return False


def _result_types() -> dict[str, type]:
    from crewwork.contracts import AdmitResult, LandResult, RecordResult, WorkspaceLeaseResult, WriteOutcome

    return {
        "admit": AdmitResult,
        "set_state": WriteOutcome,
        "acquire_workspace": WorkspaceLeaseResult,
        "release_workspace": bool,
        "renew_workspace": bool,
        "record_attempt": RecordResult,
        "land_change": LandResult,
        "finish": WriteOutcome,
        "cleanup": type(None),
    }


with workflow.unsafe.imports_passed_through():
    _RESULT_TYPES = _result_types()
