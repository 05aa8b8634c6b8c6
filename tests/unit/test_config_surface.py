"""One configuration surface: every CREWWORK_* variable the code names is a settings field `crewwork config` lists."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from crewwork.config import Settings, describe_settings

PACKAGE = Path(__file__).resolve().parents[2] / "crewwork"

# Variables crewwork SETS for the processes it starts (agents, validation commands), never reads as configuration.
GIVEN_TO_CHILDREN = {
    "CREWWORK_ENV",
    "CREWWORK_IO_DIR",
    "CREWWORK_INSTRUCTION_FILE",
    "CREWWORK_WORK_ITEM_ID",
    "CREWWORK_REVIEW_FILE",
    "CREWWORK_DIAGNOSTICS_FILE",
    "CREWWORK_ATTEMPT",
    "CREWWORK_PREVIEW",  # set to 1 for an app started as a preview (docs/preview.md)
    "CREWWORK_GATEWAY_TOKEN",  # the attempt's model gateway token, given to an agent CLI (docs/gateway.md)
    "CREWWORK_WITNESS_DIR",  # where the outcome witness writes its streams, given to a validation run (lifecycle.md)
}


def _named_in_code() -> set[str]:
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        names |= set(re.findall(r"CREWWORK_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_{])", path.read_text()))
    return names


def test_every_variable_the_code_names_is_listed_by_crewwork_config() -> None:
    listed = {row["env"] for row in describe_settings()}
    missing = sorted(_named_in_code() - GIVEN_TO_CHILDREN - listed)
    assert not missing, f"variables named in crewwork/ but not fields of Settings: {missing}"


def test_no_variable_is_defined_twice() -> None:
    counts = Counter(row["env"] for row in describe_settings())
    assert [name for name, n in counts.items() if n > 1] == []


def test_every_setting_has_a_description() -> None:
    assert [row["env"] for row in describe_settings() if not row["description"]] == []


def test_nested_sections_read_their_own_prefix(monkeypatch) -> None:
    monkeypatch.setenv("CREWWORK_SANDBOX_BACKEND", "bwrap")
    monkeypatch.setenv("CREWWORK_SANDBOX_MAX_MEMORY_MB", "2048")
    monkeypatch.setenv("CREWWORK_API_RATE_PER_S", "3.5")
    s = Settings()
    assert (s.sandbox.backend, s.sandbox.max_memory_mb, s.api.api_rate_per_s) == ("bwrap", 2048, 3.5)


def test_a_misspelt_setting_passed_in_code_is_refused() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        Settings(sandbox_backend="bwrap")  # type: ignore[call-arg]  # the field lives in the sandbox section
