"""Provider errors, classified the way Temporal needs them.

Retryable (`ProviderUnavailable`, an `AgentInfraError`): 408, 409, 429, every 5xx, connection failures,
timeouts and garbled 200 responses. They carry `retry_after_s` from the provider's ``Retry-After`` (seconds or
an HTTP date) or ``retry-after-ms``, which the activity hands to Temporal as the next retry delay.

Non-retryable (`ProviderRejected`, an `AgentError`): every other 4xx — a bad key (401/403), an unknown model
(404), a request the model cannot take (400, including a context that is too long). Retrying those only spends
money and time; the attempt ends with the cause in the message.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Mapping

from crewwork.models.errors import AgentError, AgentInfraError

RETRYABLE_STATUS = frozenset({408, 409, 429})


class ProviderUnavailable(AgentInfraError):
    """A transient provider failure; retried by the activity's retry policy."""

    def __init__(
        self,
        message: str,
        *,
        endpoint: str,
        cause: str,
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, retry_after_s)
        self.endpoint = endpoint
        self.cause = cause
        self.status = status


class ProviderRejected(AgentError):
    """The provider refused the request in a way retrying cannot fix."""

    def __init__(self, message: str, *, endpoint: str, cause: str, status: int | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.cause = cause
        self.status = status


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUS or 500 <= status <= 599


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait per ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date); None if absent."""
    lower = {k.lower(): v for k, v in headers.items()}
    ms = lower.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    raw = lower.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def provider_message(body: bytes) -> tuple[str, str | None]:
    """The human message and machine code from an error body (OpenAI's shape, or a bare string)."""
    text = body[:4000].decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:500], None
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        code = err.get("code") or err.get("type") or err.get("status")
        return str(err.get("message") or text)[:500], (str(code) if code is not None else None)
    if isinstance(err, str):
        return err[:500], None
    if isinstance(data, list) and data and isinstance(data[0], dict) and "error" in data[0]:
        # Gemini's OpenAI-compatible endpoint sometimes wraps the error in a one-element list.
        return provider_message(json.dumps(data[0]).encode())
    return text.strip()[:500], None


def rejected_cause(status: int, message: str, code: str | None) -> str:
    """A short, stable cause name for a non-retryable status (recorded as evidence)."""
    blob = f"{code or ''} {message}".lower()
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status == 413 or "context_length" in blob or "context length" in blob or "too many tokens" in blob:
        return "context_too_long"
    if status == 400:
        return "bad_request"
    return f"http_{status}"


_CAUSE_HINT = {
    "auth": "the API key was refused; check the key variable on the agent worker",
    "not_found": "unknown model or wrong base URL",
    "context_too_long": "the prompt is longer than the model's context window",
    "bad_request": "the provider rejected the request",
}


def cause_hint(cause: str) -> str:
    return _CAUSE_HINT.get(cause, "the provider rejected the request")
