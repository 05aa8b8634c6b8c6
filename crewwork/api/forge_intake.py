"""The forge intake: turns the triggers the webhook endpoint queued (crewwork/api/forge.py, crewwork/store/forge.py)
into work items, one per trigger, or into one polite refusal on the forge. It runs in API processes beside the
webhook deliverer (CREWWORK_FORGE_INTAKE), because a trigger ends in the same submission path as the HTTP API
(`WorkItemService.submit`, with the operator's policy), and never in the webhook's request: the forge calls it makes
(the actor's permission, a refusal comment) can be slow or down, and a delivery is answered in milliseconds.

For each due trigger, in order:

1. the subscription still exists (else the trigger fails: `unsubscribed`);
2. the actor is trusted: named in `allow_users`, or holding at least `min_permission` on the repository as the
   forge's REST API says now (a user who is not a collaborator has none);
3. untrusted: one comment on the issue says nothing was started and why, and the trigger ends `refused`; nothing
   of it ever reaches an agent;
4. trusted: a `code_change` work item of the subscription's tenant, on the registered repository, whose instruction
   fences the issue's text as untrusted data (crewwork/forge/untrusted.py), with the idempotency key
   `forge:<subscription>:<trigger key>`: however often a trigger is tried (a crash after the submission, two API
   processes, a claim that expired), it is one work item. A `@crewwork review` on a pull request is a `pr_review`
   item on the pull request's head branch instead, whose review the progress loop posts once it succeeds
   (crewwork/api/forge_pr_review.py, docs/forge.md "Agents review pull requests").

Each submitted item gets one progress comment on its issue, edited in place as the item moves (crewwork/forge/
progress.py says what it says): the intake looks at each open forge item every CREWWORK_FORGE_PROGRESS_POLL_S, and
posts or edits when the text the item calls for differs from what was posted (a digest is kept), so a forge that is
down delays the comment and loses nothing. "Done" is said only when the pull request's head, as the forge reports
it, is the landed commit. The item's pull request starts `Fixes #<issue>`, which links it to the issue.

Deliveries that never arrived are caught up by polling (CREWWORK_FORGE_POLL_INTERVAL_S): the forge's API lists each
subscribed repository's recent `labeled` issue events and comments, which are read into the same triggers with the
same keys, so what a webhook already queued is a duplicate.

A forge or Temporal that is down, or a tenant queue that is full, is retried with backoff
(CREWWORK_FORGE_INTAKE_MAX_ATTEMPTS, then `failed`); a submission the policy refuses ends `failed` with the reason,
shown by `GET /v1/repositories/{id}/forge/triggers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re

from crewwork.api.forge_pr_review import post_review, review_request
from crewwork.api.forge_subscriptions import (
    WORK_ITEM_ID,
    ForgeSubscribe,
    RetryTrigger,
    refusal_text,
    review_pr_message,
    work_item_of,
)
from crewwork.api.service import ReviewRejected, SubmissionRejected, WorkflowUnavailable, WorkItemService
from crewwork.boundary.urls import parse_repo_url
from crewwork.config import Settings
from crewwork.forge import ForgeError
from crewwork.forge.github_events import REVIEW_BRANCH_PREFIX
from crewwork.forge.intake import IntakeForge, Trigger, at_least
from crewwork.forge.kinds import intake_forge
from crewwork.forge.progress import ItemProgress, progress_body
from crewwork.forge.review_decisions import decision_of, reviewer_of
from crewwork.models import (
    PullRequestSpec,
    WorkItemKind,
)
from crewwork.repos.credentials import CredentialError
from crewwork.repos.landing import LandingConflictError
from crewwork.repos.registration import RepoPolicyError, RepositoryChecks
from crewwork.repos.tenancy import RepositoryNotFound
from crewwork.repos.worker import REPO_ERRORS, Repositories
from crewwork.store.fencing import REVIEW_EVENT
from crewwork.store.forge import ClaimedTrigger, ForgeStore, ProgressRow, Subscription
from crewwork.store.views import StoredWorkItem
from crewwork.store.work_items import IdempotencyConflict, QueueFull

log = logging.getLogger("crewwork.forge.intake")


class ForgeIntake:
    """Claims due triggers and handles each (the module's docstring). One or more per deployment."""

    def __init__(
        self,
        forges: ForgeStore,
        service: WorkItemService,
        settings: Settings,
        *,
        max_attempts: int = 20,
        poll_interval_s: float = 0.0,
        poll_lookback_s: float = 86400.0,
        progress_poll_s: float = 5.0,
        delivery_retention_s: float = 30 * 86400.0,
        poll_s: float = 1.0,
        claim_s: float = 120.0,
        backoff_s: float = 2.0,
    ) -> None:
        self.forges = forges
        self.service = service
        self.settings = settings
        self.max_attempts = max_attempts
        self.poll_interval_s = poll_interval_s
        self.poll_lookback_s = poll_lookback_s
        self.progress_poll_s = progress_poll_s
        self.delivery_retention_s = delivery_retention_s
        self.checks = RepositoryChecks(settings)
        self.repos = Repositories(settings)
        self.poll_s = poll_s
        self.claim_s = claim_s
        self.backoff_s = backoff_s
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """A trigger was queued: look now rather than at the next poll."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        if self.poll_interval_s > 0:
            poller = asyncio.create_task(self._poll_forever(stop))
        try:
            await self._intake_forever(stop)
        finally:
            if self.poll_interval_s > 0:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller

    async def _poll_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.poll_once()
            except Exception as exc:  # the database may be briefly unavailable; keep going
                log.warning("forge poll: %s", exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_interval_s)

    async def poll_once(self) -> int:
        """Forget deliveries older than the retention, then list every subscribed repository's recent triggers
        through its forge's API and queue the ones no delivery brought: each is accepted as the delivery
        `poll:<trigger key>`, so a trigger a webhook already queued (or an earlier poll) is a duplicate and changes
        nothing. A forge that fails, or a subscription that cannot be polled, is skipped until the next poll.
        Returns how many triggers were queued."""
        queued = 0
        await self.forges.prune_deliveries(self.delivery_retention_s)
        now = await self.service.store.db_now()
        for sub in await self.forges.all_subscriptions():
            try:
                queued += await self._poll(sub, now)
            except (RepoPolicyError, CredentialError, ForgeError) as exc:
                log.info("forge poll of %s skipped: %s", sub.id, exc)
            except Exception as exc:  # one subscription's failure never stops the others' poll
                log.warning("forge poll of %s failed: %r", sub.id, exc)
        if queued:
            self.wake()
        return queued

    async def _poll(self, sub: Subscription, now: float) -> int:
        settings = ForgeSubscribe.model_validate(sub.settings)
        url = parse_repo_url(sub.repository_url)
        config = self.checks.intake_forge(url, await self.service.store.tenant_ref(sub.tenant_id))
        forge = intake_forge(config, self.checks.forge_token(config))
        owner, name = url.owner_and_name or ("", "")
        since = max(sub.created_at, now - self.poll_lookback_s)
        queued = 0
        for trigger in await forge.recent_triggers(owner, name, settings.rules(), since):
            accepted = await self.forges.accept(
                sub, f"poll:{trigger.key}"[:100], "poll", trigger.key, trigger.to_json()
            )
            queued += accepted.outcome == "queued"
        return queued

    async def _intake_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                n = await self.run_once() + await self.progress_once()
            except Exception as exc:  # the database may be briefly unavailable; keep going
                log.warning("forge intake: %s", exc)
                n = 0
            if n == 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_s)
                self._wake.clear()

    async def run_once(self, limit: int = 10) -> int:
        batch = await self.forges.claim_triggers(limit, self.claim_s)
        for claimed in batch:
            try:
                await self.handle(claimed)
            except RetryTrigger as exc:
                status = await self.forges.retry_trigger(
                    claimed.id,
                    str(exc),
                    max_attempts=self.max_attempts,
                    backoff_s=self.backoff_s,
                )
                log.info("forge trigger %s: %s (now %s)", claimed.trigger_key, exc, status)
            except Exception as exc:
                # One trigger's unexpected failure (a store hiccup, a bug) is retried like an outage, and never
                # holds up the rest of the batch.
                log.warning("forge trigger %s failed unexpectedly: %r", claimed.trigger_key, exc)
                with contextlib.suppress(Exception):
                    await self.forges.retry_trigger(
                        claimed.id,
                        f"{type(exc).__name__}: {exc}",
                        max_attempts=self.max_attempts,
                        backoff_s=self.backoff_s,
                    )
        return len(batch)

    async def handle(self, claimed: ClaimedTrigger) -> None:
        sub = await self.forges.subscription(claimed.subscription_id)
        if sub is None:
            await self.forges.finish_trigger(claimed.id, "failed", error="unsubscribed")
            return
        try:
            trigger = Trigger.from_json(claimed.trigger)
        except (TypeError, ValueError) as exc:
            await self.forges.finish_trigger(claimed.id, "failed", error=f"unreadable trigger: {exc}")
            return
        settings = ForgeSubscribe.model_validate(sub.settings)
        url = parse_repo_url(sub.repository_url)
        try:
            config = self.checks.intake_forge(url, await self.service.store.tenant_ref(sub.tenant_id))
            forge = intake_forge(config, self.checks.forge_token(config))
        except (RepoPolicyError, CredentialError) as exc:
            await self.forges.finish_trigger(claimed.id, "failed", error=str(exc))
            return
        # The registered repository's name on the forge (the payload's was checked equal to it).
        owner, name = url.owner_and_name or ("", "")
        if trigger.kind in ("review", "closed"):
            await self._decide(claimed, sub, settings, trigger, forge, owner, name)
            return
        try:
            trusted = await self._trusted(forge, owner, name, trigger.actor, settings)
            if not trusted:
                await forge.comment(owner, name, trigger.issue_number, refusal_text(trigger, settings))
                await self.forges.finish_trigger(claimed.id, "refused", error=f"{trigger.actor} is not trusted")
                return
        except ForgeError as exc:
            if exc.retryable:
                raise RetryTrigger(str(exc)) from None
            await self.forges.finish_trigger(claimed.id, "failed", error=str(exc))
            return
        if trigger.pull_request:
            try:
                pr_spec = await review_request(sub, settings.agent, settings.budget, trigger, forge, owner, name)
            except ForgeError as exc:
                if exc.retryable:
                    raise RetryTrigger(str(exc)) from None
                await self.forges.finish_trigger(claimed.id, "failed", error=str(exc))
                return
            if isinstance(pr_spec, str):
                await self.forges.finish_trigger(claimed.id, "failed", error=pr_spec)
                return
            spec = pr_spec
        else:
            spec = work_item_of(sub, trigger, settings)
        try:
            submitted = await self.service.submit(sub.tenant_id, spec)
        except (WorkflowUnavailable, QueueFull) as exc:
            raise RetryTrigger(str(exc)) from None
        except IdempotencyConflict as exc:
            # An earlier try of this trigger made its item, and the subscription's settings changed since: the
            # trigger's item is that one.
            item_id = exc.existing.id
        except (SubmissionRejected, RepositoryNotFound, RepoPolicyError) as exc:
            await self.forges.finish_trigger(claimed.id, "failed", error=str(exc))
            return
        else:
            item_id = submitted.row.id
        await self.forges.finish_trigger(
            claimed.id, "submitted", work_item_id=item_id, progress_on=trigger.issue_number
        )

    async def _decide(
        self,
        claimed: ClaimedTrigger,
        sub: Subscription,
        settings: ForgeSubscribe,
        trigger: Trigger,
        forge: IntakeForge,
        owner: str,
        name: str,
    ) -> None:
        """A review of (or the closing of) a pull request crewwork opened, as the review decision of its work item:
        sent through the workflow's review Update, as the console sends one. Ends the trigger `applied`, `refused`
        (an untrusted reviewer: nothing happens, and nothing is posted, since anyone may review a public pull
        request), or `ignored` with the reason (no such item of this tenant and repository, not awaiting review,
        a review older than the attempt awaiting review, or the workflow refused it)."""
        where = f"pull request #{trigger.issue_number}"
        wid = trigger.pull_head.removeprefix(REVIEW_BRANCH_PREFIX)
        row = await self.service.store.get_work_item(wid, sub.tenant_id) if WORK_ITEM_ID.match(wid) else None
        if row is None or (row.spec.get("repo") or {}).get("id") != sub.repository_id:
            await self.forges.finish_trigger(
                claimed.id,
                "ignored",
                error=f"{where} is not one crewwork opened for a work item of this repository "
                f"(its head {trigger.pull_head[:120]} names no such item)",
            )
            return
        try:
            if not await self._trusted(forge, owner, name, trigger.actor, settings):
                log.info("forge %s by %s on %s ignored: not trusted", trigger.kind, trigger.actor, where)
                await self.forges.finish_trigger(
                    claimed.id,
                    "refused",
                    work_item_id=wid,
                    error=f"{trigger.actor} is not trusted to review: the review decides nothing",
                )
                return
            if await self._already_decided(wid, trigger):
                await self.forges.finish_trigger(claimed.id, "applied", work_item_id=wid)
                return
            if row.state != "awaiting_review":
                await self.forges.finish_trigger(
                    claimed.id,
                    "ignored",
                    work_item_id=wid,
                    error=f"work item {wid} is not awaiting review (state: {row.state})",
                )
                return
            since = await self._awaiting_since(wid)
            # The forge's clock says whole seconds: a review stamped `at` was made in [at, at + 1).
            if trigger.at and since is not None and trigger.at + 1 <= since:
                await self.forges.finish_trigger(
                    claimed.id,
                    "ignored",
                    work_item_id=wid,
                    error=f"the {trigger.kind} on {where} was made before the attempt now awaiting review was ready "
                    "(it is about an earlier attempt)",
                )
                return
            shown = await self._shown(wid)
            if trigger.kind == "review" and shown and trigger.review_commit and trigger.review_commit != shown[1]:
                await self.forges.finish_trigger(
                    claimed.id,
                    "ignored",
                    work_item_id=wid,
                    error=f"the review on {where} is of commit {trigger.review_commit[:12]}, not of attempt "
                    f"{shown[0]} awaiting review (commit {shown[1][:12]})",
                )
                return
            comments = []
            if trigger.kind == "review" and trigger.review_state == "changes_requested" and trigger.review_id:
                comments = await forge.review_comments(owner, name, trigger.issue_number, trigger.review_id)
        except ForgeError as exc:
            if exc.retryable:
                raise RetryTrigger(str(exc)) from None
            await self.forges.finish_trigger(claimed.id, "failed", work_item_id=wid, error=str(exc))
            return
        decision = decision_of(trigger, comments, secret=sub.secret, subscription_id=sub.id)
        if shown is not None and trigger.kind == "review":
            # The attempt the pull request shows: the workflow refuses the decision if another one awaits review.
            # (Closing the pull request rejects the item, whichever attempt waits.)
            decision = decision.model_copy(update={"attempt": shown[0]})
        try:
            await self.service.review(row, decision)
        except WorkflowUnavailable as exc:
            raise RetryTrigger(str(exc)) from None
        except ReviewRejected as exc:
            if str(exc).startswith("the work item's workflow is not running"):
                raise RetryTrigger(str(exc)) from None
            await self.forges.finish_trigger(claimed.id, "ignored", work_item_id=wid, error=str(exc))
            return
        await self.forges.finish_trigger(claimed.id, "applied", work_item_id=wid)

    async def _shown(self, work_item_id: str) -> tuple[int, str] | None:
        """The attempt shown for review on the forge and its review commit, if one is."""
        row = await self.forges.progress_of(work_item_id)
        parts = (row.review_shown or "").split(":") if row is not None else []
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2]:
            return None
        return int(parts[0]), parts[2]

    async def _already_decided(self, work_item_id: str, trigger: Trigger) -> bool:
        """Whether this forge event's decision is already the item's (an intake that died after the Update and before
        recording it tries again): its reviewer names the review, or the closing, exactly."""
        who = reviewer_of(trigger)
        return any(
            e.data.get("reviewer") == who for e in await self.service.store.events_of_type(work_item_id, REVIEW_EVENT)
        )

    async def _awaiting_since(self, work_item_id: str) -> float | None:
        """When the item last started awaiting review (its latest `state_changed` to `awaiting_review`)."""
        events = await self.service.store.events_of_type(work_item_id, "state_changed")
        times = [e.created_at for e in events if e.data.get("state") == "awaiting_review"]
        return max(times) if times else None

    async def _trusted(self, forge: IntakeForge, owner: str, name: str, actor: str, settings: ForgeSubscribe) -> bool:
        if actor.lower() in settings.allow_users:
            return True
        if settings.min_permission is None:
            return False
        return at_least(await forge.permission(owner, name, actor), settings.min_permission)

    # ------------------------------------------------------------------ review on the forge

    async def _show_for_review(self, row: ProgressRow, sub: Subscription, item: StoredWorkItem) -> str | None:
        """Show the attempt awaiting review on the forge, once per attempt: its change pushed to the item's delivery
        branch as a review commit (by compare-and-swap: crewwork.repos.landing.push_for_review) and the pull request
        of that branch opened (or found), where people review it. Returns the pull request's URL. A branch someone
        else wrote is left alone (the item is reviewed in the console only, and the log says why); a repository or
        forge that fails is tried again at the next look (ForgeError)."""
        passed = [a for a in await self.service.store.list_attempts(item.id) if a.verdict == "passed"]
        ref = (passed[-1].agent or {}).get("diff_ref") if passed else None
        if not passed or not isinstance(ref, dict) or not ref.get("id") or not item.base_commit or not item.repo_url:
            return row.review_pull_url
        attempt = passed[-1].number
        shown = f"{attempt}:{str(ref.get('sha256') or ref['id'])[:32]}"
        if (row.review_shown or "").rsplit(":", 1)[0] == shown:
            return row.review_pull_url
        diff = await self.service.store.artifact_content(str(ref["id"]))
        if diff is None:
            return row.review_pull_url
        repo = item.spec.get("repo") or {}
        tenant = await self.service.store.tenant_ref(sub.tenant_id)
        try:
            pushed = await self.repos.push_for_review(
                item.repo_url,
                tenant=tenant,
                credential=await self.service.store.repository_credential(sub.tenant_id, item.repo_url),
                work_item_id=item.id,
                base_commit=item.base_commit,
                diff=diff.decode(),
                attempt=attempt,
                scratch=self.settings.resolved_worktree_dir() / item.id / f"review-{attempt}",
            )
            spec = repo.get("pull_request")
            pr = await self.repos.open_pull_request(
                item.repo_url,
                tenant=tenant,
                branch=pushed.branch,
                spec=PullRequestSpec.model_validate(spec) if isinstance(spec, dict) else None,
                ref=repo.get("ref"),
                message=review_pr_message(item, attempt),
                work_item_id=item.id,
            )
        except LandingConflictError as exc:
            log.warning("work item %s is not shown for review on the forge: %s", item.id, exc)
            await self.forges.review_shown(item.id, f"{shown}:", None)
            return None
        except REPO_ERRORS as exc:
            raise ForgeError(f"showing {item.id} for review: {self.repos.redact(str(exc))}", retryable=True) from None
        url = pr.url if pr is not None else None
        await self.forges.review_shown(item.id, f"{shown}:{pushed.commit}", url)
        return url

    # ------------------------------------------------------------------ progress comments

    async def progress_once(self, limit: int = 20) -> int:
        """Bring the progress comments that are due a look up to date: post or edit where the text the item calls
        for now differs from what was posted. Returns how many were posted or edited."""
        changed = 0
        for row in await self.forges.claim_progress(limit, self.claim_s):
            try:
                changed += await self._progress(row)
            except ForgeError as exc:
                await self.forges.progress_failed(row.work_item_id, str(exc), backoff_s=self.backoff_s)
                log.info("forge progress of %s: %s", row.work_item_id, exc)
            except Exception as exc:
                log.warning("forge progress of %s failed unexpectedly: %r", row.work_item_id, exc)
                with contextlib.suppress(Exception):
                    await self.forges.progress_failed(
                        row.work_item_id, f"{type(exc).__name__}: {exc}", backoff_s=self.backoff_s
                    )
        return changed

    async def _progress(self, row: ProgressRow) -> int:
        sub = await self.forges.subscription(row.subscription_id)
        item = None if sub is None else await self.service.store.get_work_item(row.work_item_id, sub.tenant_id)
        if sub is None or item is None:
            await self.forges.progress_seen(row.work_item_id, recheck_s=0, done=True)
            return 0
        url = parse_repo_url(sub.repository_url)
        try:
            config = self.checks.intake_forge(url, await self.service.store.tenant_ref(sub.tenant_id))
            forge = intake_forge(config, self.checks.forge_token(config))
        except (RepoPolicyError, CredentialError) as exc:
            raise ForgeError(str(exc), retryable=True) from None
        owner, name = url.owner_and_name or ("", "")
        review_url = row.review_pull_url
        if item.state == "awaiting_review":
            review_url = await self._show_for_review(row, sub, item)
        posted_review = None
        if item.kind == WorkItemKind.pr_review.value and item.state == "succeeded":
            posted_review = await post_review(self.service.store, item, forge, owner, name, row.issue_number)
        result = item.result or {}
        pr_url = result.get("pull_request_url") if isinstance(result.get("pull_request_url"), str) else None
        pr_head = None
        if item.state == "succeeded" and pr_url:
            number = re.search(r"/pull/(\d+)$", pr_url)
            if number is not None:
                pr_head = await forge.pull_request_head(owner, name, int(number.group(1)))
        body, final = progress_body(
            ItemProgress(
                work_item_id=item.id,
                state=item.state,
                attempts=item.attempt_count,
                reason=item.reason,
                console_url=f"{(self.settings.evidence.public_url or '').rstrip('/')}/console#/items/{item.id}",
                temporal_url=f"{self.settings.temporal_ui_url.rstrip('/')}/namespaces/"
                f"{self.settings.temporal_namespace}/workflows/{item.workflow_id}",
                mock=item.mock,
                pull_request_url=pr_url,
                landed_commit=item.landed_commit,
                delivery_branch=item.delivery_branch,
                pr_head=pr_head,
                review_pull_url=review_url,
                posted_review_url=posted_review,
            )
        )
        digest = hashlib.sha256(body.encode()).hexdigest()
        if digest == row.posted:
            await self.forges.progress_seen(row.work_item_id, recheck_s=self.progress_poll_s, done=final)
            return 0
        if row.comment_id is None:
            posted = await forge.comment(owner, name, row.issue_number, body)
        else:
            posted = await forge.edit_comment(owner, name, row.comment_id, body)
        await self.forges.progress_seen(
            row.work_item_id, recheck_s=self.progress_poll_s, comment_id=posted.id, posted=digest, done=final
        )
        return 1
