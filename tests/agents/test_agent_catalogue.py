"""The catalogue the API checks submissions with (crewwork/agents/catalogue.py) says the same as the agent classes
the agent pool runs (crewwork/agents/classes.py): the same names, mock labels and config checks."""

from __future__ import annotations

from typing import Any

import pytest

from crewwork.agents.catalogue import BUILTIN as CHECKS
from crewwork.agents.catalogue import agent_check
from crewwork.agents.classes import BUILTIN as CLASSES
from crewwork.models import WorkItemKind
from crewwork.models.errors import AgentConfigError


def test_the_catalogue_names_every_built_in_agent_with_its_mock_label() -> None:
    assert set(CHECKS) == set(CLASSES)
    for name, cls in CLASSES.items():
        assert CHECKS[name].name == cls.name == name
        assert CHECKS[name].mock is cls.mock


@pytest.mark.parametrize(
    ("name", "kind", "config"),
    [
        ("scripted", WorkItemKind.task, {"output": {"a": 1}}),
        ("scripted", WorkItemKind.task, {"nonsense": 1}),
        ("scripted", WorkItemKind.code_change, {"files": {".git/config": "x"}}),
        ("model", WorkItemKind.code_change, {"max_edit_rounds": 2}),
        ("model", WorkItemKind.code_change, {"max_edit_roundz": 2}),
        ("command", WorkItemKind.code_change, {"command": "aider"}),
        ("command", WorkItemKind.task, {"command": "aider"}),
        ("command", WorkItemKind.code_change, {"command": "aider", "model": {"max_edit_rounds": 99}}),
    ],
)
def test_the_catalogue_checks_a_config_as_the_agent_does(name: str, kind: WorkItemKind, config: dict[str, Any]) -> None:
    def outcome(check: Any) -> str | None:
        try:
            check(kind, config)
        except AgentConfigError as exc:
            return str(exc)
        return None

    assert outcome(agent_check(name).validate_config) == outcome(CLASSES[name].validate_config)


def test_an_unknown_agent_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(AgentConfigError, match=r"known agents: .*command.*model.*scripted"):
        agent_check("no-such-agent", plugins="")
