"""The agent step's model gateway: opened for every attempt whose agent calls a model (the model agent, a command with an
agent-CLI adapter), so every model call of every agent goes through one accounting path (crewwork/gateway/).

- **Route**: the operator's endpoints (CREWWORK_MODEL_ENDPOINTS, with a work item's own where the operator allows them,
  for the model agent) on the agent's workload route.
- **Budget**: the work item's token and cost budgets capped by the operator's ceilings, less what its earlier attempts
  spent (their recorded outcomes) and what earlier Temporal attempts of this same step already spent (their
  `model_call` events: a worker that crashed mid-run still paid for its calls).
- **Durability**: each call is a fenced `model_call` event of the attempt, written when the call ends, before the next
  is admitted: the spend survives a crash, and a write refused (a later attempt has taken over) stops the gateway.
- **Stop**: when the gateway refuses a call for the budget, or stops for any other reason, the agent's run is cancelled
  and the attempt ends with that reason.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from crewwork.agents.base import OperatorAgentSettings
from crewwork.agents.command import CommandAgentsSettings
from crewwork.agents.command_config import CommandAgentConfig
from crewwork.agents.model_config import ModelAgentConfig
from crewwork.gateway.forwarder import AttemptGateway, CallRecord
from crewwork.gateway.ledger import Budget
from crewwork.gateway.replayer import Replayer
from crewwork.models import WorkItemKind
from crewwork.models.limits import effective_budget
from crewwork.steps.agent import AgentStepInput
from crewwork.steps.attempt import AttemptWriter
from crewwork.steps.ports import Ports
from crewwork.transport import TransportConfig, TransportSettingsError, merge_configs, operator_config

MODEL_CALL_EVENT = "model_call"
_ROOT: list[Path] = []


def gateways_root() -> Path:
    """This process's directory of gateway sockets: made once, private (0755, ours), and short, because a unix
    socket's path must fit in ~108 bytes wherever the data directory lies."""
    if not _ROOT or not _ROOT[0].is_dir():
        root = Path(tempfile.mkdtemp(prefix="crewwork-gw-"))
        os.chmod(root, 0o755)  # the sandbox user traverses it to the socket; nobody else writes here
        _ROOT[:] = [root]
    return _ROOT[0]


def gateway_route(
    ports: Ports, inp: AgentStepInput, agent: str, config: dict[str, Any]
) -> tuple[TransportConfig, list[str]] | None:
    """(transport, route) of the agent's gateway, or None when the agent calls no model through one. Read from the
    same operator settings the agents read (this process's, at the call), so the gateway routes what the agent asks.
    Only the model and command agents call a model: for the others nothing is read (reading the settings from the
    environment is ~2 ms of pydantic, half the agent pool's CPU per item under the load test)."""
    if agent not in ("model", "command"):
        return None
    agents = OperatorAgentSettings.of_process()
    operator = operator_config(agents.model_endpoints)
    if agent == "model":
        cfg = ModelAgentConfig.from_agent_config(config)
        transport = merge_configs(operator, cfg.transport())
        workload = "chat" if inp.spec.kind == WorkItemKind.task else cfg.workload
        return transport, transport.route(workload)
    if agent == "command":
        command = CommandAgentConfig.model_validate(config).command
        spec = CommandAgentsSettings.parse(agents.command_agents).commands.get(command)
        if spec is None or spec.adapter is None:
            return None
        try:
            return operator, operator.route(spec.workload)
        except TransportSettingsError:
            return operator, []
    return None


async def budget_for(ports: Ports, inp: AgentStepInput) -> tuple[Budget, int, float]:
    """The attempt's budget, and what earlier Temporal attempts of this step already spent (tokens, cost)."""
    budget = effective_budget(inp.spec.budget, ports.settings.operator_ceilings())
    before_tokens, before_cost = 0, 0.0
    for a in await ports.store.list_attempts(inp.work_item_id):
        if a.number < inp.attempt and a.agent:
            before_tokens += int(a.agent.get("tokens_used") or 0)
            before_cost += float(a.agent.get("cost_usd") or 0.0)
    mine_tokens, mine_cost = 0, 0.0
    after = 0
    while True:
        events = await ports.store.list_events(inp.work_item_id, after_id=after, limit=1000)
        for e in events:
            if e.type == MODEL_CALL_EVENT and e.data.get("attempt") == inp.attempt and e.data.get("step") == inp.step:
                mine_tokens += int(e.data.get("input_tokens") or 0) + int(e.data.get("output_tokens") or 0)
                mine_cost += float(e.data.get("cost_usd") or 0.0)
        if len(events) < 1000:
            break
        after = events[-1].id
    result = Budget(
        max_tokens=budget.max_tokens,
        max_cost_usd=budget.max_cost_usd,
        spent_before_tokens=before_tokens,
        spent_before_cost_usd=before_cost,
        max_calls=ports.settings.gateway.max_calls,
    )
    return result, mine_tokens, mine_cost


@contextlib.asynccontextmanager
async def attempt_gateway(
    ports: Ports,
    w: AttemptWriter,
    inp: AgentStepInput,
    agent: str,
    config: dict[str, Any],
    replay: Replayer | None = None,
) -> AsyncIterator[AttemptGateway | None]:
    """The attempt's gateway while the agent runs (None when the agent calls no model through one)."""
    try:
        found = gateway_route(ports, inp, agent, config)
    except (TransportSettingsError, ValueError):
        found = None  # the agent reports its own configuration error
    if found is None:
        yield None
        return
    transport, route = found
    budget, tokens, cost = await budget_for(ports, inp)
    if replay is not None:  # a replay spends nothing: only the operator's call bound holds
        budget, tokens, cost = Budget(max_calls=budget.max_calls), 0, 0.0
    settings = ports.settings

    async def on_call(record: CallRecord) -> bool:
        data = {"attempt": inp.attempt, "step": inp.step, "activity_attempt": w.rank.attempt, **record.event()}
        written = await w.event(MODEL_CALL_EVENT, data)
        return not written.stale

    policy = settings.tenant_setting(settings.tenant_policies, inp.tenant_id, None)
    gw = AttemptGateway(
        root=gateways_root(),
        transport=transport,
        route=route,
        settings=settings.gateway,
        budget=budget,
        tenant_id=inp.tenant_id,
        header={
            "work_item_id": inp.work_item_id,
            "attempt": inp.attempt,
            "step": inp.step,
            "activity_attempt": w.rank.attempt,
            "agent": agent,
            "replay": replay is not None,
            # What a replay needs to run the same agent on the same input (crewwork/steps/agent/replay.py).
            "inputs": {
                "agent": agent,
                "config": config,
                "repo_path": inp.repo_path,
                "base_commit": inp.base_commit,
                "diagnostics": inp.diagnostics,
                "review_comment": inp.review_comment,
            },
        },
        upstream=replay,
        on_call=None if replay is not None else on_call,
        calls_per_minute=policy.model_calls_per_minute
        if policy and policy.model_calls_per_minute is not None
        else None,
        max_transcript_bytes=settings.max_artifact_bytes,
    )
    gw.ledger.tokens, gw.ledger.cost_usd = tokens, cost
    async with gw:
        yield gw
