"""Agent plugins by name."""

from __future__ import annotations

from crewwork.agents.base import Agent, AgentConfigError
from crewwork.agents.command import CommandAgent
from crewwork.agents.model import ModelAgent
from crewwork.agents.scripted import ScriptedAgent

AGENTS: dict[str, type[Agent]] = {
    ScriptedAgent.name: ScriptedAgent,
    ModelAgent.name: ModelAgent,
    CommandAgent.name: CommandAgent,
}


def get_agent_class(name: str) -> type[Agent]:
    try:
        return AGENTS[name]
    except KeyError:
        known = ", ".join(sorted(AGENTS))
        raise AgentConfigError(f"unknown agent {name!r}; known agents: {known}") from None
