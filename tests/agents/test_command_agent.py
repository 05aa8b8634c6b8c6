"""The command agent runs a real CLI in a real bubblewrap sandbox; a kill switch and eligibility choose it."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crewwork.agents.base import AgentConfigError, AgentContext, AgentError, OperatorAgentSettings
from crewwork.agents.command import CommandAgent, choose_agent
from crewwork.config import Settings
from crewwork.models import WorkItemKind
from crewwork.sandbox.base import Sandbox, SandboxLimits
from tests.agents.conftest import CALC, git_diff

MakeCtx = Callable[..., AgentContext]

# A tiny "agent CLI": reads its instruction file, fixes calc.py, reports what it saw, exits with a given code.
CLI = r"""
import json, os, pathlib, sys, time
io = pathlib.Path(os.environ["CREWWORK_IO_DIR"])
instruction = pathlib.Path(sys.argv[1]).read_text()
diagnostics = pathlib.Path(os.environ["CREWWORK_DIAGNOSTICS_FILE"]).read_text()
mode = sys.argv[2] if len(sys.argv) > 2 else "fix"
if mode == "sleep":
    time.sleep(30)
try:
    (io / "tamper.txt").write_text("x")
    tampered = True
except OSError:
    tampered = False
calc = pathlib.Path("calc.py")
calc.write_text(calc.read_text().replace("a - b", "a + b"))
print(json.dumps({"instruction": instruction, "diagnostics": diagnostics, "tampered": tampered,
                  "cwd": os.getcwd(), "secret": os.environ.get("CLI_TOKEN", "")}))
print("oops", file=sys.stderr)
sys.exit(3 if mode == "fail" else 0)
"""


def get_bwrap() -> Sandbox:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    try:
        from crewwork.sandbox.backends import get_sandbox  # type: ignore[import-not-found]

        return get_sandbox("bwrap")  # type: ignore[no-any-return]
    except ImportError:
        from crewwork.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox()


@pytest.fixture
def cli_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    (d / "fake_agent.py").write_text(CLI)
    # Operator mounts must be readable by the unprivileged sandbox user (mktemp makes the directory 0700).
    d.chmod(0o755)
    return d


CLI_ENV = {"CLI_TOKEN": "tok-0123456789-very-secret"}


def operator_settings(env: dict[str, str]) -> OperatorAgentSettings:
    """The agents' settings as a process with `env` reads them (crewwork.config.Settings, the only reader)."""
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("CREWWORK_"):
                mp.delenv(name)
        for name, value in env.items():
            mp.setenv(name, value)
        return OperatorAgentSettings.of(Settings())


def operator_env(cli_dir: Path, **spec: Any) -> dict[str, str]:
    command = {
        # The sandbox's own python (never the worker's), the CLI where the operator mounts it.
        "argv": ["python3", "/opt/fake-agent/fake_agent.py", "{instruction_file}"],
        "mounts": [f"{cli_dir}:/opt/fake-agent"],
        "pass_env": ["CLI_TOKEN"],
        **spec,
    }
    return {"CREWWORK_COMMAND_AGENTS": json.dumps({"commands": {"fixer": command}})}


def operator(cli_dir: Path, **spec: Any) -> OperatorAgentSettings:
    return operator_settings(operator_env(cli_dir, **spec))


async def test_cli_runs_in_a_real_sandbox_and_its_change_is_in_the_workspace(
    make_ctx: MakeCtx, git_repo: Path, cli_dir: Path
):
    sandbox = get_bwrap()
    ctx = make_ctx(
        {"command": "fixer"},
        sandbox=sandbox,
        limits=SandboxLimits(timeout_s=60),
        diagnostics="FAILED tests/test_calc.py::test_add",
    )
    result = await CommandAgent(operator(cli_dir), env=CLI_ENV).run(ctx)

    assert (git_repo / "calc.py").read_text() == CALC.replace("a - b", "a + b")
    diff = git_diff(git_repo)
    assert "+    return a + b" in diff
    # The input files live outside the worktree: nothing of them is in the diff.
    assert "instruction" not in diff and "crewwork" not in diff.lower()
    assert result.output is not None and result.output["exit_code"] == 0 and result.output["backend"] == "bwrap"
    seen = json.loads((result.claims or "").splitlines()[0])
    assert seen["instruction"].startswith("Fix add()") and seen["diagnostics"].startswith("FAILED")
    assert seen["tampered"] is False  # the input directory is read-only inside the sandbox
    assert seen["cwd"] == "/workspace", "the CLI sees its workspace at a path that says nothing about the host"
    # The passed-through secret reached the CLI but is masked in everything stored.
    assert "tok-0123456789-very-secret" not in (result.transcript or "") + (result.claims or "")
    assert CommandAgent.mock is False


async def test_nonzero_exit_and_timeout_are_agent_errors(make_ctx: MakeCtx, git_repo: Path, cli_dir: Path):
    sandbox = get_bwrap()
    failing = operator(cli_dir)
    with pytest.raises(AgentError, match=r"exited with code 3; stderr tail: oops") as info:
        await CommandAgent(failing, env=CLI_ENV).run(
            make_ctx({"command": "fixer", "args": ["fail"]}, sandbox=sandbox, limits=SandboxLimits(timeout_s=60))
        )
    assert '"exit_code": 3' in info.value.transcript  # type: ignore[attr-defined]

    slow = operator(cli_dir, timeout_s=1.0)
    with pytest.raises(AgentError, match=r"timed out after 1\.0s"):
        await CommandAgent(slow, env=CLI_ENV).run(
            make_ctx({"command": "fixer", "args": ["sleep"]}, sandbox=sandbox, limits=SandboxLimits(timeout_s=60))
        )


def test_kill_switch_falls_back_to_the_model_agent(cli_dir: Path):
    env = operator_env(cli_dir)
    assert choose_agent("command", {"command": "fixer"}, operator=operator_settings(env))[0] == "command"
    off = operator_settings({**env, "CREWWORK_COMMAND_AGENT_ENABLED": "false"})
    name, why = choose_agent("command", {"command": "fixer"}, operator=off)
    assert name == "model" and "disabled by the operator" in why
    assert choose_agent("scripted", {}, operator=off)[0] == "scripted"


async def test_kill_switch_also_stops_a_run_that_was_not_rerouted(make_ctx: MakeCtx, cli_dir: Path):
    off = operator_settings({**operator_env(cli_dir), "CREWWORK_COMMAND_AGENT_ENABLED": "0"})
    with pytest.raises(AgentError, match="disabled by the operator"):
        await CommandAgent(off, env=CLI_ENV).run(make_ctx({"command": "fixer"}))


def test_eligibility_by_repository_glob_and_labels(cli_dir: Path):
    env = operator(cli_dir, allowed_repos=["/srv/repos/team-a/*"], required_labels={"agent-cli": "ok"})
    ok = choose_agent(
        "command", {"command": "fixer"}, repo="/srv/repos/team-a/api", labels={"agent-cli": "ok"}, operator=env
    )
    assert ok == ("command", "command 'fixer' is enabled and this work item is eligible")
    other = "/srv/repos/team-b/api"
    name, why = choose_agent("command", {"command": "fixer"}, repo=other, labels={"agent-cli": "ok"}, operator=env)
    assert name == "model" and "matches none of" in why
    name, why = choose_agent("command", {"command": "fixer"}, repo="/srv/repos/team-a/api", labels={}, operator=env)
    assert name == "model" and "label agent-cli=ok is required" in why
    name, why = choose_agent("command", {"command": "unknown"}, operator=env)
    assert name == "model" and "not defined by the operator" in why


def test_validate_config():
    CommandAgent.validate_config(WorkItemKind.code_change, {"command": "fixer", "model": {"max_edit_rounds": 2}})
    with pytest.raises(AgentConfigError):
        CommandAgent.validate_config(WorkItemKind.code_change, {"argv": ["rm", "-rf", "/"]})
    with pytest.raises(AgentConfigError, match="max_edit_roundz"):
        CommandAgent.validate_config(WorkItemKind.code_change, {"command": "x", "model": {"max_edit_roundz": 2}})
