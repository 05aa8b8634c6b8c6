"""The agent classes by name, for the process that runs them (the agent pool): the built-ins, and the plugins of
the `crewwork.agents` entry-point group, loaded by crewwork/agents/catalogue.py (which also says what names exist
and checks submissions without loading any agent)."""

from __future__ import annotations

from crewwork.agents.base import Agent
from crewwork.agents.catalogue import plugin_class
from crewwork.agents.command import CommandAgent
from crewwork.agents.model import ModelAgent
from crewwork.agents.scripted import ScriptedAgent

BUILTIN: dict[str, type[Agent]] = {
    ScriptedAgent.name: ScriptedAgent,
    ModelAgent.name: ModelAgent,
    CommandAgent.name: CommandAgent,
}


def get_agent_class(name: str, *, plugins: str | None = None) -> type[Agent]:
    """The agent class for `name`: a built-in, or an enabled plugin (loaded on first use). AgentConfigError names
    what is known when there is no such agent, or why a plugin cannot be used. `plugins`: the operator's
    CREWWORK_AGENT_PLUGINS (Settings.agent_plugins); None reads this process's settings."""
    if name in BUILTIN:
        return BUILTIN[name]
    return plugin_class(name, plugins=plugins)
