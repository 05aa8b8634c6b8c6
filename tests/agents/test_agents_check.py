"""`crewwork agents check` says which configured agent CLIs work and why not; the delegated runner is chosen by the
operator's settings, under the kill switch and the command's eligibility, with the model agent as the fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crewwork.agents.base import OperatorAgentSettings
from crewwork.agents.cli_check import check_agents
from crewwork.agents.command import choose_agent
from crewwork.config import Settings
from crewwork.config.sandbox import SandboxSettings
from tests.agents.cli_scripts import command_spec, install_dir

ENDPOINTS = {
    "endpoints": {
        "oa": {
            "base_url": "http://127.0.0.1:9/v1",
            "model": "m1",
            "protocols": ["chat", "responses"],
            "api_key_env": "OA",
        },
        "an": {"base_url": "http://127.0.0.1:9/v1", "model": "m2", "protocols": ["messages"], "api_key_env": "AN"},
    }
}


def settings(tmp_path: Path, commands: dict[str, object], **kw: object) -> Settings:
    return Settings(
        data_dir=tmp_path,
        model_endpoints=json.dumps(kw.pop("endpoints", ENDPOINTS)),
        command_agents=json.dumps({"commands": commands}),
        sandbox=SandboxSettings(backend="bwrap"),
        **kw,  # type: ignore[arg-type]
    )


async def test_check_names_the_first_thing_that_keeps_each_cli_from_working(tmp_path: Path) -> None:
    commands = {
        "missing": {"adapter": "codex", "install_dir": str(tmp_path / "nothing-here")},
        "no-route": command_spec("claude-code", workload="chat-only"),
        "no-key": command_spec("mini-swe-agent"),
        "plain": {"argv": ["/bin/true"]},
    }
    only_chat = {"endpoints": {"c": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "OA"}},
                 "routes": {"chat-only": ["c"], "default": ["c"]}}  # fmt: skip
    s = settings(tmp_path, commands, endpoints=only_chat, delegated_runner="ghost")
    checks = {c.command: c for c in await check_agents(s, run=False, env={})}
    assert not checks["missing"].ok and "npm install --prefix" in checks["missing"].why
    if install_dir("claude-code").exists():
        assert not checks["no-route"].ok and "speaks 'messages'" in checks["no-route"].why
    if install_dir("mini-swe-agent").exists():
        assert not checks["no-key"].ok and "OA not set" in checks["no-key"].why
    assert checks["plain"].ok
    assert not checks["ghost"].ok and checks["ghost"].delegated and "CREWWORK_DELEGATED_RUNNER" in checks["ghost"].why


async def test_check_starts_each_installed_cli_in_the_sandbox(tmp_path: Path) -> None:
    from crewwork.agents.cli_registry import ADAPTERS

    names = [a for a in ("codex", "claude-code", "mini-swe-agent") if ADAPTERS[a].locate(install_dir(a)) is not None]
    if not names:
        pytest.skip("no agent CLI is installed (scripts/test-env.sh installs them)")
    s = settings(tmp_path, {n: command_spec(n) for n in names}, delegated_runner=names[0])
    checks = await check_agents(s, run=True, env={"OA": "x", "AN": "y"})
    assert [c.ok for c in checks] == [True] * len(names), [(c.command, c.why) for c in checks]
    assert [c.command for c in checks if c.delegated] == [names[0]]


def test_the_delegated_runner_is_the_default_for_code_changes_with_the_model_agent_as_fallback() -> None:
    commands = json.dumps({"commands": {"cli": {"adapter": "codex", "install_dir": "/opt/x",
                                                 "required_labels": {"agent-cli": "ok"}}}})  # fmt: skip
    on = OperatorAgentSettings(command_agents=commands)
    labels = {"agent-cli": "ok"}
    name, why = choose_agent("model", {}, labels=labels, operator=on, delegated="cli")
    assert name == "command" and "delegated runner 'cli'" in why
    assert choose_agent("model", {}, labels=labels, operator=on, delegated="cli", code_change=False)[0] == "model"
    assert choose_agent("scripted", {}, labels=labels, operator=on, delegated="cli")[0] == "scripted"
    name, why = choose_agent("model", {}, labels={}, operator=on, delegated="cli")
    assert name == "model" and "label agent-cli=ok is required" in why
    off = OperatorAgentSettings(command_agents=commands, command_agent_enabled=False)
    name, why = choose_agent("model", {}, labels=labels, operator=off, delegated="cli")
    assert name == "model" and "CREWWORK_COMMAND_AGENT_ENABLED=false" in why
    assert choose_agent("model", {}, labels=labels, operator=on, delegated="")[0] == "model"
