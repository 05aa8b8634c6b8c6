"""The submitted work item: what is accepted and what is rejected, before anything is stored."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from crewwork.models import WorkItemSpec


def _code(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "kind": "code_change",
        "repo": {"url": "/tmp/x", "ref": "main"},
        "instruction": "fix it",
        "validation": {"command": ["pytest"]},
    }
    base.update(kw)
    return base


def test_task_needs_input() -> None:
    with pytest.raises(ValidationError, match="needs `input`"):
        WorkItemSpec.model_validate({"kind": "task"})
    assert WorkItemSpec.model_validate({"kind": "task", "input": {}}).input == {}


def test_unknown_fields_are_rejected_not_dropped() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        WorkItemSpec.model_validate({"kind": "task", "input": {}, "colour": "red"})
    with pytest.raises(ValidationError, match="Extra inputs"):
        WorkItemSpec.model_validate(_code(budget={"max_attempts": 2, "retries": 3}))


def test_bad_types_are_rejected() -> None:
    with pytest.raises(ValidationError):
        WorkItemSpec.model_validate(_code(budget={"max_attempts": "many"}))
    with pytest.raises(ValidationError):
        WorkItemSpec.model_validate(_code(validation={"command": "pytest -q"}))
    with pytest.raises(ValidationError):
        WorkItemSpec.model_validate(_code(budget={"max_attempts": 0}))


def test_code_change_needs_repo_instruction_and_validation() -> None:
    for missing in ("repo", "instruction", "validation"):
        data = _code()
        data.pop(missing)
        with pytest.raises(ValidationError, match=missing):
            WorkItemSpec.model_validate(data)


def test_refs_that_are_not_git_ref_names_are_rejected() -> None:
    with pytest.raises(ValidationError, match="not a valid git ref"):
        WorkItemSpec.model_validate(_code(repo={"url": "/tmp/x", "ref": "--upload-pack=evil"}))
    with pytest.raises(ValidationError, match="not a valid git ref"):
        WorkItemSpec.model_validate(_code(repo={"url": "/tmp/x", "ref": "a b"}))


def test_labels_are_bounded() -> None:
    with pytest.raises(ValidationError, match="at most"):
        WorkItemSpec.model_validate({"kind": "task", "input": {}, "labels": {f"k{i}": "v" for i in range(40)}})
