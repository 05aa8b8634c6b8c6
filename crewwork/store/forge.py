"""Forge intake's persistence (docs/forge.md): subscriptions of registered repositories to their forge's webhooks,
the deliveries they accepted, and the triggers queued for the intake.

Exactly once per trigger is two unique keys written in ONE transaction by `accept`: the forge's delivery id per
subscription (`forge_deliveries`: a retried, redelivered or replayed delivery is a duplicate), and the trigger's own
key per subscription (`forge_triggers.trigger_key`, from what the trigger is — the issue and label, the comment's
id — never from the delivery: two deliveries of one trigger under different ids still queue it once). The intake
(crewwork/api/forge_intake.py) claims due trigger rows like the webhook deliverer claims outbox rows: a claim is a
lease on `next_attempt_at`, taken with `FOR UPDATE SKIP LOCKED` on PostgreSQL, so several API processes can run
it and one that dies mid-trigger only delays the row.

Reads return frozen values, never ORM rows.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from crewwork.models.ids import new_id
from crewwork.store.engine import Database
from crewwork.store.tables import ForgeDelivery, ForgeProgress, ForgeSubscription, ForgeTrigger, Repository

SECRET_BYTES = 32


def new_forge_secret() -> str:
    """A webhook secret to paste into the forge's webhook settings: 43 URL-safe characters (256 random bits)."""
    return secrets.token_urlsafe(SECRET_BYTES)


@dataclass(frozen=True)
class Subscription:
    id: str
    tenant_id: str
    repository_id: str
    repository_url: str
    dialect: str
    secret: str
    settings: dict[str, Any]
    created_at: float


@dataclass(frozen=True)
class ClaimedTrigger:
    id: int
    subscription_id: str
    tenant_id: str
    trigger_key: str
    trigger: dict[str, Any]
    attempts: int


@dataclass(frozen=True)
class ProgressRow:
    work_item_id: str
    subscription_id: str
    issue_number: int
    comment_id: int | None
    posted: str | None
    attempts: int
    done: bool = False
    last_error: str | None = None
    review_shown: str | None = None
    """`<attempt>:<diff sha256>` of the attempt shown for review on the forge, if any."""
    review_pull_url: str | None = None


@dataclass(frozen=True)
class TriggerRecord:
    id: int
    subscription_id: str
    trigger_key: str
    kind: str
    actor: str
    status: str
    attempts: int
    work_item_id: str | None
    last_error: str | None
    created_at: float
    done_at: float | None


@dataclass(frozen=True)
class Accepted:
    """What `accept` did with a delivery: `queued` (a new trigger), `duplicate_delivery` (this delivery id was
    accepted before), `duplicate_trigger` (a new delivery of a trigger already queued), `ignored` (no trigger)."""

    outcome: str
    trigger_id: int | None = None


class ForgeStore:
    """Forge subscriptions, deliveries and triggers, on the store's database (beside the facade, like the outbox)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------------ subscriptions

    async def subscribe(
        self, *, tenant_id: str, repository_id: str, dialect: str, settings: dict[str, Any]
    ) -> Subscription:
        """Subscribe the tenant's repository (one subscription per repository: a second replaces the settings and
        keeps the secret, so re-subscribing never breaks the forge's configured webhook)."""
        async with self.db.session() as s:
            now = await self.db.now(s)
            row = await s.scalar(
                select(ForgeSubscription)
                .where(ForgeSubscription.repository_id == repository_id, ForgeSubscription.tenant_id == tenant_id)
                .with_for_update()
            )
            if row is None:
                row = ForgeSubscription(
                    id=new_id("fsub"),
                    tenant_id=tenant_id,
                    repository_id=repository_id,
                    dialect=dialect,
                    secret=new_forge_secret(),
                    settings=settings,
                    created_at=now,
                )
                s.add(row)
            else:
                row.dialect, row.settings = dialect, settings
            url = await s.scalar(select(Repository.url).where(Repository.id == repository_id))
            return _subscription(row, str(url))

    async def rotate_forge_secret(self, tenant_id: str, repository_id: str) -> Subscription | None:
        async with self.db.session() as s:
            row = await s.scalar(
                select(ForgeSubscription)
                .where(ForgeSubscription.repository_id == repository_id, ForgeSubscription.tenant_id == tenant_id)
                .with_for_update()
            )
            if row is None:
                return None
            row.secret = new_forge_secret()
            url = await s.scalar(select(Repository.url).where(Repository.id == repository_id))
            return _subscription(row, str(url))

    async def subscription(self, subscription_id: str) -> Subscription | None:
        """Any tenant's subscription by id (the webhook endpoint: the id is in the URL, the secret proves the rest)."""
        async with self.db.session() as s:
            found = (
                await s.execute(
                    select(ForgeSubscription, Repository.url)
                    .join(Repository, Repository.id == ForgeSubscription.repository_id)
                    .where(ForgeSubscription.id == subscription_id)
                )
            ).first()
            return None if found is None else _subscription(found[0], found[1])

    async def subscription_of(self, tenant_id: str, repository_id: str) -> Subscription | None:
        async with self.db.session() as s:
            found = (
                await s.execute(
                    select(ForgeSubscription, Repository.url)
                    .join(Repository, Repository.id == ForgeSubscription.repository_id)
                    .where(ForgeSubscription.repository_id == repository_id, ForgeSubscription.tenant_id == tenant_id)
                )
            ).first()
            return None if found is None else _subscription(found[0], found[1])

    async def all_subscriptions(self, limit: int = 10_000) -> list[Subscription]:
        """Every tenant's subscriptions, oldest first (the catch-up poll walks them)."""
        async with self.db.session() as s:
            rows = await s.execute(
                select(ForgeSubscription, Repository.url)
                .join(Repository, Repository.id == ForgeSubscription.repository_id)
                .order_by(ForgeSubscription.created_at, ForgeSubscription.id)
                .limit(limit)
            )
            return [_subscription(row, url) for row, url in rows.all()]

    async def unsubscribe(self, tenant_id: str, repository_id: str) -> bool:
        async with self.db.session() as s:
            res = await s.execute(
                delete(ForgeSubscription).where(
                    ForgeSubscription.repository_id == repository_id, ForgeSubscription.tenant_id == tenant_id
                )
            )
            return bool(res.rowcount)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ deliveries

    async def accept(
        self,
        sub: Subscription,
        delivery_id: str,
        event: str,
        trigger_key: str | None,
        trigger: dict[str, Any] | None,
    ) -> Accepted:
        """Record a verified delivery and queue its trigger (if any), in one transaction, at most once each."""
        try:
            async with self.db.session() as s:
                now = await self.db.now(s)
                if await s.scalar(_delivery_seen(sub.id, delivery_id)) is not None:
                    return Accepted("duplicate_delivery")
                if trigger_key is None or trigger is None:
                    s.add(_delivery(sub.id, delivery_id, event, "ignored", now))
                    return Accepted("ignored")
                if await s.scalar(_trigger_seen(sub.id, trigger_key)) is not None:
                    s.add(_delivery(sub.id, delivery_id, event, "duplicate_trigger", now))
                    return Accepted("duplicate_trigger")
                s.add(_delivery(sub.id, delivery_id, event, "queued", now))
                row = ForgeTrigger(
                    subscription_id=sub.id,
                    tenant_id=sub.tenant_id,
                    trigger_key=trigger_key,
                    trigger=trigger,
                    status="pending",
                    attempts=0,
                    next_attempt_at=now,
                    created_at=now,
                )
                s.add(row)
                await s.flush()
                return Accepted("queued", row.id)
        except IntegrityError:
            pass
        # A concurrent delivery won one of the two keys: whichever it was, this one changes nothing more. It is
        # recorded as a duplicate of the trigger, unless a delivery of the same id got there first (then it is that).
        try:
            async with self.db.session() as s:
                if await s.scalar(_delivery_seen(sub.id, delivery_id)) is not None:
                    return Accepted("duplicate_delivery")
                s.add(_delivery(sub.id, delivery_id, event, "duplicate_trigger", await self.db.now(s)))
            return Accepted("duplicate_trigger")
        except IntegrityError:
            return Accepted("duplicate_delivery")

    # ------------------------------------------------------------------ the intake's queue

    async def claim_triggers(self, limit: int, claim_s: float) -> list[ClaimedTrigger]:
        """Take up to `limit` due triggers, pushing their next attempt `claim_s` ahead so no one else takes them."""
        t = ForgeTrigger
        due = lambda: select(t.id).where(t.status == "pending", t.next_attempt_at <= self.db.now_sql()).limit(1)  # noqa: E731
        if not await self.db.any_row("forge_triggers_due", due):
            return []
        async with self.db.session() as s:
            now = await self.db.now(s)
            q = (
                select(ForgeTrigger)
                .where(ForgeTrigger.status == "pending", ForgeTrigger.next_attempt_at <= now)
                .order_by(ForgeTrigger.next_attempt_at, ForgeTrigger.id)
                .limit(limit)
            )
            if not self.db.is_sqlite:
                q = q.with_for_update(skip_locked=True)
            out = []
            for row in (await s.scalars(q)).all():
                row.next_attempt_at = now + claim_s
                out.append(
                    ClaimedTrigger(
                        row.id, row.subscription_id, row.tenant_id, row.trigger_key, dict(row.trigger), row.attempts
                    )
                )
            return out

    async def finish_trigger(
        self,
        trigger_id: int,
        status: str,
        *,
        work_item_id: str | None = None,
        error: str | None = None,
        progress_on: int | None = None,
    ) -> None:
        """End a trigger: `submitted` (with its work item), `refused` (its actor is not trusted; refused on the
        forge), or `failed` (the submission was refused; `error` says why). `progress_on`: the issue the submitted
        item's progress comment goes to (its row is written in the same transaction, once per item)."""
        async with self.db.session() as s:
            if work_item_id is not None and progress_on is not None:
                sub_id = await s.scalar(select(ForgeTrigger.subscription_id).where(ForgeTrigger.id == trigger_id))
                known = await s.scalar(
                    select(ForgeProgress.work_item_id).where(ForgeProgress.work_item_id == work_item_id)
                )
                if sub_id is not None and known is None:
                    s.add(
                        ForgeProgress(
                            work_item_id=work_item_id,
                            subscription_id=sub_id,
                            issue_number=progress_on,
                            done=False,
                            attempts=0,
                            next_attempt_at=await self.db.now(s),
                        )
                    )
            await s.execute(
                update(ForgeTrigger)
                .where(ForgeTrigger.id == trigger_id, ForgeTrigger.status == "pending")
                .values(
                    status=status,
                    work_item_id=work_item_id,
                    last_error=(error or None) and error[:2000],
                    attempts=ForgeTrigger.attempts + 1,
                    done_at=await self.db.now(s),
                )
            )

    async def retry_trigger(self, trigger_id: int, error: str, *, max_attempts: int, backoff_s: float) -> str:
        """Record a failed try (the forge or Temporal unreachable): `pending` again after a backoff, or `failed`
        after the last attempt. Returns the new status."""
        async with self.db.session() as s:
            now = await self.db.now(s)
            attempts = int(await s.scalar(select(ForgeTrigger.attempts).where(ForgeTrigger.id == trigger_id)) or 0)
            attempts += 1
            status = "failed" if attempts >= max_attempts else "pending"
            await s.execute(
                update(ForgeTrigger)
                .where(ForgeTrigger.id == trigger_id, ForgeTrigger.status == "pending")
                .values(
                    status=status,
                    attempts=attempts,
                    last_error=error[:2000],
                    next_attempt_at=now + min(300.0, backoff_s * 2 ** (attempts - 1)),
                    done_at=now if status == "failed" else None,
                )
            )
            return status

    # ------------------------------------------------------------------ progress comments

    async def claim_progress(self, limit: int, claim_s: float) -> list[ProgressRow]:
        """Take up to `limit` progress comments due a look, hiding them from other claimers for `claim_s`."""
        p = ForgeProgress
        due = lambda: select(p.work_item_id).where(p.done.is_(False), p.next_attempt_at <= self.db.now_sql()).limit(1)  # noqa: E731
        if not await self.db.any_row("forge_progress_due", due):
            return []
        async with self.db.session() as s:
            now = await self.db.now(s)
            q = (
                select(ForgeProgress)
                .where(ForgeProgress.done.is_(False), ForgeProgress.next_attempt_at <= now)
                .order_by(ForgeProgress.next_attempt_at)
                .limit(limit)
            )
            if not self.db.is_sqlite:
                q = q.with_for_update(skip_locked=True)
            out = []
            for row in (await s.scalars(q)).all():
                row.next_attempt_at = now + claim_s
                out.append(
                    ProgressRow(
                        row.work_item_id,
                        row.subscription_id,
                        row.issue_number,
                        row.comment_id,
                        row.posted,
                        row.attempts,
                        review_shown=row.review_shown,
                        review_pull_url=row.review_pull_url,
                    )
                )
            return out

    async def progress_seen(
        self,
        work_item_id: str,
        *,
        recheck_s: float,
        comment_id: int | None = None,
        posted: str | None = None,
        done: bool = False,
    ) -> None:
        """Record a look at a progress comment: what was posted (if anything was), and when to look again."""
        async with self.db.session() as s:
            values: dict[str, Any] = {
                "next_attempt_at": await self.db.now(s) + recheck_s,
                "attempts": 0,
                "last_error": None,
                "done": done,
            }
            if comment_id is not None:
                values["comment_id"] = comment_id
            if posted is not None:
                values["posted"] = posted
            await s.execute(update(ForgeProgress).where(ForgeProgress.work_item_id == work_item_id).values(**values))

    async def review_shown(self, work_item_id: str, shown: str, pull_url: str | None) -> None:
        """Record which attempt is shown for review on the forge, and in which pull request."""
        async with self.db.session() as s:
            await s.execute(
                update(ForgeProgress)
                .where(ForgeProgress.work_item_id == work_item_id)
                .values(review_shown=shown[:100], review_pull_url=pull_url and pull_url[:2000])
            )

    async def progress_failed(self, work_item_id: str, error: str, *, backoff_s: float) -> None:
        """A post the forge did not take: tried again after a backoff (doubling to 5 min), never given up while the
        item's last word is not on the forge."""
        async with self.db.session() as s:
            now = await self.db.now(s)
            attempts = (
                int(
                    await s.scalar(select(ForgeProgress.attempts).where(ForgeProgress.work_item_id == work_item_id))
                    or 0
                )
                + 1
            )
            await s.execute(
                update(ForgeProgress)
                .where(ForgeProgress.work_item_id == work_item_id)
                .values(
                    attempts=attempts,
                    last_error=error[:2000],
                    next_attempt_at=now + min(300.0, backoff_s * 2 ** (attempts - 1)),
                )
            )

    async def progress_of(self, work_item_id: str) -> ProgressRow | None:
        async with self.db.session() as s:
            row = await s.scalar(select(ForgeProgress).where(ForgeProgress.work_item_id == work_item_id))
            if row is None:
                return None
            return ProgressRow(
                row.work_item_id,
                row.subscription_id,
                row.issue_number,
                row.comment_id,
                row.posted,
                row.attempts,
                row.done,
                row.last_error,
                row.review_shown,
                row.review_pull_url,
            )

    async def triggers(self, tenant_id: str, subscription_id: str, limit: int = 100) -> list[TriggerRecord]:
        """The subscription's latest triggers, newest first."""
        async with self.db.session() as s:
            q = (
                select(ForgeTrigger)
                .where(ForgeTrigger.tenant_id == tenant_id, ForgeTrigger.subscription_id == subscription_id)
                .order_by(ForgeTrigger.id.desc())
                .limit(limit)
            )
            return [
                TriggerRecord(
                    r.id,
                    r.subscription_id,
                    r.trigger_key,
                    str(r.trigger.get("kind", "")),
                    str(r.trigger.get("actor", "")),
                    r.status,
                    r.attempts,
                    r.work_item_id,
                    r.last_error,
                    r.created_at,
                    r.done_at,
                )
                for r in (await s.scalars(q)).all()
            ]

    async def prune_deliveries(self, older_than_s: float) -> int:
        """Forget deliveries recorded more than `older_than_s` ago. Safe for exactly once: a replay of a forgotten
        delivery is a new delivery of a trigger whose key is still kept, so it queues nothing."""
        async with self.db.session() as s:
            res = await s.execute(
                delete(ForgeDelivery).where(ForgeDelivery.received_at < await self.db.now(s) - older_than_s)
            )
            return int(res.rowcount)  # type: ignore[attr-defined]

    async def delivery_outcomes(self, subscription_id: str) -> dict[str, str]:
        """Delivery id -> outcome, for a subscription (tests and operators)."""
        async with self.db.session() as s:
            rows = await s.execute(
                select(ForgeDelivery.delivery_id, ForgeDelivery.outcome).where(
                    ForgeDelivery.subscription_id == subscription_id
                )
            )
            return {d: o for d, o in rows.all()}


def _delivery_seen(subscription_id: str, delivery_id: str) -> Any:
    return select(ForgeDelivery.outcome).where(
        ForgeDelivery.subscription_id == subscription_id, ForgeDelivery.delivery_id == delivery_id
    )


def _trigger_seen(subscription_id: str, key: str) -> Any:
    return select(ForgeTrigger.id).where(
        ForgeTrigger.subscription_id == subscription_id, ForgeTrigger.trigger_key == key
    )


def _delivery(subscription_id: str, delivery_id: str, event: str, outcome: str, now: float) -> ForgeDelivery:
    return ForgeDelivery(
        subscription_id=subscription_id, delivery_id=delivery_id, event=event[:64], outcome=outcome, received_at=now
    )


def _subscription(row: ForgeSubscription, url: str) -> Subscription:
    return Subscription(
        row.id, row.tenant_id, row.repository_id, url, row.dialect, row.secret, dict(row.settings), row.created_at
    )
