"""The model agent's part of a work item's ``agent.config``: read by the agent (crewwork/agents/model.py), by its
prompt (crewwork/agents/model_prompt.py), and checked at submission (`validate_model_config`, which the API runs
without loading the agent)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from crewwork.agents.base import OperatorAgentSettings
from crewwork.models import WorkItemKind
from crewwork.models.errors import AgentConfigError
from crewwork.transport import (
    EndpointConfig,
    TransportConfig,
    TransportSettingsError,
    merge_configs,
    operator_config,
)


class ModelAgentConfig(BaseModel):
    """The model agent's part of a work item's ``agent.config``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoints: dict[str, EndpointConfig] = Field(default_factory=dict)
    """Extra endpoints for this work item, merged over the operator's ``CREWWORK_MODEL_ENDPOINTS``."""
    routes: dict[str, list[str]] = Field(default_factory=dict)
    """Workload -> ordered endpoint names, overriding the operator's routes for this work item."""
    workload: str = "edit"
    """Route used for code changes (a `task` always uses "chat")."""
    max_edit_rounds: int = Field(default=3, ge=1, le=10)
    """Model calls per attempt at most: the first ask plus re-asks after a malformed or unappliable edit."""
    max_tokens: int | None = Field(default=None, gt=0)
    """Token budget of this attempt (prompt + completion, all calls); exceeding it ends the attempt."""
    max_cost_usd: float | None = Field(default=None, gt=0)
    """Cost budget of this attempt in USD (needs prices on the endpoints)."""
    max_output_tokens: int | None = Field(default=None, gt=0)
    """Cap on one completion, sent as ``max_tokens``; overrides the endpoint's own cap."""
    context_files: list[str] = Field(default_factory=list, max_length=50)
    """Repo-relative files always shown to the model, before any it is pointed at."""
    max_context_files: int = Field(default=8, ge=0, le=100)
    """Files whose contents go into the prompt, at most."""
    max_file_chars: int = Field(default=24_000, ge=100)
    """Characters of one file in the prompt; a longer file is shown truncated (and marked so)."""
    max_context_chars: int = Field(default=120_000, ge=1000)
    """Characters of all file contents in the prompt together."""
    max_listing_entries: int = Field(default=300, ge=0, le=10_000)
    """Repository paths listed in the prompt, at most."""
    repo_map_tokens: int | None = Field(default=None, ge=0, le=8192)
    """Size budget (tokens) of the repository map in the prompt; default the operator's
    CREWWORK_CODEINTEL_AGENT_MAP_TOKENS, 0 leaves it out."""
    instructions: str | None = Field(default=None, max_length=20_000)
    """Extra guidance appended to the system prompt (house style, constraints)."""
    heartbeat_interval_s: float = Field(default=5.0, gt=0, le=60)
    """Seconds between liveness heartbeats while waiting on a model call."""

    @classmethod
    def from_agent_config(cls, config: Mapping[str, Any]) -> ModelAgentConfig:
        """Parse a work item's agent config. A nested ``"model"`` object (as the command agent's config
        carries for its fallback) takes precedence."""
        data = config.get("model") if isinstance(config.get("model"), Mapping) else config
        return cls.model_validate(dict(data or {}))

    def transport(self) -> TransportConfig:
        return TransportConfig(endpoints=dict(self.endpoints), routes=dict(self.routes))


def validate_model_config(kind: WorkItemKind, config: dict[str, Any]) -> None:
    """Raise AgentConfigError naming what is wrong with a model agent's config (also the command agent's fallback,
    its `model` object)."""
    try:
        cfg = ModelAgentConfig.from_agent_config(config)
    except ValidationError as e:
        raise AgentConfigError(f"model agent config: {brief(e)}") from None
    # Endpoints a work item declares itself are an operator decision (off unless CREWWORK_MODEL_ENDPOINTS says
    # allow_work_item_endpoints): refused here, at submission, not later at the worker. The API process reads
    # the same CREWWORK_MODEL_ENDPOINTS as the agent pool (docs/agents.md).
    try:
        merge_configs(operator_config(OperatorAgentSettings.of_process().model_endpoints), cfg.transport())
    except TransportSettingsError as e:
        raise AgentConfigError(f"model agent config: {e}") from None
    unknown = [n for names in cfg.routes.values() for n in names if n not in cfg.endpoints]
    # Routes may name operator endpoints, which only the agent worker knows; check names' shape only.
    for n in unknown:
        if not n or len(n) > 64:
            raise AgentConfigError(f"model agent config: bad endpoint name {n!r} in routes")


def brief(e: ValidationError) -> str:
    """The first few errors of a config's validation, one line."""
    return "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()[:5])
