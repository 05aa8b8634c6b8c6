"""Webhooks through a durable outbox.

A state change writes one outbox row per matching webhook in the SAME transaction as the change (`enqueue`, called
from `Store.set_state`), so a change is never committed without its notifications, nor a notification without its
change. A deliverer claims due rows, POSTs them signed, and marks them delivered, or schedules a
retry with exponential backoff, or after `max_attempts` failures moves them to the dead-letter state `dead` (from
which an operator can redeliver). Claims are leases on the row (`next_attempt_at` pushed into the future, taken
with `FOR UPDATE SKIP LOCKED` on PostgreSQL), so several deliverers can run, and a deliverer that dies mid-delivery
only delays the row until its claim expires: delivery is at least once, and the `webhook-id` header (the same on
every retry of one message) lets receivers drop duplicates.

Signatures follow Standard Webhooks (https://www.standardwebhooks.com/), so any of its libraries verifies them:

    webhook-id: <message id>         webhook-timestamp: <unix seconds>
    webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<raw body>")> [v1,<...> during rotation]

with `key` the base64-decoded part of the secret after `whsec_`. After a rotation the previous secret also signs
(a second, space-separated signature) until its overlap window ends; then it is dropped.

Deprecated, kept for one release: `X-Crewwork-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw
body>")>` (HMAC keyed with the whole secret string, current secret only) and `X-Crewwork-Delivery`.
"""

from __future__ import annotations

import asyncio
import base64
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

from crewwork import tracing
from crewwork.client import webhooks as standard
from crewwork.client.webhooks import ID_HEADER, TIMESTAMP_HEADER
from crewwork.ids import new_id
from crewwork.observability.metrics import WEBHOOK_DELIVERIES
from crewwork.outbound import OutboundPolicy
from crewwork.store.tables import OutboxMessage, Webhook

if TYPE_CHECKING:
    from crewwork.store.store import Store

log = logging.getLogger("crewwork.outbox")

STANDARD_SIGNATURE_HEADER = standard.SIGNATURE_HEADER
EVENT_HEADER = "X-Crewwork-Event"
# Deprecated (one release): the former private signature format and delivery id.
SIGNATURE_HEADER = "X-Crewwork-Signature"
DELIVERY_HEADER = "X-Crewwork-Delivery"

SECRET_PREFIX = standard.SECRET_PREFIX
SECRET_BYTES = 32
DEFAULT_OVERLAP_S = 24 * 3600.0
"""How long the previous secret keeps signing after a rotation, unless the request says otherwise."""
MAX_OVERLAP_S = 7 * 24 * 3600.0
"""The longest overlap a rotation may ask for."""


def new_secret() -> str:
    """A Standard Webhooks secret: `whsec_` + standard base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def sign_standard(secrets_: list[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: one `v1,<base64>` per secret, space-separated (Standard Webhooks)."""
    return standard.sign(secrets_, msg_id, timestamp, body)


def verify_standard(
    secret: str, headers: dict[str, str], body: bytes, *, tolerance_s: float | None = 300.0, now: float | None = None
) -> bool:
    """Whether a delivery's Standard Webhooks headers verify with `secret` (see crewwork.client.webhooks.verify)."""
    try:
        standard.check_signature(secret, headers, body, tolerance_s=tolerance_s, now=now)
    except standard.WebhookVerificationError:
        return False
    return True


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """Deprecated: the former `X-Crewwork-Signature` value (kept one release)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(
    secret: str, header: str, body: bytes, *, tolerance_s: float | None = 300.0, now: float | None = None
) -> bool:
    """Deprecated: check the former `X-Crewwork-Signature` header. Use `verify_standard` (or any Standard Webhooks
    library). Constant-time comparison."""
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


@dataclass
class Claimed:
    id: int
    webhook_id: str
    url: str
    secrets: list[str]
    """The secrets that sign this delivery: the current one, then the previous one while its overlap lasts."""
    event_type: str
    payload: dict[str, Any]
    attempts: int
    trace_context: str | None = None


@dataclass
class Rotated:
    webhook: Webhook
    secret: str
    previous_valid_until: float | None


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
                secret=new_secret(),
                event_types=",".join(sorted(set(event_types))),
                active=True,
                created_at=await self.store.now(s),
            )
            s.add(hook)
        return hook

    async def rotate_secret(self, tenant_id: str, webhook_id: str, overlap_s: float) -> Rotated | None:
        """Give the webhook a new secret; the current one keeps signing (as a second signature) for `overlap_s`
        seconds, then is dropped. A previous secret from an earlier rotation is dropped at once. None if there is no
        such active webhook of the tenant."""
        async with self.store.session() as s:
            hook = await s.scalar(
                select(Webhook)
                .where(Webhook.id == webhook_id, Webhook.tenant_id == tenant_id, Webhook.active.is_(True))
                .with_for_update()
            )
            if hook is None:
                return None
            now = await self.store.now(s)
            secret = new_secret()
            if overlap_s > 0:
                hook.previous_secret, hook.previous_secret_expires_at = hook.secret, now + overlap_s
            else:
                hook.previous_secret = hook.previous_secret_expires_at = None
            hook.secret = secret
            return Rotated(hook, secret, hook.previous_secret_expires_at)

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
                select(
                    OutboxMessage,
                    Webhook.url,
                    Webhook.secret,
                    Webhook.previous_secret,
                    Webhook.previous_secret_expires_at,
                )
                .join(Webhook, Webhook.id == OutboxMessage.webhook_id)
                .where(OutboxMessage.status == "pending", OutboxMessage.next_attempt_at <= now)
                .order_by(OutboxMessage.next_attempt_at, OutboxMessage.id)
                .limit(limit)
            )
            if not self.store.is_sqlite:
                q = q.with_for_update(skip_locked=True, of=OutboxMessage)
            rows = (await s.execute(q)).all()
            out = []
            for msg, url, secret, previous, previous_until in rows:
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
                        msg.payload,
                        msg.attempts,
                        msg.trace_context,
                    )
                )
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

    def __init__(
        self, store: Store, policy: DeliveryPolicy | None = None, outbound: OutboundPolicy | None = None
    ) -> None:
        self.outbox = OutboxStore(store)
        self.policy = policy or DeliveryPolicy()
        self.outbound = outbound or OutboundPolicy()
        """Where deliveries may go (crewwork.outbound): checked again before every delivery, which connects to the
        checked address, so a name that resolved to a public address at registration cannot be rebound to an
        internal one."""
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
        now = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "crewwork-webhooks/1",
            ID_HEADER: str(m.id),
            TIMESTAMP_HEADER: str(now),
            STANDARD_SIGNATURE_HEADER: sign_standard(m.secrets, str(m.id), now, body),
            EVENT_HEADER: m.event_type,
            SIGNATURE_HEADER: sign(m.secrets[0], now, body),
            DELIVERY_HEADER: str(m.id),
        }
        # The delivery joins the trace of the change that enqueued it (the HTTP call below is its child span).
        with tracing.span(
            "webhook.deliver",
            traceparent=m.trace_context,
            attributes={"webhook.id": m.webhook_id, "webhook.message_id": m.id, "webhook.event_type": m.event_type},
        ):
            try:
                target = await self.outbound.check(m.url)
                resp = await client.post(
                    target.pinned_url, content=body, timeout=p.timeout_s, **target.request_kwargs(headers)
                )
                if 200 <= resp.status_code < 300:
                    await self.outbox.mark_delivered(m.id)
                    self.delivered += 1
                    WEBHOOK_DELIVERIES.labels(result="delivered").inc()
                    return
                error = f"HTTP {resp.status_code}"
            except Exception as exc:  # any transport failure is a failed attempt, retried by policy
                error = f"{type(exc).__name__}: {exc}"
        status = await self.outbox.mark_failed(
            m.id, error, max_attempts=p.max_attempts, backoff_s=p.backoff_s, max_backoff_s=p.max_backoff_s
        )
        self.failed += 1
        WEBHOOK_DELIVERIES.labels(result="dead" if status == "dead" else "failed").inc()
        if status == "dead":
            self.dead += 1
            log.warning("webhook delivery %s to %s is dead after %s attempts: %s", m.id, m.url, p.max_attempts, error)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        import httpx

        stop = stop or asyncio.Event()
        async with httpx.AsyncClient(follow_redirects=False, transport=tracing.async_transport()) as client:
            while not stop.is_set():
                try:
                    n = await self.deliver_once(client)
                except Exception as exc:  # the database may be briefly unavailable; keep going
                    log.warning("outbox deliverer: %s", exc)
                    n = 0
                if n == 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), self.policy.poll_s)
