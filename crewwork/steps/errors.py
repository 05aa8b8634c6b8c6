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

REPOSITORY_ERROR = "RepositoryError"
"""The repository refused: credentials rejected, the commit is not on the remote, a misconfigured credential."""
REPOSITORY_UNAVAILABLE = "RepositoryUnavailable"
"""The remote could not be reached (network, timeout, server error): retried, then the item fails naming it."""
PULL_REQUEST_FAILED = "PullRequestFailed"
"""The branch was pushed but the forge would not open the pull request (retryable when the forge says so)."""

EVIDENCE_UNAVAILABLE = "EvidenceUnavailable"
"""The operator's evidence signing key is missing while required, or unusable (raised non-retryable: the item ends
`dead`, naming the setting, before anything is pushed)."""

NOTHING_TO_SIGN = "NothingToSign"
"""The attempt asked for has no evidence to sign (no diff, never validated, not a repository change)."""

NON_RETRYABLE = (BAD_INPUT, AGENT_ERROR, AGENT_CONFIG_ERROR, LANDING_CONFLICT, STALE_ATTEMPT, REPOSITORY_ERROR)
ITEM_FAILURES = (REPOSITORY_ERROR, REPOSITORY_UNAVAILABLE, LANDING_CONFLICT, PULL_REQUEST_FAILED)
"""Failures that are the work item's and its repository's, not crewwork's machinery: the item ends `failed` with
the message (which names the remote), never `dead`."""


def bad_input(message: str) -> ApplicationError:
    return ApplicationError(message, type=BAD_INPUT, non_retryable=True)
