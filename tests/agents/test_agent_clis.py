"""The three agent CLIs, unmodified, in each sandbox backend CI runs, reaching their model only through the gateway.

Real: the CLIs (installed by scripts/test-env.sh into .cache/agents), the sandbox (bwrap, docker, gVisor), the relay
and the gateway. The model provider is a local server speaking the providers' protocols (tests/fakes/model_server.py),
scripted so that each CLI's own tools print its environment and config, then fix calc.py. The full lifecycle of each
CLI is in tests/integration/test_agent_clis_e2e.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crewwork.agents.base import AgentContext, AgentError, OperatorAgentSettings
from crewwork.agents.command import CommandAgent
from crewwork.config.gateway import GatewaySettings
from crewwork.config.sandbox import SandboxLimits
from crewwork.gateway.forwarder import AttemptGateway
from crewwork.gateway.ledger import Budget
from crewwork.sandbox.backends import get_sandbox
from crewwork.steps.agent.activity import until_stopped
from crewwork.transport.config import TransportConfig
from tests.agents.cli_scripts import (
    KEY_ENV,
    PROTOCOL,
    PROVIDER_KEY,
    command_spec,
    install_dir,
    operator_endpoints,
    script,
    snooped,
)
from tests.fakes.model_server import FakeModelServer

ADAPTERS = ("codex", "claude-code", "mini-swe-agent")


@pytest.fixture
def server() -> Iterator[FakeModelServer]:
    with FakeModelServer() as s:
        yield s


def backend_or_skip(name: str) -> Any:
    try:
        return get_sandbox(name)
    except Exception as exc:
        pytest.skip(f"sandbox backend {name} unavailable: {exc}")


def installed_or_skip(adapter: str) -> None:
    from crewwork.agents.cli_registry import ADAPTERS as KNOWN

    if KNOWN[adapter].locate(install_dir(adapter)) is None:
        pytest.skip(f"{adapter} is not installed in {install_dir(adapter)} (scripts/test-env.sh installs it)")


async def run_cli(
    adapter: str,
    backend: str,
    tmp_path: Path,
    make_ctx: Callable[..., AgentContext],
    server: FakeModelServer,
    budget: Budget | None = None,
) -> tuple[Any, AttemptGateway]:
    installed_or_skip(adapter)
    sandbox = backend_or_skip(backend)
    transport = TransportConfig.model_validate(operator_endpoints(server.base_url))
    operator = OperatorAgentSettings(command_agents=json.dumps({"commands": {"cli": command_spec(adapter)}}))
    gw_root = tmp_path / "gateways"
    async with AttemptGateway(
        root=gw_root,
        transport=transport,
        route=["fake"],
        settings=GatewaySettings(),
        budget=budget or Budget(),
        tenant_id=f"tenant-{adapter}-{backend}",
        header={"test": True},
        env={KEY_ENV: PROVIDER_KEY},
    ) as gw:
        saved: dict[str, bytes] = {}

        async def save_artifact(name: str, data: bytes, ctype: str = "text/plain") -> str:
            saved[name] = data
            return name

        gw.saved = saved  # type: ignore[attr-defined]
        gw.issued = gw.token  # type: ignore[attr-defined]  # the token, for the test to look for (revoked at exit)
        ctx = make_ctx(
            {"command": "cli"},
            sandbox=sandbox,
            limits=SandboxLimits(timeout_s=480, memory_mb=2048, pids=512),
            extra={"gateway": gw.handle},
            save_artifact=save_artifact,
        )
        try:
            # As the agent step runs it: cancelled when the gateway stops the attempt.
            # The worker's environment holds the key (as an agent pool's does): nothing may carry it inside.
            agent = CommandAgent(operator=operator, env={KEY_ENV: PROVIDER_KEY})
            result: Any = await until_stopped(agent.run(ctx), gw)
        except AgentError as exc:
            result = exc
    return result, gw


# bwrap is the backend of the full lifecycle (tests/integration/test_agent_clis_e2e.py, the same assertions); here the
# two Docker backends.
@pytest.mark.parametrize(
    "backend", [pytest.param("docker", marks=pytest.mark.docker), pytest.param("gvisor", marks=pytest.mark.docker)]
)
@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_cli_fixes_the_file_with_its_own_tools_and_never_sees_the_key(
    adapter: str,
    backend: str,
    tmp_path: Path,
    make_ctx: Callable[..., AgentContext],
    server: FakeModelServer,
    git_repo: Path,
) -> None:
    server.script(*script(adapter, provider_port=server.port))
    result, gw = await run_cli(adapter, backend, tmp_path, make_ctx, server)
    assert not isinstance(result, Exception), (
        f"{adapter} on {backend} failed: {result} (gateway: stopped {gw.stop_kind!r} {gw.stop_reason!r}, "
        f"{gw.ledger.calls} calls forwarded, {gw.refused} refused; provider saw {len(server.model_calls)} model calls)"
    )
    assert "return a + b" in (git_repo / "calc.py").read_text(), f"{adapter} did not make the change"
    # Every call went to the provider in the CLI's own protocol, with the operator's key added by the gateway.
    calls = server.model_calls
    assert calls and {c.protocol for c in calls} == {PROTOCOL[adapter]}
    assert all(PROVIDER_KEY in (c.headers.get("authorization", "") + c.headers.get("x-api-key", "")) for c in calls)
    # The CLI printed its environment, its config and /proc/1/environ; what it sent next holds the attempt's token
    # (it was given that) and never the provider's key.
    seen = snooped(server.requests)
    assert "cwgw-" in seen, "the snoop's output should show the attempt's token"
    # The sandbox reaches the gateway's relay on its own loopback, and nothing else: not the provider's port.
    assert "reach gateway 0" in seen and "reach provider 0" not in seen and "reach provider 1" in seen, seen[-600:]
    assert not any(PROVIDER_KEY in r.text() for r in server.requests), "the provider key reached the sandbox"
    # Usage and cost are the gateway's, and the transcript holds every exchange with secrets masked.
    assert gw.ledger.tokens > 0 and gw.ledger.cost_usd > 0 and gw.ledger.calls == len(calls)
    transcript = gw.transcript_bytes()
    assert gw.token == "", "the token is revoked when the attempt ends"
    assert PROVIDER_KEY.encode() not in transcript and gw.issued.encode() not in transcript  # type: ignore[attr-defined]
    assert transcript.count(b'"dialect"') >= len(calls)
    # The session log is kept as evidence.
    assert result.output["session_logs"], result.output
    logs = b"".join(gw.saved.values())  # type: ignore[attr-defined]
    assert b"calc.py" in logs and PROVIDER_KEY.encode() not in logs and gw.issued.encode() not in logs  # type: ignore[attr-defined]


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_budget_stops_the_cli_mid_run_with_the_protocols_own_error(
    adapter: str, tmp_path: Path, make_ctx: Callable[..., AgentContext], server: FakeModelServer, git_repo: Path
) -> None:
    # Every scripted turn costs 120 tokens: the budget is crossed by the second call (answered: it was paid for), so
    # the third is refused in the CLI's protocol and the run is ended with the budget's reason.
    server.script(*script(adapter))
    result, gw = await run_cli(adapter, "bwrap", tmp_path, make_ctx, server, budget=Budget(max_tokens=200))
    assert gw.refused >= 1 and gw.stop_reason and "token budget exhausted" in gw.stop_reason
    assert gw.ledger.calls == 2, f"overshoot is at most one call: {gw.ledger.calls} calls were forwarded"
    assert len(server.agent_calls) == 2
    assert server.left >= 1, "the turns after the budget was spent were never asked for"
    assert isinstance(result, AgentError) and "token budget exhausted" in str(result), result
