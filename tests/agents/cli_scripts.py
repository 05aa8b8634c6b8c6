"""Scripted model turns that make each agent CLI fix calc.py with its own tools, and the operator config that runs it.

Shared by the narrow tests (tests/agents/test_agent_clis.py: one CLI, one sandbox backend, the gateway, no workflow)
and the full lifecycle (tests/integration/test_agent_clis_e2e.py). Each script's first turn makes the CLI print its
environment and read its own config; the turn after it sees what that printed, in the CLI's next request, which is how
the tests check that no provider key reached the sandbox.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.fakes.model_server import Seen, Turn

ROOT = Path(__file__).resolve().parents[2]
CLIS_DIR = Path(os.environ.get("CREWWORK_TEST_AGENT_CLIS") or ROOT / ".cache" / "agents").resolve()
"""Where scripts/test-env.sh installs the three CLIs (npm prefixes and a virtualenv), at install time."""
PROVIDER_KEY = "sk-provider-0123456789abcdefghijklmnop"
KEY_ENV = "FAKE_PROVIDER_KEY"

INSTALL = {"codex": "codex", "claude-code": "claude-code", "mini-swe-agent": "mini-swe-agent"}
PROTOCOL = {"codex": "responses", "claude-code": "messages", "mini-swe-agent": "chat"}
SNOOP = (
    "env; echo ===; cat {config} 2>&1; echo ===; cat /proc/1/environ 2>&1 | tr '\\0' '\\n'; echo ===; "
    "python3 -c \"import socket\nfor name, port in (('provider', {port}), ('gateway', 8739)):\n"
    "    s = socket.socket(); s.settimeout(3); print('reach', name, s.connect_ex(('127.0.0.1', port)))\""
)
"""What the first turn makes the CLI run: its environment, its config, the first process's environment, and whether
the provider's port (on the host's loopback) and the gateway's relay (on the sandbox's) can be connected to."""
CONFIG = {"codex": "$HOME/.codex/config.toml", "claude-code": "$HOME/.claude.json", "mini-swe-agent": "$HOME/*.yaml"}
FIX = "sed -i 's/return a - b/return a + b/' calc.py"


def install_dir(adapter: str) -> Path:
    return CLIS_DIR / INSTALL[adapter]


def command_spec(adapter: str, **extra: Any) -> dict[str, Any]:
    return {"adapter": adapter, "install_dir": str(install_dir(adapter)), "timeout_s": 480, **extra}


def operator_endpoints(base_url: str, **extra: Any) -> dict[str, Any]:
    """CREWWORK_MODEL_ENDPOINTS: one endpoint speaking all three protocols, its key in KEY_ENV, priced."""
    endpoint = {
        "base_url": base_url,
        "model": "fake-model",
        "protocols": ["chat", "responses", "messages"],
        "api_key_env": KEY_ENV,
        "price_per_1k_input_usd": 0.5,
        "price_per_1k_output_usd": 1.5,
        **extra,
    }
    return {"endpoints": {"fake": endpoint}}


def script(adapter: str, *, fix: bool = True, provider_port: int = 9) -> list[Any]:
    """The agent turns: snoop (environment, config, reachability), then the fix with the CLI's own tools, then done."""
    snoop = SNOOP.format(config=CONFIG[adapter], port=provider_port)
    if adapter == "codex":
        turns: list[Any] = [Turn.call("exec_command", {"cmd": snoop})]
        if fix:
            turns.append(Turn.call("exec_command", {"cmd": FIX}))
        return [*turns, Turn.say("Fixed add().")]
    if adapter == "claude-code":
        turns = [Turn.call("Bash", {"command": snoop, "description": "look around"})]
        if fix:
            turns.append(Turn.call("Read", {"file_path": "/workspace/calc.py"}))
            turns.append(
                Turn.call(
                    "Edit",
                    {"file_path": "/workspace/calc.py", "old_string": "return a - b", "new_string": "return a + b"},
                )
            )
        return [*turns, Turn.say("Fixed add().")]
    turns = [Turn.call("bash", {"command": snoop})]
    if fix:
        turns.append(Turn.call("bash", {"command": FIX}))
    return [*turns, Turn.call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})]


def snooped(server_requests: list[Seen]) -> str:
    """What the CLI sent after the snoop turn: the request that carries the snoop's output."""
    for r in server_requests:
        if r.has_tools and "===" in r.text() and ("PATH=" in r.text() or "HOME=" in r.text()):
            return r.text()
    raise AssertionError("no request carried the snoop's output: " + json.dumps([r.path for r in server_requests]))
