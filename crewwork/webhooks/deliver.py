"""The outbox deliverer: sends the outbox's due rows (crewwork/store/outbox.py), signed (`signing`), to the webhook
URLs, each checked and pinned by the operator's outbound policy (crewwork/boundary/outbound.py) before every delivery.

A delivery that fails is retried with exponential backoff; after `max_attempts` failures its row goes to the
dead-letter state `dead`. Delivery is at least once: the `webhook-id` header (the same on every retry of one message)
lets receivers drop duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from crewwork.boundary.outbound import OutboundPolicy
from crewwork.observability import tracing
from crewwork.observability.metrics import WEBHOOK_DELIVERIES
from crewwork.store.outbox import Claimed, OutboxStore
from crewwork.webhooks.signing import delivery_headers

log = logging.getLogger("crewwork.outbox")


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
        self, outbox: OutboxStore, policy: DeliveryPolicy | None = None, outbound: OutboundPolicy | None = None
    ) -> None:
        self.outbox = outbox
        self.policy = policy or DeliveryPolicy()
        self.outbound = outbound or OutboundPolicy()
        """Where deliveries may go (crewwork.boundary.outbound): checked again before every delivery, which connects to the
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
        headers = delivery_headers(m.secrets, str(m.id), m.event_type, int(time.time()), body)
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
