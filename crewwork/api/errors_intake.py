"""The error intake: turns the error groups the report endpoints queued (crewwork/api/errors.py,
crewwork/store/errors.py) into hotfix work items, one per group generation. It runs in API processes beside the
forge intake (CREWWORK_ERRORS_INTAKE), never in a report's request: a report is counted and answered in
milliseconds, and a Temporal that is down or a tenant queue that is full only delays the item.

For each due group: the project still exists (else the group fails `unregistered`); a `hotfix` work item of the
project's tenant, on its repository, made with the project's settings and the report's text fenced as untrusted
data (crewwork/errors/work.py), with the idempotency key `errors:<project>:<fingerprint>:<generation>`: however
often a group is tried (a crash after the submission, two API processes, an expired claim), it is one work item.
The tenant's admission (its policy, its queue limit CREWWORK_TENANT_MAX_QUEUED) applies as to any submission: a full
queue is retried with backoff (CREWWORK_ERRORS_INTAKE_MAX_ATTEMPTS, then `failed`), a refusal fails the group with
the reason, shown by `GET /v1/repositories/{id}/errors/groups`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from crewwork.api.service import SubmissionRejected, WorkflowUnavailable, WorkItemService
from crewwork.errors.work import ErrorIntakeSettings, work_item_of
from crewwork.repos.registration import RepoPolicyError
from crewwork.repos.tenancy import RepositoryNotFound
from crewwork.store.errors import ClaimedGroup, ErrorStore
from crewwork.store.work_items import IdempotencyConflict, QueueFull

log = logging.getLogger("crewwork.errors.intake")


class ErrorIntake:
    def __init__(
        self,
        errors: ErrorStore,
        service: WorkItemService,
        *,
        max_attempts: int = 20,
        poll_s: float = 1.0,
        claim_s: float = 120.0,
        backoff_s: float = 2.0,
    ) -> None:
        self.errors = errors
        self.service = service
        self.max_attempts = max_attempts
        self.poll_s = poll_s
        self.claim_s = claim_s
        self.backoff_s = backoff_s
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """A group was queued: look now rather than at the next poll."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                n = await self.run_once()
            except Exception as exc:  # the database may be briefly unavailable; keep going
                log.warning("error intake: %s", exc)
                n = 0
            if n == 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_s)
                self._wake.clear()

    async def run_once(self, limit: int = 10) -> int:
        batch = await self.errors.claim_groups(limit, self.claim_s)
        for group in batch:
            try:
                await self.handle(group)
            except Exception as exc:
                # One group's failure (Temporal down, a full queue, a store hiccup) is retried with backoff and
                # never holds up the rest of the batch.
                log.info("error group %s: %r", group.id, exc)
                with contextlib.suppress(Exception):
                    await self.errors.retry_group(
                        group.id,
                        group.generation,
                        f"{type(exc).__name__}: {exc}"
                        if not isinstance(exc, QueueFull | WorkflowUnavailable)
                        else str(exc),
                        max_attempts=self.max_attempts,
                        backoff_s=self.backoff_s,
                    )
        return len(batch)

    async def handle(self, group: ClaimedGroup) -> None:
        project = await self.errors.project(group.project_id)
        if project is None:
            await self.errors.finish_group(group.id, group.generation, "failed", error="unregistered")
            return
        settings = ErrorIntakeSettings.model_validate(project.settings)
        spec = work_item_of(
            project_id=project.id,
            repository_id=project.repository_id,
            fence_secret=project.fence_secret,
            group_id=group.id,
            fingerprint=group.fingerprint,
            generation=group.generation,
            sample=group.sample,
            settings=settings,
            previous=group.previous_work_item_id,
        )
        try:
            submitted = await self.service.submit(project.tenant_id, spec)
        except IdempotencyConflict as exc:
            # An earlier try of this generation made its item, and the project's settings changed since.
            item_id = exc.existing.id
        except (SubmissionRejected, RepositoryNotFound, RepoPolicyError) as exc:
            await self.errors.finish_group(group.id, group.generation, "failed", error=str(exc))
            return
        else:
            item_id = submitted.row.id
        await self.errors.finish_group(group.id, group.generation, "submitted", work_item_id=item_id)
