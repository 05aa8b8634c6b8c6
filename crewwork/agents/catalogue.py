"""Agents by name, as a submission is checked: the built-ins and the plugins of the `crewwork.agents` entry-point
group, each with its config check and its mock label, without loading any built-in agent.

A plugin is any installed distribution that declares, in its pyproject.toml,

    [project.entry-points."crewwork.agents"]
    wordcount = "my_package.agent:WordCountAgent"

where the object is a subclass of `crewwork.agents.base.Agent` whose `name` is the entry point's name (see
docs/agents.md and examples/crewwork-example-agent/). Plugins are operator-controlled: they must be installed on the
API (which checks submissions with the plugin's own `validate_config`) and on the agent pool (which runs them), and
`CREWWORK_AGENT_PLUGINS` says which of the installed ones may be used (`*`: all, the default; empty: none; else
comma-separated names). A plugin is imported only when its name is first asked for, so a broken plugin breaks only
itself, with a message naming it. Built-in names cannot be taken by a plugin.

The built-ins' checks live with their config models (crewwork/agents/*_config.py), so the API process loads none
of the agents; crewwork/agents/classes.py maps the same names to the agent classes the agent pool runs.

Per-tenant rules ("tenant X may use agents A and B") belong to the policy module, which asks `available_agents()`
what exists.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from crewwork.agents.base import Agent, AgentConfigError, OperatorAgentSettings
from crewwork.agents.command_config import validate_command_config
from crewwork.agents.model_config import validate_model_config
from crewwork.agents.scripted_config import validate_scripted_config
from crewwork.models import WorkItemKind

log = logging.getLogger("crewwork.agents")

ENTRY_POINT_GROUP = "crewwork.agents"


@dataclass(frozen=True)
class AgentCheck:
    """What a submission needs of an agent: whether its results are scripted (`Agent.mock`), and its config check
    (`Agent.validate_config`: raises AgentConfigError)."""

    name: str
    mock: bool
    validate_config: Callable[[WorkItemKind, dict[str, Any]], None]


BUILTIN: dict[str, AgentCheck] = {
    "scripted": AgentCheck("scripted", True, validate_scripted_config),
    "model": AgentCheck("model", False, validate_model_config),
    "command": AgentCheck("command", False, validate_command_config),
}
"""The built-in agents' checks (tests/agents/test_agent_catalogue.py holds them equal to the agent classes)."""


@dataclass(frozen=True)
class AgentInfo:
    name: str
    source: str
    """`builtin`, or `plugin <distribution> <version> (<module:attr>)`."""
    allowed: bool
    """False for an installed plugin the operator has not enabled (CREWWORK_AGENT_PLUGINS)."""
    mock: bool | None = None
    """None until the plugin is loaded."""


def _plugin_points() -> dict[str, EntryPoint]:
    points: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILTIN:
            log.warning("agent plugin %s (%s) ignored: %r is a built-in agent", ep.value, _dist(ep), ep.name)
            continue
        if ep.name in points:
            log.warning("agent plugin %r is declared twice (%s, %s); the first wins", ep.name, points[ep.name], ep)
            continue
        points[ep.name] = ep
    return points


def _dist(ep: EntryPoint) -> str:
    d = ep.dist
    return f"{d.name} {d.version}" if d is not None else "unknown distribution"


def _allowed_plugins(setting: str | None) -> set[str] | None:
    """None: every installed plugin; else the names the operator enabled (`setting`: CREWWORK_AGENT_PLUGINS; None
    for this process's)."""
    if setting is None:
        setting = OperatorAgentSettings.of_process().agent_plugins
    names = {n.strip() for n in setting.split(",") if n.strip()}
    return None if "*" in names else names


@functools.cache
def _load(name: str) -> type[Agent]:
    ep = _plugin_points().get(name)
    if ep is None:
        raise KeyError(name)
    try:
        obj = ep.load()
    except Exception as exc:
        raise AgentConfigError(
            f"agent plugin {name!r} ({ep.value}, from {_dist(ep)}) failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    if not (isinstance(obj, type) and issubclass(obj, Agent)):
        raise AgentConfigError(f"agent plugin {name!r} ({ep.value}) is not a subclass of crewwork.agents.base.Agent")
    if getattr(obj, "name", None) != name:
        raise AgentConfigError(
            f"agent plugin {name!r} ({ep.value}) has name {getattr(obj, 'name', None)!r}; it must equal the entry "
            "point's name"
        )
    log.info("loaded agent plugin %r from %s (%s)", name, _dist(ep), ep.value)
    return obj


def plugin_class(name: str, *, plugins: str | None = None) -> type[Agent]:
    """The class of the enabled plugin `name` (loaded on first use). AgentConfigError names what is known when
    there is no such agent, or why the plugin cannot be used. `plugins`: the operator's CREWWORK_AGENT_PLUGINS
    (Settings.agent_plugins); None reads this process's settings."""
    points = _plugin_points()
    allowed = _allowed_plugins(plugins)
    if name in points and allowed is not None and name not in allowed:
        raise AgentConfigError(
            f"agent {name!r} is installed as a plugin but the operator has not enabled it (CREWWORK_AGENT_PLUGINS)"
        )
    if name not in points:
        usable = sorted([*BUILTIN, *(n for n in points if allowed is None or n in allowed)])
        raise AgentConfigError(f"unknown agent {name!r}; known agents: {', '.join(usable)}")
    return _load(name)


def agent_check(name: str, *, plugins: str | None = None) -> AgentCheck:
    """The check of the agent `name`: a built-in's, or an enabled plugin's (the plugin is loaded for it)."""
    if name in BUILTIN:
        return BUILTIN[name]
    cls = plugin_class(name, plugins=plugins)
    return AgentCheck(name, cls.mock, cls.validate_config)


def available_agents(*, plugins: str | None = None, load: bool = False) -> dict[str, AgentInfo]:
    """Every agent this process knows: the built-ins and the installed plugins, each marked allowed or not by the
    operator's CREWWORK_AGENT_PLUGINS. With `load`, enabled plugins are imported (and `mock` filled in); a plugin that
    fails to load is reported as not allowed, with the error in `source`."""
    allowed = _allowed_plugins(plugins)
    out = {n: AgentInfo(n, "builtin", True, check.mock) for n, check in BUILTIN.items()}
    for name, ep in sorted(_plugin_points().items()):
        ok = allowed is None or name in allowed
        source = f"plugin {_dist(ep)} ({ep.value})"
        mock = None
        if ok and load:
            try:
                mock = _load(name).mock
            except AgentConfigError as exc:
                ok, source = False, f"{source}: {exc}"
        out[name] = AgentInfo(name, source, ok, mock)
    return out


def allowed_agent_names(plugins: str | None = None) -> list[str]:
    """The names a submission may use as far as the operator's plugin setting goes (per-tenant policy may narrow)."""
    return sorted(n for n, info in available_agents(plugins=plugins).items() if info.allowed)


def reset_cache() -> None:
    """Forget loaded plugins (tests that install or remove one)."""
    _load.cache_clear()
