"""The error types activities raise, and which of them no retry can fix.

The workflow's retry policies name exactly `NON_RETRYABLE` (one list for both sides)."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

BAD_INPUT = "BadInput"
"""The submission or an artifact it names is unusable: retrying the same input cannot help."""
AGENT_ERROR = "AgentError"
AGENT_CONFIG_ERROR = "AgentConfigError"
LANDING_CONFLICT = "LandingConflict"
STALE_ATTEMPT = "StaleAttempt"
"""A later-scheduled attempt has written (or the item ended): this attempt is obsolete, and Temporal ignores it."""

NON_RETRYABLE = (BAD_INPUT, AGENT_ERROR, AGENT_CONFIG_ERROR, LANDING_CONFLICT, STALE_ATTEMPT)


def bad_input(message: str) -> ApplicationError:
    return ApplicationError(message, type=BAD_INPUT, non_retryable=True)
