"""WorkItemWorkflow: the lifecycle of one work item, and the single authority on its progress.

    admission (decided before the workflow starts, crewwork/admission/starts.py: then the input carries its terms; else
              the admit step, queued while the tenant is at its in-flight limit)
      -> task:        agent attempts until one returns its output, then finish
      -> code change: workspace lease -> repair until pass [agent -> validate -> record] -> review gate -> land
                      -> finish -> release the workspace and clean up

Deterministic code only: no I/O, no clock, no randomness. Everything that touches the world is a step (crewwork/steps/),
run through the one call path (`StepCalls._call`) by its declared policy: its pool's task queue or a local activity
of this workflow, its timeouts and retries, and what its failure means for the item.
Every activity call gets the next step number: an attempt's writes rank by (step, Temporal attempt), so whatever
Temporal scheduled later outranks it (crewwork/store/fencing/rule.py). Long loops continue as new with their state and
the step counter carried over; the same-cause breaker is fed from the persisted attempt history, so neither a
restart nor continue-as-new resets it.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from crewwork.models import (
        AgentOutcome,
        LoopCarry,
        ReviewDecision,
        ReviewRecord,
        WorkItemInput,
        WorkItemKind,
        WorkItemResult,
        WorkItemState,
        WorkItemStatus,
    )
    from crewwork.models.limits import DEFAULT_BREAKER_K, Limits
    from crewwork.models.pools import POOLS
    from crewwork.models.review import missing_words, review_input, slim_review, who
    from crewwork.steps.admit import ADMIT, AdmitInput, AdmitResult
    from crewwork.steps.land import LAND, LandInput
    from crewwork.steps.lease import RENEW_WORKSPACE, ReleaseInput
    from crewwork.steps.record import RecordInput
    from crewwork.steps.review import RECORD_REVIEW, RecordReviewInput
    from crewwork.steps.state import SET_STATE, SetStateInput
    from crewwork.steps.step import Dead, Failed
    from crewwork.workflows.calls import StepCalls, search_attributes_enabled
    from crewwork.workflows.loop import (
        RepairLoop,
        Workspace,
        commit_message,
        submission_fault,
    )
    from crewwork.workflows.policies import (
        ATTEMPTS_PER_RUN,
        QUEUE_POLL,
        QUEUE_POLL_MAX,
        REVIEW_LEASE_TTL_S,
        REVIEW_RENEW_EVERY,
        REVIEWS_IN_STATUS,
        SA_STATE,
    )


# workflow.patched marker: items sent back by reviewers are admitted again (histories from before it went on
# without admission, and replay the same way).
READMIT_AFTER_REVIEW = "readmit-after-review"
# workflow.patched marker: a validation whose command (or a setup command) does not exist ends the item at once
# (loop.submission_fault); histories from before it went on to the next attempt, and replay the same way.
SUBMISSION_FAULT_ENDS_ITEM = "submission-fault-ends-item"
# workflow.patched marker: a reviewer's decision is recorded as the item's `review_decided` event (one local activity
# after the decision); histories from before it went straight on, and replay the same way.
REVIEW_RECORDED = "review-recorded"
# workflow.patched marker: a code change ends in one local activity (`_end`: the lease released, the worktrees removed),
# and a passing attempt that awaits review is recorded by the `awaiting_review` write; histories from before it
# released in a local activity, cleaned up in an activity on the control task queue and recorded the attempt in a
# local activity of its own, and replay the same way. Asked only by code changes: a task's history has no marker.
LEAN_END = "lean-end"


@workflow.defn(name="WorkItemWorkflow")
class WorkItemWorkflow(StepCalls):
    @workflow.init
    def __init__(self, inp: WorkItemInput) -> None:
        self._inp = inp
        self._carry = inp.carry or LoopCarry()
        self._step = self._carry.next_step - 1
        prefix = workflow.info().task_queue.rsplit("-", 1)[0]
        self._queues = {p: f"{prefix}-{p}" for p in POOLS}
        self._status = WorkItemStatus(
            work_item_id=inp.work_item_id,
            state=WorkItemState.submitted,
            attempt=self._carry.next_attempt - 1,
            max_attempts=inp.spec.budget.max_attempts,
        )
        self._review: ReviewDecision | None = None
        self._review_at: float | None = None
        self._awaiting_review = False
        # The attempt awaiting review and the SHA-256 of its diff: what a decision is about, and what the validator
        # compares a decision's `attempt` and `diff_sha256` with (a reviewer who saw another attempt is refused).
        self._review_attempt: int | None = None
        self._review_diff: str | None = None
        self._last_review: ReviewRecord | None = None
        # The passing attempt's record, written by the `awaiting_review` state change that follows it (patch
        # `lean-end`: one local activity and one transaction where there were two).
        self._unrecorded: RecordInput | None = None
        self._slot_freed = False
        self._handed_off = False
        self._continuing = False
        # The state attribute it was started with (crewwork/admission/starts.py: an admitted task starts as `running`), so the
        # first state change to the same value costs no upsert.
        self._sa_state: str | None = (
            workflow.info().typed_search_attributes.get(SA_STATE) if search_attributes_enabled() else None
        )

    # ------------------------------------------------------------------ interface

    @workflow.query
    def status(self) -> WorkItemStatus:
        return self._status

    @workflow.update
    async def review(self, decision: ReviewDecision) -> str:
        self._review = decision
        self._review_at = workflow.now().timestamp()
        self._awaiting_review = False
        return f"review recorded: {decision.action}"

    @review.validator
    def _validate_review(self, decision: ReviewDecision) -> None:
        if not self._awaiting_review or self._review is not None:
            raise ValueError(f"this work item is not awaiting review (state: {self._status.state.value})")
        waiting = self._review_attempt
        if decision.attempt is not None and waiting is not None and decision.attempt != waiting:
            raise ValueError(
                f"stale review: this decision is about attempt {decision.attempt}, but attempt {waiting} is the one "
                f"awaiting review; look at attempt {waiting}'s change and decide again"
            )
        if decision.diff_sha256 and self._review_diff and decision.diff_sha256 != self._review_diff:
            raise ValueError(
                f"stale review: the change you saw (diff sha256 {decision.diff_sha256[:12]}…) is not attempt "
                f"{waiting}'s (sha256 {self._review_diff[:12]}…); look at it again and decide again"
            )
        refusal = missing_words(decision)
        if refusal is not None:
            raise ValueError(refusal)

    @workflow.signal
    def slot_freed(self) -> None:
        """One of the tenant's items ended: a queued item re-runs admission now instead of at its next poll. (What
        control pools before the hand-off sent; still honoured during a rolling upgrade.)"""
        self._slot_freed = True

    @workflow.signal
    def admitted(self) -> None:
        """The place of one of the tenant's items that ended was handed to this queued item, in that item's write
        (`hand_off` in crewwork/store/fencing/reference.py): it is admitted in the store already and goes on without
        asking again."""
        self._handed_off = True

    # ------------------------------------------------------------------ lifecycle

    @workflow.run
    async def run(self, inp: WorkItemInput) -> WorkItemResult:
        workspace: Workspace | None = None
        try:
            if inp.admission is not None and inp.carry is None:
                # Admitted before it started (crewwork/admission/starts.py): in the store already, under these terms.
                admitted = AdmitResult(
                    admitted=True, budget=inp.admission.budget, review_timeout_s=inp.admission.review_timeout_s
                )
                self._set(WorkItemState.admitted, "admitted", upsert=False)
            else:
                admitted = await self._admission()
            if not admitted.admitted:
                return await self._finish(WorkItemState.failed, f"not admitted: {admitted.reason}")
            if inp.spec.kind == WorkItemKind.task:
                return await self._run_task(admitted)
            if inp.spec.kind == WorkItemKind.pr_review:
                return await self._run_pr_review(admitted)
            workspace = await self._acquire_workspace()
            return await self._run_code_change(admitted, workspace)
        except asyncio.CancelledError:
            # Record the cancellation; these activities run after the cancel was delivered, so they are not
            # cancelled themselves.
            await self._safe_finish(WorkItemState.cancelled, "cancelled by request")
            raise
        except Dead as exc:
            return await self._finish(WorkItemState.dead, str(exc))
        except Failed as exc:
            return await self._finish(WorkItemState.failed, str(exc))
        finally:
            if not self._continuing:
                if inp.spec.kind != WorkItemKind.task and workflow.patched(LEAN_END):
                    await self._end(workspace)
                else:
                    if workspace is not None:
                        await self._release(workspace)
                    if inp.spec.kind != WorkItemKind.task:
                        await self._cleanup()

    async def _admission(self, *, readmission: RepairLoop | None = None) -> AdmitResult:
        """Admit the item, waiting durably in `queued` while its tenant is at its in-flight limit.

        `readmission`: the repair loop of an item that reviewers sent back (`_readmit`); a long wait continues as
        new with it. A continued run, or a readmission, does not take the `admitted` signal's word: it asks the
        store once more, which finds it admitted and answers with its attempts' fingerprints (the breaker's
        memory, which a fresh admission does not carry), and a late signal from an earlier wait cannot start it."""
        resumed = readmission is not None or self._carry.next_attempt > 1
        delay = QUEUE_POLL
        while True:
            self._slot_freed = False
            self._handed_off = False
            res = await self._call(
                ADMIT,
                lambda step: AdmitInput(**self._ref(step), spec=self._inp.spec, resumed=resumed),
                "admit",
            )
            if res.admitted or res.queued_position is None:
                if res.admitted:
                    self._set(WorkItemState.admitted, "admitted", upsert=False)
                return res
            self._set(WorkItemState.queued, f"queued: place {res.queued_position} in the tenant's queue")
            try:
                await workflow.wait_condition(lambda: self._slot_freed or self._handed_off, timeout=delay)
                delay = QUEUE_POLL
            except TimeoutError:
                delay = min(delay * 2, QUEUE_POLL_MAX)
            if self._handed_off and res.budget is not None and not resumed:
                # Admitted by the write that freed the place; the terms were decided by this item's admission (a
                # control pool from before the hand-off decided none: then it asks again, and finds itself admitted).
                self._set(WorkItemState.admitted, "admitted", upsert=False)
                return res.model_copy(update={"admitted": True, "reason": "", "queued_position": None})
            if workflow.info().is_continue_as_new_suggested():
                self._continue_as_new(readmission.carry() if readmission is not None else self._carry)

    async def _readmit(self, loop: RepairLoop, workspace: Workspace) -> WorkItemResult | None:
        """Reviewers asked for changes: the next attempt takes a place under the tenant's in-flight limit again,
        first come, first served, as a new item does. Awaiting review holds no place, so without this a tenant could
        run any number of its items at once: let them all reach review, then ask for changes on every one.

        The workspace lease is given up first and taken again once admitted: a first run takes the place, then the
        workspace, and so does this. Waiting for a place while holding the workspace deadlocked with an item of the
        same branch admitted meanwhile (it held the place and waited for the workspace) until the lease expired,
        up to an hour, and then let the two work on the branch at once.

        Two writes: `queued` (the attempt number it waits for, so the event log moves forward), then admission. A
        freed place may be handed to the item in between; the admission then finds it admitted. Returns the item's
        result when it cannot go on (it ended meanwhile), else None, with `workspace` holding the new grant."""
        await self._release(workspace)
        await self._call(
            SET_STATE,
            lambda step: SetStateInput(
                **self._ref(step),
                state=WorkItemState.queued,
                reason=f"changes requested: attempt {loop.attempt} waits for a place",
                attempt=loop.attempt,
            ),
            "changes requested: wait for a place",
        )
        self._set(WorkItemState.queued, f"changes requested: attempt {loop.attempt} waits for a place")
        res = await self._admission(readmission=loop)
        if not res.admitted:
            return await self._finish(WorkItemState.failed, f"not admitted: {res.reason}", mock=loop.mock)
        workspace.grant = (await self._acquire_workspace()).grant
        return None

    async def _run_task(self, admitted: AdmitResult) -> WorkItemResult:
        budget = admitted.budget or self._inp.spec.budget
        last_error = ""
        for attempt in range(self._carry.next_attempt, budget.max_attempts + 1):
            self._set(WorkItemState.running, f"attempt {attempt}", attempt=attempt)
            outcome = await self._agent(attempt, diagnostics=None, review_comment=None)
            if outcome.error is None:
                # The passing attempt's record and the item's result: one local activity, one transaction.
                record = self._attempt(attempt, "passed", "agent returned its output", agent=outcome)
                return await self._finish(
                    WorkItemState.succeeded, "task completed", output=outcome.output, mock=outcome.mock, record=record
                )
            await self._record(
                self._attempt(attempt, "failed", f"agent error: {outcome.error}", cause="agent_error", agent=outcome)
            )
            last_error = outcome.error
        return await self._finish(
            WorkItemState.failed, f"budget: {budget.max_attempts} attempts used; last: {last_error}"
        )

    async def _run_pr_review(self, admitted: AdmitResult) -> WorkItemResult:
        """An agent's review of a pull request: attempts until the agent's review (read on the host, strictly, in
        the agent step) comes back as its output. Nothing is validated, reviewed or landed, and no workspace lease is
        taken (each attempt has its own workspace at the pull request's head); the intake posts the review."""
        budget = admitted.budget or self._inp.spec.budget
        last_error = ""
        for attempt in range(self._carry.next_attempt, budget.max_attempts + 1):
            self._set(WorkItemState.running, f"attempt {attempt}: agent reviewing", attempt=attempt)
            outcome = await self._agent(attempt, diagnostics=None, review_comment=None)
            if outcome.error is None and outcome.output is not None:
                record = self._attempt(attempt, "passed", "the agent wrote its review", agent=outcome)
                return await self._finish(
                    WorkItemState.succeeded,
                    f"review written on attempt {attempt}; posted on the pull request by the platform",
                    output=outcome.output,
                    mock=outcome.mock,
                    record=record,
                )
            error = outcome.error or "the agent wrote no review"
            await self._record(
                self._attempt(attempt, "failed", f"agent error: {error}", cause="agent_error", agent=outcome)
            )
            last_error = error
        return await self._finish(
            WorkItemState.failed, f"budget: {budget.max_attempts} attempts used; last: {last_error}"
        )

    async def _run_code_change(self, admitted: AdmitResult, workspace: Workspace) -> WorkItemResult:
        carry = self._carry
        loop = RepairLoop(
            attempt=carry.next_attempt,
            started_at_s=carry.started_at_s if carry.started_at_s is not None else workflow.now().timestamp(),
            diagnostics=carry.diagnostics_ref,
            review_comment=carry.review_comment,
            tokens=carry.tokens_used,
            cost=carry.cost_usd,
            fingerprints=list(admitted.past_fingerprints),
        )
        limits = Limits.from_spec(admitted.budget or self._inp.spec.budget, breaker_k=DEFAULT_BREAKER_K)
        while True:
            passed = await self._repair_until_pass(loop, limits)
            if isinstance(passed, WorkItemResult):
                return passed
            if self._inp.spec.review.required is False:
                # Unset never reaches a workflow from the service (crewwork.admission.policy fills it in); were it to, a person
                # decides, as the default says. Histories hold explicit values, so replay takes the same branch.
                break
            decision = await self._review_gate(workspace, admitted.review_timeout_s, loop.attempt, passed)
            if decision is None:
                return await self._finish(WorkItemState.failed, "review timed out", mock=loop.mock)
            record = await self._record_review(decision, loop.attempt, passed)
            if decision.action == "reject":
                by = who(record)
                reason = f"rejected by reviewer{' ' + by if by else ''}: {decision.comment or ''}".strip()
                return await self._finish(WorkItemState.rejected, reason, mock=loop.mock, review=record)
            if decision.action == "approve":
                break
            # The comment and line comments, quoted as the reviewer's input (data, not instructions).
            loop.changes_requested(review_input(record) if workflow.patched(REVIEW_RECORDED) else decision.comment)
            if workflow.patched(READMIT_AFTER_REVIEW):
                refused = await self._readmit(loop, workspace)
                if refused is not None:
                    return refused
        return await self._land(passed, loop, workspace)

    async def _repair_until_pass(self, loop: RepairLoop, limits: Limits) -> AgentOutcome | WorkItemResult:
        """Attempts until one passes validation (its agent outcome), or a limit ends the item (its result)."""
        while True:
            hit = limits.check(loop.state(workflow.now().timestamp()))
            if hit is not None:
                reason = hit.reason if hit.reason.startswith(f"{hit.kind}:") else f"{hit.kind}: {hit.reason}"
                return await self._finish(WorkItemState.failed, reason, mock=loop.mock)
            if (
                workflow.info().is_continue_as_new_suggested()
                or loop.attempt - self._carry.next_attempt >= ATTEMPTS_PER_RUN
            ):
                # Keep each run's history small however long the loop: start afresh with the loop state carried.
                self._continue_as_new(loop.carry())
            n = loop.attempt
            self._set(WorkItemState.running, f"attempt {n}: agent running", attempt=n)
            outcome = await self._agent(n, diagnostics=loop.diagnostics, review_comment=loop.review_comment)
            loop.spent(outcome)
            if outcome.error is not None:
                loop.fingerprints = await self._record(
                    self._attempt(
                        n,
                        "failed",
                        f"agent error: {outcome.error}",
                        cause="agent_error",
                        fingerprint="agent_error",
                        agent=outcome,
                    )
                )
                loop.failed(f"Attempt {n} failed: the agent reported an error: {outcome.error}")
                continue
            self._set(WorkItemState.validating, f"attempt {n}: validating", attempt=n)
            validation = await self._validate(n, outcome, loop.review_comment)
            record = self._attempt(
                n,
                "passed" if validation.passed else "failed",
                validation.reason,
                cause=validation.cause,
                fingerprint=validation.fingerprint,
                agent=outcome,
                validation=validation,
            )
            if validation.passed and self._inp.spec.review.required is not False and workflow.patched(LEAN_END):
                # Recorded by the `awaiting_review` write, in its transaction (`_review_gate`). A passed attempt's
                # fingerprint is None in the store's list, as its record would have answered.
                self._unrecorded = record
                loop.fingerprints = [*loop.fingerprints, None]
                return outcome
            loop.fingerprints = await self._record(record)
            if validation.passed:
                return outcome
            fault = submission_fault(validation, self._inp.spec, n)
            if fault is not None and workflow.patched(SUBMISSION_FAULT_ENDS_ITEM):
                return await self._finish(WorkItemState.failed, fault, mock=loop.mock)
            loop.failed(validation.diagnostics or validation.reason)

    async def _review_gate(
        self, workspace: Workspace, timeout_s: float | None, attempt: int, passed: AgentOutcome
    ) -> ReviewDecision | None:
        """Wait for a person's decision on `attempt` (None when the deadline passes), keeping the workspace lease
        alive."""
        self._review = None
        self._review_attempt = attempt
        self._review_diff = passed.diff_ref.sha256 if passed.diff_ref is not None else None
        self._status.review_attempt = attempt
        self._awaiting_review = True
        self._set(WorkItemState.awaiting_review, "awaiting review")
        record, self._unrecorded = self._unrecorded, None
        res = await self._call(
            SET_STATE,
            lambda step: SetStateInput(
                **self._ref(step),
                state=WorkItemState.awaiting_review,
                reason="validated; awaiting review",
                attempt=self._status.attempt,
                record=record,
            ),
            "awaiting review",
        )
        if record is not None and res.stale:
            raise Dead("attempt record refused: the item was written by a later step or has ended")
        deadline = workflow.now() + timedelta(seconds=timeout_s) if timeout_s else None
        while self._review is None:
            wait = REVIEW_RENEW_EVERY
            if deadline is not None:
                remaining = deadline - workflow.now()
                if remaining <= timedelta(0):
                    break
                wait = min(wait, remaining)
            try:
                await workflow.wait_condition(lambda: self._review is not None, timeout=wait)
            except TimeoutError:
                if deadline is not None and workflow.now() >= deadline:
                    break
                await self._call(
                    RENEW_WORKSPACE,
                    lambda step: ReleaseInput(
                        **self._ref(step), key=workspace.key, grant=workspace.grant, ttl_s=REVIEW_LEASE_TTL_S
                    ),
                    "renew the workspace lease",
                )
        self._awaiting_review = False
        self._status.review_attempt = None
        return self._review

    async def _record_review(self, decision: ReviewDecision, attempt: int, passed: AgentOutcome) -> ReviewRecord:
        """The decision as the item's fact (`review_decided` event and webhook): who, when, which attempt and diff."""
        record = ReviewRecord.of(
            decision,
            attempt=attempt,
            diff_sha256=passed.diff_ref.sha256 if passed.diff_ref is not None else None,
            base_commit=self._inp.base_commit,
            decided_at=self._review_at if self._review_at is not None else workflow.now().timestamp(),
        )
        self._last_review = record
        # The status query answers often: it keeps the latest few decisions, slim (the store keeps them whole).
        self._status.reviews = [*self._status.reviews, slim_review(record)][-REVIEWS_IN_STATUS:]
        if workflow.patched(REVIEW_RECORDED):
            res = await self._call(
                RECORD_REVIEW,
                lambda step: RecordReviewInput(**self._ref(step), review=record),
                f"review: {decision.action} attempt {attempt}",
            )
            if res.stale:
                raise Dead("review record refused: the item was written by a later step or has ended")
        return record

    async def _land(self, passed: AgentOutcome, loop: RepairLoop, workspace: Workspace) -> WorkItemResult:
        inp = self._inp
        assert passed.diff_ref is not None and inp.repo_path and inp.base_commit
        self._set(WorkItemState.landing, "landing", attempt=loop.attempt)
        landed = await self._call(
            LAND,
            lambda step: LandInput(
                **self._ref(step),
                repo_path=inp.repo_path or "",
                base_commit=inp.base_commit or "",
                diff_ref=passed.diff_ref,  # type: ignore[arg-type]
                message=commit_message(inp, loop.attempt, self._last_review if self._review else None),
                workspace_key=workspace.key,
                workspace_grant=workspace.grant,
                pull_request=inp.spec.repo.pull_request if inp.spec.repo else None,
                ref=inp.spec.repo.ref if inp.spec.repo else None,
                # For the signed evidence bundle (crewwork/attestation): which attempt lands, approved by whom.
                attempt=loop.attempt,
                review=self._review,
                review_decided_at=self._review_at if self._review is not None else None,
            ),
            f"land attempt {loop.attempt} on crewwork/{inp.work_item_id}",
        )
        self._status.delivery_branch = landed.branch
        self._status.landed_commit = landed.commit
        self._status.pull_request_url = landed.pull_request_url
        pr = f" (pull request {landed.pull_request_url})" if landed.pull_request_url else ""
        return await self._finish(
            WorkItemState.succeeded,
            f"validated on attempt {loop.attempt} and landed on {landed.branch}{pr}",
            branch=landed.branch,
            commit=landed.commit,
            mock=loop.mock,
            pull_request_url=landed.pull_request_url,
            review=self._last_review if self._review is not None else None,
        )
