"""Submitting, inspecting, reviewing and cancelling work items: the one place the API and CLI go through.

The API never changes a work item's state itself: it validates a submission, inserts the row, and starts,
updates or cancels the workflow, which is the single authority on progress.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from crewwork import starts
from crewwork.agents.catalogue import agent_check
from crewwork.config import Settings
from crewwork.errors import AgentConfigError
from crewwork.jsonvalues import JsonRefused, refuse_nonfinite
from crewwork.masking import MAX_NESTING, too_deep_at, unstorable_at
from crewwork.models import (
    EnvironmentSpec,
    ReviewDecision,
    WorkItemKind,
    WorkItemSpec,
    WorkItemState,
    WorkItemStatus,
)
from crewwork.policy import Policy, PolicyViolation
from crewwork.repos.environment import EnvironmentRejected, check_environment, resolve_environment
from crewwork.repos.registration import RepoAddressRefused, RepoPolicyError, RepositoryChecks
from crewwork.repos.tenancy import RepositoryRegistry
from crewwork.store.store import Store
from crewwork.store.views import StoredWorkItem
from crewwork.store.work_items import IdempotencyConflict
from crewwork.workflows.work_item import WorkItemWorkflow

log = logging.getLogger("crewwork.service")


class SubmissionRejected(ValueError):
    """The submission is invalid; nothing was stored and no workflow started."""

    def __init__(self, message: str, field: str | None = None, code: str = "invalid_work_item") -> None:
        super().__init__(message)
        self.field = field
        self.code = code


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
        (crewwork.policy) and the repository, which must be one the tenant registered (crewwork.repos.tenancy).

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
        assert spec.repo is not None
        return await self._check_repository(spec, tenant_id)

    async def _check_repository(self, spec: WorkItemSpec, tenant_id: str) -> tuple[WorkItemSpec, str, str]:
        """The tenant's registered repository exists and has the ref; its environment and pull request are allowed
        (crewwork.repos: docs/repositories.md)."""
        assert spec.repo is not None
        repos = RepositoryChecks(self.settings)
        registry = RepositoryRegistry(self.store, self.settings, repos)
        try:
            reg = await registry.resolve(spec.repo, tenant_id)
            ref = spec.repo.ref or reg.default_ref
            url, commit = await repos.check(
                reg.url,
                ref,
                await self.store.tenant_ref(tenant_id),
                credential=reg.credential,
                roots=await registry.roots(tenant_id),
            )
        except RepoAddressRefused as exc:
            raise SubmissionRejected(str(exc), "repo", code="url_not_allowed") from exc
        except RepoPolicyError as exc:
            raise SubmissionRejected(str(exc), "repo") from exc
        try:
            repos.forge(url, spec.repo.pull_request)
        except RepoPolicyError as exc:
            raise SubmissionRejected(str(exc), "repo.pull_request") from exc
        registered_env = EnvironmentSpec.model_validate(reg.environment) if reg.environment else None
        if registered_env is not None and spec.environment is None:
            # Registered before registrations were checked for it (2026-12-02): say whose text it is.
            bad = unstorable_at(registered_env) or too_deep_at(registered_env)
            if bad is not None:
                raise SubmissionRejected(
                    f"the repository's registered environment holds text the store cannot keep at {bad}; "
                    "register the repository again without it",
                    "environment",
                    "invalid_text",
                )
        env = resolve_environment(spec.environment or registered_env, self.settings, url.url)
        if env is not None:
            try:
                check_environment(env, self.settings, await self.store.tenant_ref(tenant_id))
            except EnvironmentRejected as exc:
                raise SubmissionRejected(str(exc), "environment") from exc
        update: dict[str, Any] = {
            # What runs is the registration, never the tenant's spelling of it.
            "repo": spec.repo.model_copy(update={"id": reg.id, "url": url.url, "ref": ref}),
            "environment": env,
        }
        if reg.protect_paths and spec.validation is not None:
            protect = spec.validation.protect
            merged = [*protect.paths, *(p for p in reg.protect_paths if p not in protect.paths)]
            update["validation"] = spec.validation.model_copy(
                update={"protect": protect.model_copy(update={"paths": merged})}
            )
        return spec.model_copy(update=update), url.url, commit

    async def submit(self, tenant_id: str, spec: WorkItemSpec) -> Submitted:
        """Check and store a submission and start its workflow. A repeated idempotency key with the same submission
        returns the earlier item (`created` False) without checking it again; with another submission it raises
        `IdempotencyConflict`."""
        refuse_unstorable(spec)
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
        )
        # Admit and start the workflow (or, for a concurrent retry that found the item, what `_restart` does).
        row = await self._start(row, spec) if created else await self._restart(row)
        return Submitted(row=row, created=created)

    async def _restart(self, row: StoredWorkItem) -> StoredWorkItem:
        """A repeated submission (same idempotency key and submission) of an item whose first request may have
        stopped half way: admit and start it if it was never admitted, start it if it was admitted before its
        workflow's start (crewwork/starts.py); anything further on (queued: its place starts it; its workflow wrote
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
        (crewwork/starts.py); with CREWWORK_ADMIT_AT_SUBMISSION=false, start it to run its own admission. A workflow
        already there for this id is the same work item (an idempotent retry whose first start failed): not an
        error. Returns the row with the state the admission left it in."""
        client = self._client()
        if not self.settings.admit_at_submission:
            await starts.start(client, self.settings, row, spec=spec)
            return row
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

    async def review(self, row: StoredWorkItem, decision: ReviewDecision) -> str:
        try:
            return str(await self.handle(row).execute_update(WorkItemWorkflow.review, decision))
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            msg = getattr(cause, "message", None) or str(cause or exc)
            raise ReviewRejected(msg) from exc
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND and row.state in starts.UNSTARTED:
                # Queued with no workflow yet (crewwork/starts.py): what the workflow's own validator says.
                raise ReviewRejected(f"this work item is not awaiting review (state: {row.state})") from exc
            raise ReviewRejected(f"the work item's workflow is not running: {exc.message}") from exc

    async def cancel(self, row: StoredWorkItem) -> None:
        try:
            await self.handle(row).cancel()
            return
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND or row.state not in starts.UNSTARTED:
                raise WorkflowUnavailable(f"could not cancel: {exc.message}") from exc
        # Queued with no workflow yet (crewwork/starts.py), or admitted with its start still on the way: start it
        # (it finds itself queued, or admitted) and cancel it, so the workflow records the cancellation as always.
        await starts.start(self._client(), self.settings, row)
        try:
            await self.handle(row).cancel()
        except RPCError as exc:
            raise WorkflowUnavailable(f"could not cancel: {exc.message}") from exc


def refuse_unstorable(data: Any, field_prefix: str = "") -> None:
    """Refuse what a client sent that the store cannot keep, with the field that holds it, before anything is
    stored: text with NUL or a lone surrogate (crewwork.masking.unstorable_at; PostgreSQL refuses NUL in text and
    jsonb, so such a submission failed halfway with a server error, or was stored and then failed every write of its
    workflow), JSON nested deeper than MAX_NESTING (pydantic's serializer failed on it: a server error), and numbers
    that are not finite (crewwork.jsonvalues)."""
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
