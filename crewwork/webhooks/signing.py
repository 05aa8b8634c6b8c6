"""The signatures on a webhook delivery.

They follow Standard Webhooks (https://www.standardwebhooks.com/), so any of its libraries verifies them:

    webhook-id: <message id>         webhook-timestamp: <unix seconds>
    webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<raw body>")> [v1,<...> during rotation]

with `key` the base64-decoded part of the secret after `whsec_`. After a rotation the previous secret also signs
(a second, space-separated signature) until its overlap window ends; then it is dropped. The scheme itself is
implemented once, in crewwork/client/webhooks.py, which receivers use too.

Deprecated, kept for one release: `X-Crewwork-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw
body>")>` (HMAC keyed with the whole secret string, current secret only) and `X-Crewwork-Delivery`.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from crewwork.client import webhooks as standard
from crewwork.client.webhooks import ID_HEADER, TIMESTAMP_HEADER

STANDARD_SIGNATURE_HEADER = standard.SIGNATURE_HEADER
EVENT_HEADER = "X-Crewwork-Event"
# Deprecated (one release): the former private signature format and delivery id.
SIGNATURE_HEADER = "X-Crewwork-Signature"
DELIVERY_HEADER = "X-Crewwork-Delivery"


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


def delivery_headers(secrets_: list[str], msg_id: str, event_type: str, timestamp: int, body: bytes) -> dict[str, str]:
    """Every header of a delivery signed with `secrets_` (the current secret first) at `timestamp`."""
    return {
        "Content-Type": "application/json",
        "User-Agent": "crewwork-webhooks/1",
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: str(timestamp),
        STANDARD_SIGNATURE_HEADER: sign_standard(secrets_, msg_id, timestamp, body),
        EVENT_HEADER: event_type,
        SIGNATURE_HEADER: sign(secrets_[0], timestamp, body),
        DELIVERY_HEADER: msg_id,
    }
