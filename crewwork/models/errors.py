"""Agent failure classes, the refusal to capture an agent's change, and the refusal of a submission: a leaf module, so
the model transport (crewwork/transport) and the agents can raise them without importing the agents package or the
workspace machinery (the API process loads the agents, never the workspace), and the repositories can refuse a
submission's repository (crewwork/repos/submission.py) as the service refuses the rest of it (crewwork/api/service.py).
`crewwork.agents.base` re-exports the agent classes for agent authors; `crewwork.workspace.tree` the capture
refusals."""

from __future__ import annotations


class SubmissionRejected(ValueError):
    """The submission is invalid; nothing was stored and no workflow started. `field` names the part of it, `code`
    the API problem's code (a 422)."""

    def __init__(self, message: str, field: str | None = None, code: str = "invalid_work_item") -> None:
        super().__init__(message)
        self.field = field
        self.code = code


class AgentConfigError(ValueError):
    """The agent's configuration in a submission is invalid (rejected before any workflow starts)."""


class AgentError(RuntimeError):
    """The agent failed in a way that retrying the same attempt will not fix (non-retryable)."""


class AgentInfraError(RuntimeError):
    """A transient failure (provider outage, connection error): retried by the activity retry policy."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CaptureRefused(RuntimeError):
    """The change cannot be captured; the message is the attempt's error (not an infrastructure fault)."""


class DiffTooLarge(CaptureRefused):
    pass
