"""Webhook registrations and their durable outbox: the persistence of webhook delivery.

A state change writes one outbox row per matching webhook in the SAME transaction as the change (`enqueue`, called
by the fenced write), so a change is never committed without its notifications, nor a notification without its
change. A deliverer (crewwork/webhooks/deliver.py) claims due rows (`claim_due`), and marks each delivered, or failed
(a retry with exponential backoff, or after the last attempt the dead-letter state `dead`, from which an operator can
redeliver). Claims are leases on the row (`next_attempt_at` pushed into the future, taken with `FOR UPDATE SKIP
LOCKED` on PostgreSQL), so several deliverers can run, and a deliverer that dies mid-delivery only delays the row
until its claim expires: delivery is at least once.

Reads return frozen values, never ORM rows.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.client.webhooks import SECRET_PREFIX
from crewwork.models.ids import new_id
from crewwork.observability import tracing
from crewwork.store.engine import Database
from crewwork.store.tables import OutboxMessage, Webhook, WorkItem

SECRET_BYTES = 32


def new_secret() -> str:
    """A Standard Webhooks secret: `whsec_` + standard base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


async def enqueue(
    s: AsyncSession,
    *,
    tenant_id: str,
    work_item_id: str,
    event_type: str,
    payload: dict[str, Any],
    now: float,
) -> int:
    """Insert one outbox row per active webhook of the tenant that wants `event_type`. Call inside the change's
    transaction. Returns the number of rows written."""
    # Core, not the ORM: this runs inside every state change's transaction.
    conn = await s.connection()
    hooks = (
        await conn.execute(
            select(Webhook.id, Webhook.event_types)
            .where(Webhook.tenant_id == tenant_id, Webhook.active.is_(True))
            # In the webhooks' order, as the server-side write does (migration 0008): the same rows in the same order.
            .order_by(Webhook.id)
        )
    ).all()
    n = 0
    traceparent = tracing.current_traceparent()
    for hook_id, types in hooks:
        wanted = {t for t in types.split(",") if t}
        if wanted and event_type not in wanted:
            continue
        s.add(
            OutboxMessage(
                tenant_id=tenant_id,
                webhook_id=hook_id,
                work_item_id=work_item_id,
                event_type=event_type,
                payload=payload,
                status="pending",
                attempts=0,
                next_attempt_at=now,
                created_at=now,
                trace_context=traceparent,
            )
        )
        n += 1
    return n


@dataclass(frozen=True)
class WebhookRecord:
    """A registered, active webhook (its secrets are not part of it)."""

    id: str
    url: str
    event_types: tuple[str, ...]
    """The event types it receives; empty: all of them."""
    created_at: float


@dataclass(frozen=True)
class NewWebhook(WebhookRecord):
    secret: str
    """The signing secret, known to the caller only at registration (and at each rotation)."""


@dataclass(frozen=True)
class Rotated:
    webhook_id: str
    secret: str
    previous_valid_until: float | None
    """Until when the previous secret also signs (None: it was dropped at once)."""


@dataclass(frozen=True)
class Delivery:
    """One outbox row: a notification for one webhook, and how its delivery went so far."""

    id: int
    webhook_id: str
    work_item_id: str
    event_type: str
    payload: dict[str, Any]
    status: str
    """pending | delivered | dead"""
    attempts: int
    last_error: str | None
    created_at: float
    delivered_at: float | None
    next_attempt_at: float


@dataclass(frozen=True)
class Claimed:
    """A due row a deliverer took, with what it needs to send it."""

    id: int
    webhook_id: str
    url: str
    secrets: list[str]
    """The secrets that sign this delivery: the current one, then the previous one while its overlap lasts."""
    event_type: str
    payload: dict[str, Any]
    attempts: int
    trace_context: str | None = None


def _webhook(h: Webhook) -> WebhookRecord:
    return WebhookRecord(h.id, h.url, tuple(t for t in h.event_types.split(",") if t), h.created_at)


def _about_item(payload: dict[str, Any], kind: str | None, mock: bool | None) -> dict[str, Any]:
    """A notification's body with the work item's `kind` and `mock` label, read when it is delivered, so
    that a receiver can tell a mock agent's results from real ones without asking the API, as every other view says
    (README: "labelled *mock* everywhere"). Read at each delivery attempt, not written with the change: the change's
    write, a server-side function (migration 0008), stays as it is. `kind` never changes; `mock` can only go from
    false to true (an item submitted before mock items were labelled at submission, or a plugin agent the API did
    not know as a mock, labelled by its `finish`), so a retried delivery may then carry `mock: true` where its first
    attempt said false, never the other way."""
    if kind is None:  # the item is gone (never, today: items are not deleted)
        return payload
    return {"kind": kind, "mock": bool(mock), **payload}


def _delivery(m: OutboxMessage) -> Delivery:
    return Delivery(
        id=m.id,
        webhook_id=m.webhook_id,
        work_item_id=m.work_item_id,
        event_type=m.event_type,
        payload=m.payload,
        status=m.status,
        attempts=m.attempts,
        last_error=m.last_error,
        created_at=m.created_at,
        delivered_at=m.delivered_at,
        next_attempt_at=m.next_attempt_at,
    )


class OutboxStore:
    """Webhook registrations and outbox rows, on the store's database (one per process: the API holds one)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def create_webhook(self, tenant_id: str, url: str, event_types: list[str]) -> NewWebhook:
        """Register a webhook of the tenant for `event_types` (empty: all), with a new secret."""
        async with self.db.session() as s:
            hook = Webhook(
                id=new_id("wh"),
                tenant_id=tenant_id,
                url=url,
                secret=new_secret(),
                event_types=",".join(sorted(set(event_types))),
                active=True,
                created_at=await self.db.now(s),
            )
            s.add(hook)
        record = _webhook(hook)
        return NewWebhook(record.id, record.url, record.event_types, record.created_at, hook.secret)

    async def rotate_secret(self, tenant_id: str, webhook_id: str, overlap_s: float) -> Rotated | None:
        """Give the webhook a new secret; the current one keeps signing (as a second signature) for `overlap_s`
        seconds, then is dropped. A previous secret from an earlier rotation is dropped at once. None if there is no
        such active webhook of the tenant."""
        async with self.db.session() as s:
            hook = await s.scalar(
                select(Webhook)
                .where(Webhook.id == webhook_id, Webhook.tenant_id == tenant_id, Webhook.active.is_(True))
                .with_for_update()
            )
            if hook is None:
                return None
            now = await self.db.now(s)
            secret = new_secret()
            if overlap_s > 0:
                hook.previous_secret, hook.previous_secret_expires_at = hook.secret, now + overlap_s
            else:
                hook.previous_secret = hook.previous_secret_expires_at = None
            hook.secret = secret
            return Rotated(hook.id, secret, hook.previous_secret_expires_at)

    async def list_webhooks(self, tenant_id: str) -> list[WebhookRecord]:
        """The tenant's active webhooks, oldest first."""
        async with self.db.session() as s:
            q = select(Webhook).where(Webhook.tenant_id == tenant_id, Webhook.active.is_(True))
            return [_webhook(h) for h in (await s.scalars(q.order_by(Webhook.created_at))).all()]

    async def get_webhook(self, tenant_id: str, webhook_id: str) -> WebhookRecord | None:
        """The tenant's active webhook `webhook_id` (None: no such webhook of this tenant)."""
        async with self.db.session() as s:
            hook = await s.scalar(
                select(Webhook).where(
                    Webhook.id == webhook_id, Webhook.tenant_id == tenant_id, Webhook.active.is_(True)
                )
            )
            return None if hook is None else _webhook(hook)

    async def delete_webhook(self, tenant_id: str, webhook_id: str) -> bool:
        async with self.db.session() as s:
            res = await s.execute(
                update(Webhook)
                .where(Webhook.id == webhook_id, Webhook.tenant_id == tenant_id, Webhook.active.is_(True))
                .values(active=False)
            )
            return bool(res.rowcount)  # type: ignore[attr-defined]

    async def deliveries(self, tenant_id: str, webhook_id: str, limit: int = 100) -> list[Delivery]:
        """The webhook's latest `limit` outbox rows, newest first."""
        async with self.db.session() as s:
            q = (
                select(OutboxMessage)
                .where(OutboxMessage.tenant_id == tenant_id, OutboxMessage.webhook_id == webhook_id)
                .order_by(OutboxMessage.id.desc())
                .limit(limit)
            )
            return [_delivery(m) for m in (await s.scalars(q)).all()]

    async def redeliver_dead(self, tenant_id: str, webhook_id: str) -> int:
        """Put the webhook's dead-lettered rows back to pending, due now; returns how many."""
        async with self.db.session() as s:
            res = await s.execute(
                update(OutboxMessage)
                .where(
                    OutboxMessage.tenant_id == tenant_id,
                    OutboxMessage.webhook_id == webhook_id,
                    OutboxMessage.status == "dead",
                )
                .values(status="pending", attempts=0, next_attempt_at=await self.db.now(s))
            )
            return int(res.rowcount)  # type: ignore[attr-defined]

    async def any_due(self) -> bool:
        """Whether a row is due: one indexed read (ix_outbox_due) outside a transaction (`Database.any_row`)."""
        t = OutboxMessage
        return await self.db.any_row(
            "outbox_due",
            lambda: select(t.id).where(t.status == "pending", t.next_attempt_at <= self.db.now_sql()).limit(1),
        )

    async def claim_due(self, limit: int, claim_s: float) -> list[Claimed]:
        """Take up to `limit` due rows, pushing their next attempt `claim_s` ahead so no one else takes them."""
        if not await self.any_due():
            return []
        async with self.db.session() as s:
            now = await self.db.now(s)
            q = (
                select(
                    OutboxMessage,
                    Webhook.url,
                    Webhook.secret,
                    Webhook.previous_secret,
                    Webhook.previous_secret_expires_at,
                    WorkItem.kind,
                    WorkItem.mock,
                )
                .join(Webhook, Webhook.id == OutboxMessage.webhook_id)
                .outerjoin(WorkItem, WorkItem.id == OutboxMessage.work_item_id)
                .where(OutboxMessage.status == "pending", OutboxMessage.next_attempt_at <= now)
                .order_by(OutboxMessage.next_attempt_at, OutboxMessage.id)
                .limit(limit)
            )
            if not self.db.is_sqlite:
                q = q.with_for_update(skip_locked=True, of=OutboxMessage)
            rows = (await s.execute(q)).all()
            out = []
            for msg, url, secret, previous, previous_until, kind, mock in rows:
                msg.next_attempt_at = now + claim_s
                signing = [secret]
                if previous and previous_until is not None and previous_until > now:
                    signing.append(previous)
                out.append(
                    Claimed(
                        msg.id,
                        msg.webhook_id,
                        url,
                        signing,
                        msg.event_type,
                        _about_item(msg.payload, kind, mock),
                        msg.attempts,
                        msg.trace_context,
                    )
                )
            return out

    async def mark_delivered(self, msg_id: int) -> None:
        """Record a successful delivery (an attempt that counts)."""
        async with self.db.session() as s:
            now = await self.db.now(s)
            await s.execute(
                update(OutboxMessage)
                .where(OutboxMessage.id == msg_id)
                .values(status="delivered", delivered_at=now, attempts=OutboxMessage.attempts + 1, last_error=None)
            )

    async def mark_failed(
        self, msg_id: int, error: str, *, max_attempts: int, backoff_s: float, max_backoff_s: float
    ) -> str:
        """Record a failed attempt; returns the new status (`pending` for a retry, `dead` after the last)."""
        async with self.db.session() as s:
            now = await self.db.now(s)
            attempts = int(await s.scalar(select(OutboxMessage.attempts).where(OutboxMessage.id == msg_id)) or 0) + 1
            status = "dead" if attempts >= max_attempts else "pending"
            delay = min(max_backoff_s, backoff_s * (2 ** (attempts - 1)))
            await s.execute(
                update(OutboxMessage)
                .where(OutboxMessage.id == msg_id)
                .values(status=status, attempts=attempts, last_error=error[:2000], next_attempt_at=now + delay)
            )
            return status
