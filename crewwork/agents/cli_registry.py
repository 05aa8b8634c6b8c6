"""The agent-CLI adapters by name (the command agent's `adapter` field; `crewwork agents check`)."""

from __future__ import annotations

from crewwork.agents.cli_adapter import CliAdapter
from crewwork.agents.cli_claude import ClaudeCodeAdapter
from crewwork.agents.cli_codex import CodexAdapter
from crewwork.agents.cli_mini import MiniSweAgentAdapter

ADAPTERS: dict[str, CliAdapter] = {a.name: a for a in (CodexAdapter(), ClaudeCodeAdapter(), MiniSweAgentAdapter())}
SERVED_PROTOCOLS = ("chat", "responses", "messages")
"""What the gateway speaks (crewwork/gateway/forwarder.py); an adapter of another protocol cannot run yet."""
