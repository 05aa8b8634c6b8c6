"""Agent failure classes: a leaf module, so the model transport (crewwork/transport) can raise them without
importing the agents package. `crewwork.agents.base` re-exports them for agent authors."""

from __future__ import annotations


class AgentConfigError(ValueError):
    """The agent's configuration in a submission is invalid (rejected before any workflow starts)."""


class AgentError(RuntimeError):
    """The agent failed in a way that retrying the same attempt will not fix (non-retryable)."""


class AgentInfraError(RuntimeError):
    """A transient failure (provider outage, connection error): retried by the activity retry policy."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
