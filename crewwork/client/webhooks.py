"""Standard Webhooks signing and verification (https://www.standardwebhooks.com/), standard library only.

The one implementation of the signature scheme: the outbox signs with `sign`, receivers (and `crewwork webhooks
verify`) check with `verify`. Any Standard Webhooks library verifies the same deliveries.

    webhook-id: <message id>     webhook-timestamp: <unix seconds>
    webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<raw body>")> [v1,<...> ...]

`key` is the base64 part of the secret after `whsec_`, decoded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Any

from crewwork.boundary import jsonvalues

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_S = 300.0
"""A delivery whose timestamp is further than this from the receiver's clock is refused (replay protection)."""


class WebhookVerificationError(ValueError):
    """The delivery's headers are missing or malformed, its timestamp is out of tolerance, or no signature matches."""


def secret_key(secret: str) -> bytes:
    """The HMAC key of a secret: its base64 part decoded.

    Secrets issued before Standard Webhooks signing (crewwork 0.1) were `whsec_` + *URL-safe* base64 of 32 random
    bytes; those decode too (`-`/`_` read as `+`/`/`) to the same 32 bytes. (A Standard Webhooks library reads a
    secret as standard base64: give it `whsec_` + base64.b64encode(secret_key(old)), or rotate the secret.)"""
    body = secret[len(SECRET_PREFIX) :] if secret.startswith(SECRET_PREFIX) else secret
    body = body.replace("-", "+").replace("_", "/")
    try:
        key = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    return key or secret.encode()


def sign(secrets: list[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: one `v1,<base64>` per secret, space-separated."""
    to_sign = f"{msg_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.new(secret_key(s), to_sign, hashlib.sha256).digest()).decode() for s in secrets
    )


def verify(
    secret: str,
    headers: Mapping[str, str],
    body: bytes | str,
    *,
    tolerance_s: float | None = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> Any:
    """Check a delivery against one secret and return its parsed JSON body; raise WebhookVerificationError if it
    does not verify. Header names are case-insensitive; any one of several signatures may match (rotation);
    comparison is constant-time."""
    raw = body.encode() if isinstance(body, str) else bytes(body)
    check_signature(secret, headers, raw, tolerance_s=tolerance_s, now=now)
    try:
        return jsonvalues.loads(raw)  # the rules every door of crewwork reads JSON by (JsonRefused is a ValueError)
    except ValueError as exc:
        raise WebhookVerificationError(f"the body is not JSON: {exc}") from None


def check_signature(
    secret: str,
    headers: Mapping[str, str],
    raw: bytes,
    *,
    tolerance_s: float | None = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> None:
    """`verify` without parsing the body."""
    h = {k.lower(): v for k, v in headers.items()}
    msg_id, ts_text, given = h.get(ID_HEADER), h.get(TIMESTAMP_HEADER), h.get(SIGNATURE_HEADER)
    if not (msg_id and ts_text and given):
        raise WebhookVerificationError(f"missing {ID_HEADER}, {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
    try:
        ts = int(ts_text)
    except ValueError:
        raise WebhookVerificationError(f"{TIMESTAMP_HEADER} is not unix seconds: {ts_text[:40]!r}") from None
    if tolerance_s is not None:
        skew = (now if now is not None else time.time()) - ts
        if abs(skew) > tolerance_s:
            raise WebhookVerificationError(
                f"{TIMESTAMP_HEADER} is {abs(skew):.0f} s {'old' if skew > 0 else 'ahead'} (tolerance {tolerance_s:g} s)"
            )
    expected = sign([secret], msg_id, ts, raw).split(",", 1)[1]
    matched = False
    for part in given.split(" "):
        version, _, sig = part.partition(",")
        if version == "v1" and hmac.compare_digest(expected, sig):
            matched = True
    if not matched:
        raise WebhookVerificationError("no signature matches this secret")
