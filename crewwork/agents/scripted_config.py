"""The scripted agent's config (a work item's `agent.config`, described in crewwork/agents/scripted.py) as the
submission check reads it: its keys, its test-only fault fields (refused by crewwork.admission.policy), and its check. The API
checks a submission with this module alone, without the agent that runs the config."""

from __future__ import annotations

from typing import Any

from crewwork.boundary.paths import PathRefused, RelPath, diff_paths
from crewwork.models import WorkItemKind
from crewwork.models.errors import AgentConfigError

STEP_KEYS = {
    "files",
    "diff",
    "output",
    "delay_s",
    "claims",
    "fail",
    "stall_s",
    "crash",
    "block_s",
    "spin_s",
    "error",
    "on_activity_attempt",
    "tokens",
    "cost_usd",
}


FAULT_KEYS = ("crash", "stall_s", "block_s", "spin_s", "fail", "on_activity_attempt")
"""Test-only fault injection. Refused at submission (crewwork.admission.policy) and ignored here unless the operator runs with
CREWWORK_TEST_FAULTS (the worker passes it as `extra["test_faults"]`)."""


def fault_fields(config: dict[str, Any]) -> list[str]:
    """The fields of a scripted config that inject faults, as `agent.config...` paths (for a 422 naming them)."""
    out = [f"agent.config.{k}" for k in FAULT_KEYS if isinstance(config, dict) and k in config]
    steps = config.get("attempts") if isinstance(config, dict) else None
    for i, step in enumerate(steps if isinstance(steps, list) else []):
        if isinstance(step, dict):
            out += [f"agent.config.attempts[{i}].{k}" for k in FAULT_KEYS if k in step]
    return out


def validate_scripted_config(kind: WorkItemKind, config: dict[str, Any]) -> None:
    """Raise AgentConfigError naming what is wrong with a scripted agent's config."""
    unknown = set(config) - STEP_KEYS - {"attempts"}
    if unknown:
        raise AgentConfigError(f"scripted agent: unknown config keys {sorted(unknown)}")
    steps = config.get("attempts", [])
    if not isinstance(steps, list):
        raise AgentConfigError("scripted agent: `attempts` must be a list of steps")
    for i, step in enumerate([config, *steps]):
        if not isinstance(step, dict):
            raise AgentConfigError(f"scripted agent: attempts[{i - 1}] must be an object")
        bad = set(step) - STEP_KEYS - ({"attempts"} if i == 0 else set())
        if bad:
            raise AgentConfigError(f"scripted agent: attempts[{i - 1}] has unknown keys {sorted(bad)}")
        where = "config" if i == 0 else f"attempts[{i - 1}]"
        files = step.get("files")
        if files is not None:
            if not isinstance(files, dict):
                raise AgentConfigError("scripted agent: `files` maps relative paths to contents (or null)")
            for p, content in files.items():
                safe_rel(p, f"{where}.files key")
                if content is not None and not isinstance(content, str):
                    raise AgentConfigError(f"scripted agent: {where}.files[{p!r}] must be a string or null")
        if "diff" in step:
            if not isinstance(step["diff"], str):
                raise AgentConfigError("scripted agent: `diff` must be a unified diff string")
            for p in diff_paths(step["diff"]):
                safe_rel(p, f"{where}.diff path")
        for key in ("stall_s", "block_s", "spin_s"):
            value = step.get(key, 0)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise AgentConfigError(f"scripted agent: `{key}` must be a number of seconds, at least 0")
        delay = step.get("delay_s", 0)
        if not isinstance(delay, int | float) or delay < 0 or delay > 3600:
            raise AgentConfigError("scripted agent: `delay_s` must be between 0 and 3600")


def safe_rel(p: object, what: str = "file path") -> RelPath:
    try:
        return RelPath.parse(p, f"scripted agent {what}")
    except PathRefused as exc:
        raise AgentConfigError(str(exc)) from None
