"""Submitting, inspecting, reviewing and cancelling work items: the one place the API and CLI go through.

The API never changes a work item's state itself: it validates a submission, inserts the row, and starts,
updates or cancels the workflow, which is the single authority on progress. A submission's checks are the agent's
config, the operator's policy and one call for its repository (crewwork/repos/submission.py); a refusal is a
`SubmissionRejected` (crewwork/models/errors.py), which the API answers as its 422 problem.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from crewwork.admission import starts
from crewwork.admission.policy import Policy, PolicyViolation
from crewwork.agents.catalogue import agent_check
from crewwork.boundary.jsonvalues import JsonRefused, refuse_nonfinite
from crewwork.boundary.masking import MAX_NESTING, too_deep_at, unstorable_at
from crewwork.config import Settings
from crewwork.models import (
    ReviewDecision,
    WorkItemKind,
    WorkItemSpec,
    WorkItemState,
    WorkItemStatus,
)
from crewwork.models.errors import AgentConfigError, SubmissionRejected
from crewwork.repos.submission import resolve_submission
from crewwork.store.store import Store
from crewwork.store.views import StoredWorkItem
from crewwork.store.work_items import IdempotencyConflict
from crewwork.temporal.deployment import ExecutionBuild, execution_build
from crewwork.workflows.work_item import WorkItemWorkflow

__all__ = [
    "ReviewRejected",
    "SubmissionRejected",
    "Submitted",
    "WorkItemService",
    "WorkflowUnavailable",
    "refuse_unstorable",
    "submission_hash",
]

log = logging.getLogger("crewwork.api.service")


class ReviewRejected(ValueError):
    pass


class WorkflowUnavailable(RuntimeError):
    pass


@dataclass
class Submitted:
    row: StoredWorkItem
    created: bool


class WorkItemService:
    def __init__(self, store: Store, client: Client | None, settings: Settings) -> None:
        self.store = store
        self.client = client
        self.settings = settings

    def _client(self) -> Client:
        if self.client is None:
            raise WorkflowUnavailable("not connected to Temporal")
        return self.client

    async def policy(self, tenant_id: str) -> Policy:
        """The operator policy for `tenant_id` (its CREWWORK_TENANT_POLICIES entry over the deployment's)."""
        name = await self.store.tenant_name(tenant_id) if self.settings.tenant_policies else None
        return Policy.for_tenant(self.settings, tenant_id, name)

    async def check(
        self, spec: WorkItemSpec, tenant_id: str, policy: Policy | None = None
    ) -> tuple[WorkItemSpec, str | None, str | None]:
        """Everything that can be checked before anything is stored: the agent's config, operator policy
        (crewwork.admission.policy) and the repository, which must be one the tenant registered, in one call
        (crewwork.repos.submission: a `RepositoryRefused`, which is a `SubmissionRejected`, or `RepositoryNotFound`).

        Returns (the spec as it is stored and run, repository locator, base commit): the spec names the registered
        repository (its id, URL and the ref), with its protected paths and default environment filled in; the
        locator is the registered URL (a remote's normalised URL, or a local repository's absolute path)."""
        try:
            agent_check(spec.agent.name, plugins=self.settings.agent_plugins).validate_config(
                spec.kind, spec.agent.config
            )
        except AgentConfigError as exc:
            raise SubmissionRejected(str(exc), "agent") from exc
        policy = policy or await self.policy(tenant_id)
        try:
            policy.check(spec)
        except PolicyViolation as exc:
            raise SubmissionRejected(str(exc), exc.field) from exc
        if spec.kind == WorkItemKind.task:
            if spec.validation is not None:
                raise SubmissionRejected(
                    "validation of `task` work items is not supported yet; use kind `code_change`",
                    "validation",
                )
            return spec, None, None
        repo = await resolve_submission(spec, tenant_id, self.store, self.settings)
        return repo.spec, repo.locator, repo.commit

    async def submit(self, tenant_id: str, spec: WorkItemSpec) -> Submitted:
        """Check and store a submission and start its workflow. A repeated idempotency key with the same submission
        returns the earlier item (`created` False) without checking it again; with another submission it raises
        `IdempotencyConflict`."""
        # Walks every value of `input` and `agent.config` (up to a 1 MiB body's worth): in a thread, so the event
        # loop keeps serving other tenants meanwhile.
        await asyncio.to_thread(refuse_unstorable, spec)
        policy = await self.policy(tenant_id)
        # Hashed as it is stored and run: leaving a field to the operator's default and spelling that default out
        # are the same submission.
        spec = policy.with_defaults(spec)
        digest = submission_hash(spec)
        if spec.idempotency_key:
            found = await self.store.work_item_by_idempotency_key(tenant_id, spec.idempotency_key)
            if found is not None:
                if found.submission_hash and found.submission_hash != digest:
                    raise IdempotencyConflict(found)
                found = await self._restart(found)
                return Submitted(row=found, created=False)
        spec, repo, commit = await self.check(spec, tenant_id, policy)
        row, created = await self.store.create_work_item(
            tenant_id=tenant_id,
            spec=spec,
            base_commit=commit,
            repo_path=repo,
            submission_hash=digest,
            # Labelled from the start (API, console, CLI), not only once an attempt of the mock agent has run.
            mock=agent_check(spec.agent.name, plugins=self.settings.agent_plugins).mock,
            max_waiting=self.settings.tenant_max_queued,
            # Admitted by the insert's own call where the store can (PostgreSQL: migration 0016); else `_start` does.
            admit_max_in_flight=self.settings.tenant_max_in_flight if self.settings.admit_at_submission else None,
        )
        # Admit and start the workflow (or, for a concurrent retry that found the item, what `_restart` does).
        row = await self._start(row, spec) if created else await self._restart(row)
        return Submitted(row=row, created=created)

    async def _restart(self, row: StoredWorkItem) -> StoredWorkItem:
        """A repeated submission (same idempotency key and submission) of an item whose first request may have
        stopped half way: admit and start it if it was never admitted, start it if it was admitted before its
        workflow's start (crewwork/admission/starts.py); anything further on (queued: its place starts it; its workflow wrote
        it) is left as it is, with no write (an admission now would only be refused as stale)."""
        spec = WorkItemSpec.model_validate(row.spec)
        if not self.settings.admit_at_submission:
            await starts.start(self._client(), self.settings, row, spec=spec)
            return row
        if row.state == WorkItemState.submitted.value:
            return await self._start(row, spec)
        if row.state == WorkItemState.admitted.value and row.fence_rank <= starts.ADMISSION.encode():
            await starts.start_admitted(self._client(), self.settings, row, spec=spec)
        return row

    async def _start(self, row: StoredWorkItem, spec: WorkItemSpec) -> StoredWorkItem:
        """Admit the item and start its workflow admitted, or leave it queued with no workflow yet
        (crewwork/admission/starts.py); with CREWWORK_ADMIT_AT_SUBMISSION=false, start it to run its own admission. A workflow
        already there for this id is the same work item (an idempotent retry whose first start failed): not an
        error. Returns the row with the state the admission left it in."""
        client = self._client()
        if not self.settings.admit_at_submission:
            await starts.start(client, self.settings, row, spec=spec)
            return row
        if row.state == WorkItemState.admitted.value and row.fence_rank == starts.ADMISSION.encode():
            # Admitted by the submission's own call (`create_work_item`'s `admit_max_in_flight`).
            await starts.start_admitted(client, self.settings, row, spec=spec)
            return row
        if row.state == WorkItemState.queued.value:
            return row  # queued by it: its place starts it (crewwork/admission/handoff.py)
        state = await starts.admit_and_start(self.store, client, self.settings, row, spec=spec)
        return row if state == row.state else dataclasses.replace(row, state=state)

    def handle(self, row: StoredWorkItem) -> WorkflowHandle[Any, Any]:
        return self._client().get_workflow_handle(row.workflow_id)

    async def live_status(self, row: StoredWorkItem) -> WorkItemStatus | None:
        try:
            return await self.handle(row).query(WorkItemWorkflow.status)
        except (RPCError, WorkflowUnavailable) as exc:
            log.debug("status query for %s failed: %s", row.id, exc)
            return None
        except Exception as exc:
            log.debug("status query for %s failed: %s", row.id, exc)
            return None

    async def build_of(self, row: StoredWorkItem) -> ExecutionBuild | None:
        """The worker build the item's workflow runs on, as Temporal describes it (None: unversioned workers, no
        workflow yet, or Temporal did not answer)."""
        try:
            desc = await self.handle(row).describe()
        except Exception as exc:
            log.debug("describe of %s failed: %s", row.id, exc)
            return None
        return execution_build(desc.raw_description)

    async def review(self, row: StoredWorkItem, decision: ReviewDecision) -> str:
        try:
            return str(await self.handle(row).execute_update(WorkItemWorkflow.review, decision))
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            msg = getattr(cause, "message", None) or str(cause or exc)
            raise ReviewRejected(msg) from exc
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND and row.state in starts.UNSTARTED:
                # Queued with no workflow yet (crewwork/admission/starts.py): what the workflow's own validator says.
                raise ReviewRejected(f"this work item is not awaiting review (state: {row.state})") from exc
            raise ReviewRejected(f"the work item's workflow is not running: {exc.message}") from exc

    async def cancel(self, row: StoredWorkItem) -> None:
        try:
            await self.handle(row).cancel()
            return
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND or row.state not in starts.UNSTARTED:
                raise WorkflowUnavailable(f"could not cancel: {exc.message}") from exc
        # Queued with no workflow yet (crewwork/admission/starts.py), or admitted with its start still on the way: start it
        # (it finds itself queued, or admitted) and cancel it, so the workflow records the cancellation as always.
        await starts.start(self._client(), self.settings, row)
        try:
            await self.handle(row).cancel()
        except RPCError as exc:
            raise WorkflowUnavailable(f"could not cancel: {exc.message}") from exc


def refuse_unstorable(data: Any, field_prefix: str = "") -> None:
    """Refuse what a client sent that the store cannot keep, with the field that holds it, before anything is
    stored: text with NUL or a lone surrogate (crewwork.boundary.masking.unstorable_at; PostgreSQL refuses NUL in text and
    jsonb, so such a submission failed halfway with a server error, or was stored and then failed every write of its
    workflow), JSON nested deeper than MAX_NESTING (pydantic's serializer failed on it: a server error), and numbers
    that are not finite (crewwork.boundary.jsonvalues)."""
    deep = too_deep_at(data)
    if deep is not None:
        field = f"{field_prefix}{deep}"
        raise SubmissionRejected(
            f"{field}: nested deeper than {MAX_NESTING} levels (objects and lists)", field, "too_deeply_nested"
        )
    where = unstorable_at(data)
    if where is not None:
        field = f"{field_prefix}{where}"
        raise SubmissionRejected(
            f"{field}: text must not contain NUL (U+0000) or a lone surrogate (U+D800-U+DFFF)", field, "invalid_text"
        )
    try:
        # NaN and infinity: no JSON column nor Temporal payload holds them (a typed field failed as a server
        # error, `input`/`agent.config` stored `null`). The API refuses them in the raw body already; this covers
        # what reaches the service from Python.
        refuse_nonfinite(data, field_prefix)
    except JsonRefused as exc:
        raise SubmissionRejected(str(exc), exc.field, exc.code) from None


def submission_hash(spec: WorkItemSpec) -> str:
    """SHA-256 of the canonical JSON of a validated submission, without its idempotency key: two submissions are
    the same when they validate to the same spec (field order, whitespace and spelled-out defaults do not matter)."""
    canonical = json.dumps(
        spec.model_dump(mode="json", exclude={"idempotency_key"}),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
