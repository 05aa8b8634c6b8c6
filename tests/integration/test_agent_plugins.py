"""Agents as plugins: the example package under examples/ (installed into the venv by scripts/test-env.sh, as an
operator would `pip install` it) is found through the `crewwork.agents` entry points and runs as a `task` agent end
to end on real Temporal and PostgreSQL; the operator's CREWWORK_AGENT_PLUGINS decides whether it may be used."""

from __future__ import annotations

import importlib.metadata

import pytest

from crewwork.agents.base import AgentConfigError
from crewwork.agents.catalogue import available_agents
from crewwork.agents.classes import get_agent_class
from crewwork.api.service import SubmissionRejected
from tests.conftest import Crew

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


@pytest.fixture(scope="module", autouse=True)
def example_plugin_installed() -> None:
    try:
        importlib.metadata.distribution("crewwork-example-agent")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(
            "the example plugin is not installed: pip install ./examples/crewwork-example-agent "
            "(scripts/test-env.sh does)"
        )


def test_the_registry_finds_the_plugin_and_says_where_it_comes_from() -> None:
    agents = available_agents(load=True)
    info = agents["textstats"]
    assert info.allowed and info.mock is False
    assert "crewwork-example-agent 0.1.0" in info.source and "crewwork_example_agent:TextStatsAgent" in info.source
    assert agents["scripted"].source == "builtin"
    assert available_agents(plugins="")["textstats"].allowed is False
    assert available_agents(plugins="textstats,other")["textstats"].allowed is True
    with pytest.raises(AgentConfigError, match="not enabled"):
        get_agent_class("textstats", plugins="")
    with pytest.raises(AgentConfigError, match="known agents: command, model, scripted, textstats"):
        get_agent_class("no-such-agent")


async def test_a_plugin_agent_runs_a_task_end_to_end(crew: Crew) -> None:
    wid = await crew.submit(
        {
            "kind": "task",
            "input": {"text": "to be or not to be\nthat is the question"},
            "agent": {"name": "textstats", "config": {"top": 2}},
        }
    )
    result = await crew.result(wid)
    assert result.state == "succeeded", result.reason
    assert not result.mock
    assert result.output == {"words": 10, "lines": 2, "chars": 39, "top": [["to", 2], ["be", 2]]}
    assert result.attempts[0].agent is not None and result.attempts[0].agent.agent == "textstats"


async def test_plugin_config_and_operator_policy_are_checked_at_submission(crew: Crew) -> None:
    with pytest.raises(SubmissionRejected, match="`top` must be an integer") as err:
        await crew.submit(
            {"kind": "task", "input": {"text": "x"}, "agent": {"name": "textstats", "config": {"top": 0}}}
        )
    assert err.value.field == "agent"
    # An operator that enables no plugins: the service reads the settings it was given (not the environment).
    crew.service.settings = crew.settings.model_copy(update={"agent_plugins": ""})
    with pytest.raises(SubmissionRejected, match="not enabled it"):
        await crew.submit({"kind": "task", "input": {"text": "x"}, "agent": {"name": "textstats"}})
