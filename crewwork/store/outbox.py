"""Webhooks through a durable outbox.

A state change writes one outbox row per matching webhook in the SAME transaction as the change (`enqueue`, called
from `Store.set_state`), so a change is never committed without its notifications, nor a notification without its
change. A deliverer claims due rows, POSTs them signed with HMAC-SHA256, and marks them delivered, or schedules a
retry with exponential backoff, or after `max_attempts` failures moves them to the dead-letter state `dead` (from
which an operator can redeliver). Claims are leases on the row (`next_attempt_at` pushed into the future, taken
with `FOR UPDATE SKIP LOCKED` on PostgreSQL), so several deliverers can run, and a deliverer that dies mid-delivery
only delays the row until its claim expires: delivery is at least once, and the `X-Crewwork-Delivery` header lets
receivers drop duplicates.

Signature: `X-Crewwork-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.ids import new_id
from crewwork.store.tables import OutboxMessage, Webhook

if TYPE_CHECKING:
    from crewwork.store.store import Store

log = logging.getLogger("crewwork.outbox")

SIGNATURE_HEADER = "X-Crewwork-Signature"
DELIVERY_HEADER = "X-Crewwork-Delivery"
EVENT_HEADER = "X-Crewwork-Event"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(
    secret: str, header: str, body: bytes, *, tolerance_s: float | None = 300.0, now: float | None = None
) -> bool:
    """Check a delivery's signature header (what a receiver does). Constant-time comparison."""
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        ts = int(parts["t"])
        given = parts["v1"]
    except (ValueError, KeyError):
        return False
    if tolerance_s is not None and abs((now if now is not None else time.time()) - ts) > tolerance_s:
        return False
    expected = sign(secret, ts, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, given)


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
            select(Webhook.id, Webhook.event_types).where(Webhook.tenant_id == tenant_id, Webhook.active.is_(True))
        )
    ).all()
    n = 0
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
            )
        )
        n += 1
    return n


@dataclass
class Claimed:
    id: int
    webhook_id: str
    url: str
    secret: str
    event_type: str
    payload: dict[str, Any]
    attempts: int


class OutboxStore:
    """Webhook registrations and outbox rows, on top of the canonical store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def create_webhook(self, tenant_id: str, url: str, event_types: list[str]) -> Webhook:
        async with self.store.session() as s:
            hook = Webhook(
                id=new_id("wh"),
                tenant_id=tenant_id,
                url=url,
                secret="whsec_" + secrets.token_urlsafe(32),
                event_types=",".join(sorted(set(event_types))),
                active=True,
                created_at=await self.store.now(s),
            )
            s.add(hook)
        return hook

    async def list_webhooks(self, tenant_id: str) -> list[Webhook]:
        async with self.store.session() as s:
            q = select(Webhook).where(Webhook.tenant_id == tenant_id, Webhook.active.is_(True))
            return list((await s.scalars(q.order_by(Webhook.created_at))).all())

    async def get_webhook(self, tenant_id: str, webhook_id: str) -> Webhook | None:
        async with self.store.session() as s:
            return await s.scalar(
                select(Webhook).where(
                    Webhook.id == webhook_id, Webhook.tenant_id == tenant_id, Webhook.active.is_(True)
                )
            )

    async def delete_webhook(self, tenant_id: str, webhook_id: str) -> bool:
        async with self.store.session() as s:
            res = await s.execute(
                update(Webhook)
                .where(Webhook.id == webhook_id, Webhook.tenant_id == tenant_id, Webhook.active.is_(True))
                .values(active=False)
            )
            return bool(res.rowcount)  # type: ignore[attr-defined]

    async def deliveries(self, tenant_id: str, webhook_id: str, limit: int = 100) -> list[OutboxMessage]:
        async with self.store.session() as s:
            q = (
                select(OutboxMessage)
                .where(OutboxMessage.tenant_id == tenant_id, OutboxMessage.webhook_id == webhook_id)
                .order_by(OutboxMessage.id.desc())
                .limit(limit)
            )
            return list((await s.scalars(q)).all())

    async def counts(self) -> dict[str, int]:
        async with self.store.session() as s:
            rows = (await s.execute(select(OutboxMessage.status, func.count()).group_by(OutboxMessage.status))).all()
            return {str(k): int(v) for k, v in rows}

    async def redeliver_dead(self, tenant_id: str, webhook_id: str) -> int:
        async with self.store.session() as s:
            res = await s.execute(
                update(OutboxMessage)
                .where(
                    OutboxMessage.tenant_id == tenant_id,
                    OutboxMessage.webhook_id == webhook_id,
                    OutboxMessage.status == "dead",
                )
                .values(status="pending", attempts=0, next_attempt_at=await self.store.now(s))
            )
            return int(res.rowcount)  # type: ignore[attr-defined]

    async def claim_due(self, limit: int, claim_s: float) -> list[Claimed]:
        """Take up to `limit` due rows, pushing their next attempt `claim_s` ahead so no one else takes them."""
        async with self.store.session() as s:
            now = await self.store.now(s)
            q = (
                select(OutboxMessage, Webhook.url, Webhook.secret)
                .join(Webhook, Webhook.id == OutboxMessage.webhook_id)
                .where(OutboxMessage.status == "pending", OutboxMessage.next_attempt_at <= now)
                .order_by(OutboxMessage.next_attempt_at, OutboxMessage.id)
                .limit(limit)
            )
            if not self.store.is_sqlite:
                q = q.with_for_update(skip_locked=True, of=OutboxMessage)
            rows = (await s.execute(q)).all()
            out = []
            for msg, url, secret in rows:
                msg.next_attempt_at = now + claim_s
                out.append(Claimed(msg.id, msg.webhook_id, url, secret, msg.event_type, msg.payload, msg.attempts))
            return out

    async def mark_delivered(self, msg_id: int) -> None:
        async with self.store.session() as s:
            now = await self.store.now(s)
            await s.execute(
                update(OutboxMessage)
                .where(OutboxMessage.id == msg_id)
                .values(status="delivered", delivered_at=now, attempts=OutboxMessage.attempts + 1, last_error=None)
            )

    async def mark_failed(
        self, msg_id: int, error: str, *, max_attempts: int, backoff_s: float, max_backoff_s: float
    ) -> str:
        """Record a failed attempt; returns the new status (`pending` for a retry, `dead` after the last)."""
        async with self.store.session() as s:
            now = await self.store.now(s)
            attempts = int(await s.scalar(select(OutboxMessage.attempts).where(OutboxMessage.id == msg_id)) or 0) + 1
            status = "dead" if attempts >= max_attempts else "pending"
            delay = min(max_backoff_s, backoff_s * (2 ** (attempts - 1)))
            await s.execute(
                update(OutboxMessage)
                .where(OutboxMessage.id == msg_id)
                .values(status=status, attempts=attempts, last_error=error[:2000], next_attempt_at=now + delay)
            )
            return status


@dataclass(frozen=True)
class DeliveryPolicy:
    max_attempts: int = 12
    """Failed attempts after which a message goes to the dead-letter state."""
    backoff_s: float = 1.0
    """Delay before the first retry; doubles each attempt."""
    max_backoff_s: float = 300.0
    """Ceiling on the retry delay."""
    timeout_s: float = 10.0
    """Per-request timeout of a delivery."""
    claim_s: float = 60.0
    """How long a claimed row is hidden from other deliverers (longer than one delivery can take)."""
    poll_s: float = 0.5
    """Idle poll interval."""
    batch: int = 20


class OutboxDeliverer:
    """Delivers due outbox rows. Run one or more per deployment (API processes run one each by default)."""

    def __init__(self, store: Store, policy: DeliveryPolicy | None = None) -> None:
        self.outbox = OutboxStore(store)
        self.policy = policy or DeliveryPolicy()
        self.delivered = 0
        self.failed = 0
        self.dead = 0

    async def deliver_once(self, client: Any) -> int:
        """Deliver one batch of due rows; returns how many were attempted."""
        p = self.policy
        batch = await self.outbox.claim_due(p.batch, p.claim_s)
        await asyncio.gather(*(self._deliver(client, m) for m in batch))
        return len(batch)

    async def _deliver(self, client: Any, m: Claimed) -> None:
        p = self.policy
        body = json.dumps(
            {"delivery_id": m.id, "type": m.event_type, **m.payload}, separators=(",", ":"), sort_keys=True
        ).encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "crewwork-webhooks/1",
            SIGNATURE_HEADER: sign(m.secret, int(time.time()), body),
            DELIVERY_HEADER: str(m.id),
            EVENT_HEADER: m.event_type,
        }
        try:
            resp = await client.post(m.url, content=body, headers=headers, timeout=p.timeout_s)
            if 200 <= resp.status_code < 300:
                await self.outbox.mark_delivered(m.id)
                self.delivered += 1
                return
            error = f"HTTP {resp.status_code}"
        except Exception as exc:  # any transport failure is a failed attempt, retried by policy
            error = f"{type(exc).__name__}: {exc}"
        status = await self.outbox.mark_failed(
            m.id, error, max_attempts=p.max_attempts, backoff_s=p.backoff_s, max_backoff_s=p.max_backoff_s
        )
        self.failed += 1
        if status == "dead":
            self.dead += 1
            log.warning("webhook delivery %s to %s is dead after %s attempts: %s", m.id, m.url, p.max_attempts, error)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        import httpx

        stop = stop or asyncio.Event()
        async with httpx.AsyncClient(follow_redirects=False) as client:
            while not stop.is_set():
                try:
                    n = await self.deliver_once(client)
                except Exception as exc:  # the database may be briefly unavailable; keep going
                    log.warning("outbox deliverer: %s", exc)
                    n = 0
                if n == 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), self.policy.poll_s)
