"""The command agent's part of a work item's ``agent.config`` and its check at submission, which the API runs
without loading the agent (crewwork/agents/command.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from crewwork.agents.model_config import validate_model_config
from crewwork.models import WorkItemKind
from crewwork.models.errors import AgentConfigError


class CommandAgentConfig(BaseModel):
    """The command agent's part of a work item's ``agent.config``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str = Field(min_length=1, max_length=64)
    """Name of an operator-defined command (`CommandAgentsSettings.commands`)."""
    args: list[str] = Field(default_factory=list, max_length=32)
    """Extra arguments appended to the operator's argv (they run inside the sandbox like everything else)."""
    model: dict[str, Any] | None = None
    """Config of the built-in model agent, used when the command agent is not chosen."""


def validate_command_config(kind: WorkItemKind, config: dict[str, Any]) -> None:
    """Raise AgentConfigError naming what is wrong with a command agent's config (its model fallback included)."""
    try:
        cfg = CommandAgentConfig.model_validate(config)
    except ValidationError as e:
        first = e.errors()[0]
        raise AgentConfigError(
            f"command agent config: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        ) from None
    if kind == WorkItemKind.task:
        raise AgentConfigError("the command agent runs code changes; a `task` needs another agent")
    if cfg.model is not None:
        validate_model_config(kind, cfg.model)
