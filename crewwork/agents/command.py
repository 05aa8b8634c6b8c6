"""The command agent: runs an operator-configured agent CLI inside the sandbox ("delegated inner runner").

The operator declares the CLIs a worker may run (``CREWWORK_COMMAND_AGENTS``, JSON, see
`CommandAgentsSettings`); a work item picks one by name (``{"command": "aider"}``) and can never supply the
program itself. `choose_agent` decides, before the run, whether the command agent or the built-in model
agent runs, and says why, so the evidence records it: the operator kill switch
(``CREWWORK_COMMAND_AGENT_ENABLED=false``) and a per-command eligibility rule (repository globs, required
labels) both fall back to the model agent, configured by the ``"model"`` object of the same agent config.

How the CLI gets its inputs: the instruction, diagnostics and review comment are written as files into a
fresh temporary directory **outside the worktree**, mounted read-only into the sandbox, and named by
arguments (placeholders ``{instruction_file}``, ``{diagnostics_file}``, ``{review_file}``, ``{io_dir}``,
``{workspace}``, ``{attempt}``, ``{work_item_id}`` in the configured argv) and by environment variables
(``CREWWORK_IO_DIR``, ``CREWWORK_INSTRUCTION_FILE``, ...). Because they never touch the worktree they cannot
end up in the captured diff, and the CLI cannot rewrite them. The directory is deleted after the run.

Outcome: the CLI's changes in the workspace are the result (the platform captures and judges the diff). A
timeout, an out-of-memory kill, a process-cap hit or an exit code outside ``success_exit_codes`` is an
`AgentError` (the attempt fails with that cause); a failure of the sandbox machinery is an `AgentInfraError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import json
import os
import shutil
import tempfile
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from crewwork.agents.base import (
    Agent,
    AgentConfigError,
    AgentContext,
    AgentError,
    AgentInfraError,
    AgentRunResult,
    OperatorAgentSettings,
)
from crewwork.agents.command_config import CommandAgentConfig, validate_command_config
from crewwork.boundary.masking import Redactor
from crewwork.boundary.safefs import chown_tree, open_root, opened, remove
from crewwork.models import WorkItemKind
from crewwork.sandbox.base import Mount, SandboxError, SandboxLimits, SandboxUnavailable

T = TypeVar("T")

ENV_ENABLED = "CREWWORK_COMMAND_AGENT_ENABLED"
"""The operator's kill switch (Settings.command_agent_enabled), named in messages: false makes every work item run
the built-in model agent."""
ENV_COMMANDS = "CREWWORK_COMMAND_AGENTS"
"""The operator's command definitions as JSON (Settings.command_agents), named in messages:
``{"commands": {"name": CommandSpec, ...}}``."""
FALLBACK_AGENT = "model"

_OUTPUT_KEEP = 16_384
_PLACEHOLDERS = (
    "io_dir",
    "instruction_file",
    "diagnostics_file",
    "review_file",
    "workspace",
    "attempt",
    "work_item_id",
)


CLI_HOME = ".crewwork-home"
"""The agent CLI's HOME, in the workspace (its disk cap applies), removed before the change is captured."""
SESSION_LOG_MAX_BYTES = 8 * 1024 * 1024
"""A CLI's session log is kept up to this size (a larger one is not kept, and the evidence says so)."""
IO_INSIDE = "/crewwork/io"
"""Where the CLI sees its input files (instruction, diagnostics, review, context)."""


class CommandSpec(BaseModel):
    """One agent CLI the operator allows, and which work items may use it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    adapter: str | None = None
    """An agent CLI crewwork knows (`codex`, `claude-code`, `mini-swe-agent`: crewwork/agents/cli_registry.py): the
    adapter builds the command line, points the CLI at the attempt's model gateway, switches off its own prompts and
    sandbox and keeps its session log. `argv` is then not needed; `install_dir` is."""
    install_dir: str | None = None
    """Where the operator installed the CLI (an npm prefix, a virtualenv); mounted read-only at
    `/opt/crewwork-cli/<adapter>` inside the sandbox."""
    model: str | None = None
    """The model name the CLI is told (the gateway maps it onto the route); default: the route's first model."""
    workload: str = Field(default="agent", min_length=1, max_length=64)
    """The route of CREWWORK_MODEL_ENDPOINTS the CLI's calls take (then `default`, then every endpoint)."""
    argv: list[str] = Field(default_factory=list, max_length=128)
    """Program and arguments (without an adapter). Placeholders ``{instruction_file}``, ``{diagnostics_file}``, ``{review_file}``,
    ``{io_dir}``, ``{workspace}``, ``{attempt}``, ``{work_item_id}`` are substituted; the working directory
    is the workspace."""
    env: dict[str, str] = Field(default_factory=dict)
    """Fixed environment variables for the CLI (not for secrets: use `pass_env`)."""
    pass_env: list[str] = Field(default_factory=list)
    """Names of agent-worker environment variables passed through (e.g. the CLI's provider key). Their values
    are masked in the stored transcript. Note the sandbox has no network unless the backend grants it."""
    mounts: list[str] = Field(default_factory=list)
    """Host directories mounted read-only into the sandbox (the CLI's installation, its config): `HOST` (seen at the
    same path, e.g. `/opt/aider`) or `HOST:INSIDE` (split at the last colon). The place inside may not be one the
    sandbox provides itself (/usr, /etc, /tmp, /workspace, /opt/crewwork/python, ...), nor cover one from above
    (/opt), nor lie inside another mount."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Wall-clock cap of one run; lowers (never raises) the sandbox limit of the work item."""
    success_exit_codes: list[int] = Field(default_factory=lambda: [0])
    """Exit codes that mean the CLI finished (the change is then judged by validation, not by this)."""
    allowed_repos: list[str] = Field(default_factory=list)
    """Eligibility: fnmatch globs over the work item's repository URL/path; empty allows every repository."""
    required_labels: dict[str, str] = Field(default_factory=dict)
    """Eligibility: labels the work item must carry with these values ("*" = any value)."""

    @model_validator(mode="after")
    def _runnable(self) -> CommandSpec:
        if self.adapter is None and not self.argv:
            raise ValueError("a command needs `argv`, or an `adapter` and its `install_dir`")
        if self.adapter is not None:
            from crewwork.agents.cli_registry import ADAPTERS

            if self.adapter not in ADAPTERS:
                raise ValueError(f"unknown adapter {self.adapter!r}; known: {', '.join(sorted(ADAPTERS))}")
            if not self.install_dir or not os.path.isabs(self.install_dir):
                raise ValueError(f"adapter {self.adapter!r} needs `install_dir`, an absolute path")
        return self

    @field_validator("pass_env")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not name or "=" in name or not name.replace("_", "").isalnum():
                raise ValueError(f"pass_env entries are variable names, got {name!r}")
        return v

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        # Checked when the settings load, so a place the sandbox provides (or covers from above) is an operator
        # error at start-up, not a failed agent run; the host paths are checked when a run mounts them.
        for entry in v:
            try:
                _operator_mount(entry)
            except ValueError as e:
                raise ValueError(f"mounts: {e}") from None
        return v


class CommandAgentsSettings(BaseModel):
    """The operator's command-agent configuration (``CREWWORK_COMMAND_AGENTS``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    commands: dict[str, CommandSpec] = Field(default_factory=dict)
    """Allowed CLIs by name; a work item refers to one by this name."""

    @classmethod
    def parse(cls, raw: str) -> CommandAgentsSettings:
        """From the JSON text of ``CREWWORK_COMMAND_AGENTS`` (Settings.command_agents; empty when unset)."""
        raw = raw.strip()
        if not raw:
            return cls()
        try:
            return cls.model_validate(json.loads(raw))
        except (ValueError, ValidationError) as e:
            raise AgentConfigError(f"{ENV_COMMANDS} is invalid: {str(e).splitlines()[0]}") from None


def choose_agent(
    requested: str,
    config: Mapping[str, Any] | None,
    *,
    repo: str | None = None,
    labels: Mapping[str, str] | None = None,
    operator: OperatorAgentSettings | None = None,
    delegated: str = "",
    code_change: bool = True,
) -> tuple[str, str]:
    """Which agent runs for a work item that asked for `requested`, and why (a sentence for the evidence).

    `delegated`: the operator's delegated runner (CREWWORK_DELEGATED_RUNNER): a code change that asks for the model
    agent runs that command instead, under the same kill switch and eligibility, the model agent being the fallback.

    Only a request for "command" can be redirected: to the built-in model agent when the operator's kill
    switch is off, when the command is not defined by the operator, or when the work item is not eligible
    for it (repository glob, required labels). `operator`: the deployment's settings (default: this process's).
    """
    operator = OperatorAgentSettings.of_process() if operator is None else operator
    if requested == FALLBACK_AGENT and delegated and code_change:
        runner, why = choose_agent(
            CommandAgent.name, {"command": delegated}, repo=repo, labels=labels, operator=operator
        )
        if runner == CommandAgent.name:
            return runner, f"the operator's delegated runner {delegated!r} runs code changes by default ({why})"
        return FALLBACK_AGENT, f"the model agent runs: {why.split('; the built-in')[0]}"
    if requested != CommandAgent.name:
        return requested, f"agent {requested!r} was requested"
    fallback = f"; the built-in {FALLBACK_AGENT!r} agent runs instead"
    if not operator.command_agent_enabled:
        return (
            FALLBACK_AGENT,
            f"the command agent is disabled by the operator ({ENV_ENABLED}=false){fallback}",
        )
    try:
        cfg = CommandAgentConfig.model_validate(dict(config or {}))
        settings = CommandAgentsSettings.parse(operator.command_agents)
    except (ValidationError, AgentConfigError) as e:
        return FALLBACK_AGENT, f"the command agent cannot run: {str(e).splitlines()[0]}{fallback}"
    spec = settings.commands.get(cfg.command)
    if spec is None:
        known = ", ".join(sorted(settings.commands)) or "none"
        return FALLBACK_AGENT, (f"command {cfg.command!r} is not defined by the operator (defined: {known}){fallback}")
    reason = ineligible_reason(spec, repo=repo, labels=labels)
    if reason:
        return (
            FALLBACK_AGENT,
            f"this work item is not eligible for command {cfg.command!r}: {reason}{fallback}",
        )
    return CommandAgent.name, f"command {cfg.command!r} is enabled and this work item is eligible"


def ineligible_reason(spec: CommandSpec, *, repo: str | None, labels: Mapping[str, str] | None) -> str | None:
    if spec.allowed_repos:
        if repo is None or not any(fnmatch.fnmatchcase(repo, g) for g in spec.allowed_repos):
            return f"repository {repo!r} matches none of {spec.allowed_repos}"
    labels = labels or {}
    for key, want in spec.required_labels.items():
        have = labels.get(key)
        if have is None or (want != "*" and have != want):
            return f"label {key}={want} is required (the work item has {key}={have!r})"
    return None


class CommandAgent(Agent):
    """Runs an operator-defined agent CLI in the sandbox against the attempt's workspace."""

    name = "command"
    mock = False

    def __init__(self, operator: OperatorAgentSettings | None = None, env: Mapping[str, str] | None = None) -> None:
        """`operator`: the deployment's commands and kill switch (default: this process's settings); `env`: where
        a command's `pass_env` variables are read (default: this process's environment)."""
        self._operator = OperatorAgentSettings.of_process() if operator is None else operator
        self._env = os.environ if env is None else env

    @classmethod
    def validate_config(cls, kind: WorkItemKind, config: dict[str, Any]) -> None:
        validate_command_config(kind, config)

    async def run(self, ctx: AgentContext) -> AgentRunResult:
        if not self._operator.command_agent_enabled:
            # The activity should have chosen the model agent already; the switch still holds if it did not.
            raise AgentError(f"the command agent is disabled by the operator ({ENV_ENABLED}=false)")
        try:
            cfg = CommandAgentConfig.model_validate(ctx.config)
            settings = CommandAgentsSettings.parse(self._operator.command_agents)
        except ValidationError as e:
            raise AgentError(f"command agent config: {str(e).splitlines()[0]}") from None
        except AgentConfigError as e:
            raise AgentError(str(e)) from None
        spec = settings.commands.get(cfg.command)
        if spec is None:
            raise AgentError(f"command {cfg.command!r} is not defined by the operator ({ENV_COMMANDS})")
        if ctx.extra.get("repo") is not None or ctx.extra.get("labels") is not None:
            reason = ineligible_reason(spec, repo=ctx.extra.get("repo"), labels=ctx.extra.get("labels"))
            if reason:
                raise AgentError(f"not eligible for command {cfg.command!r}: {reason}")
        if ctx.workspace is None or ctx.sandbox is None:
            raise AgentError("the command agent needs a workspace and a sandbox")

        passed = {n: self._env[n] for n in spec.pass_env if n in self._env}
        redact = Redactor(passed.values())
        io_dir = Path(tempfile.mkdtemp(prefix="crewwork-agent-io-"))
        home: Path | None = None
        try:
            files = _write_inputs(io_dir, ctx)
            try:
                mounts = [Mount(io_dir, IO_INSIDE), *(_operator_mount(m) for m in spec.mounts)]
            except ValueError as e:
                raise AgentError(f"command {cfg.command!r} cannot run: {e}") from None
            io_inside = ctx.sandbox.inside(mounts[0])
            # Paths as the CLI sees them inside the sandbox (nothing about where the worker keeps them).
            values = {**{k: f"{io_inside}/{v.name}" for k, v in files.items()}, "io_dir": io_inside}
            values.update(
                workspace=ctx.sandbox.workspace_inside(ctx.workspace),
                attempt=str(ctx.attempt),
                work_item_id=ctx.work_item_id,
            )
            argv = [_substitute(a, values) for a in spec.argv] + list(cfg.args)
            adapted: dict[str, str] = {}
            if spec.adapter is not None:
                # The CLI's private HOME lies in the workspace's own file system (under its disk cap, never the
                # host's /tmp), and is taken out before the change is captured. Its name is fixed, so a replay's
                # prompts name the same paths as the recorded run's.
                home = ctx.workspace / CLI_HOME
                try:
                    home.mkdir(mode=0o700)
                except FileExistsError:
                    raise AgentError(f"the repository holds {CLI_HOME}, where the agent CLI's HOME goes") from None
                argv, adapted, more = adapted_run(ctx, cfg.command, spec, home, values["workspace"])
                mounts += more
                redact = redact.extended([adapted.get("CREWWORK_GATEWAY_TOKEN", ""), _token(ctx)])
            env = {
                **spec.env,
                **adapted,
                **passed,
                "CREWWORK_IO_DIR": io_inside,
                "CREWWORK_INSTRUCTION_FILE": values["instruction_file"],
                "CREWWORK_DIAGNOSTICS_FILE": values["diagnostics_file"],
                "CREWWORK_REVIEW_FILE": values["review_file"],
                "CREWWORK_WORK_ITEM_ID": ctx.work_item_id,
                "CREWWORK_ATTEMPT": str(ctx.attempt),
            }
            limits = _limits(ctx, spec)
            details = {"agent": self.name, "command": cfg.command, "attempt": ctx.attempt, "phase": "running"}
            ctx.heartbeat(details)
            try:
                result = await _heartbeating(
                    ctx.sandbox.run(argv, workspace=ctx.workspace, limits=limits, env=env, mounts=mounts),
                    ctx,
                    details,
                )
            except ValueError as e:
                raise AgentError(f"command {cfg.command!r} cannot run: {redact(str(e))}") from None
            except Exception as e:
                # SandboxError (machinery failed) and anything unexpected from a backend: another attempt may
                # succeed, so it goes through the retry policy. SandboxUnavailable is an operator problem.
                if isinstance(e, SandboxUnavailable):
                    raise AgentError(f"sandbox unavailable for the command agent: {e}") from None
                if isinstance(e, SandboxError | OSError):
                    raise AgentInfraError(f"sandbox failed running the command agent: {e}") from None
                raise
            logs = await keep_session_logs(ctx, spec, home, redact) if home is not None else []
        finally:
            shutil.rmtree(io_dir, ignore_errors=True)
            if home is not None:
                try:
                    with opened(open_root(ctx.workspace)) as root:
                        remove(root, home.name)  # never follows a link the CLI may have left, HOME itself included
                except OSError as e:  # it must not become part of the change
                    raise AgentError(f"the CLI's HOME could not be taken out of the workspace: {e}") from None

        stdout = redact(_text(result.stdout))
        stderr = redact(_text(result.stderr))
        report = {
            "command": cfg.command,
            "exit_code": result.exit_code,
            "duration_s": round(float(getattr(result, "duration_s", 0.0)), 3),
            "backend": getattr(result, "backend", None),
            "isolated": getattr(result, "isolated", None),
            "cause": getattr(result, "cause", None),
        }
        if spec.adapter is not None:
            report.update(adapter=spec.adapter, session_logs=logs)
        transcript = redact(
            json.dumps(
                {
                    "agent": self.name,
                    "argv": argv,
                    "env_names": sorted(env),
                    **report,
                    "timed_out": bool(getattr(result, "timed_out", False)),
                    "oom_killed": bool(getattr(result, "oom_killed", False)),
                    "pids_limited": bool(getattr(result, "pids_limited", False)),
                    "stdout_tail": stdout,
                    "stderr_tail": stderr,
                },
                indent=2,
                ensure_ascii=False,
            )
        )
        failure = _failure(result, spec, limits.timeout_s if limits else None)
        if failure:
            err = AgentError(f"command {cfg.command!r} {failure}; stderr tail: {stderr[-800:].strip() or '(empty)'}")
            err.transcript = transcript  # type: ignore[attr-defined]
            err.tokens_used, err.cost_usd = 0, 0.0  # type: ignore[attr-defined]
            raise err
        return AgentRunResult(output=report, claims=stdout[-2000:].strip() or None, transcript=transcript)


def _token(ctx: AgentContext) -> str:
    handle = ctx.extra.get("gateway")
    return str(getattr(handle, "token", "") or "")


def cli_inside(adapter: str) -> str:
    """Where an agent CLI's installation is seen inside the sandbox (wherever the operator put it on the host: an
    npm prefix and a virtualenv both run from any place; the one below /tmp, say, could not be mounted at its own)."""
    return f"/opt/crewwork-cli/{adapter}"


def adapted_run(
    ctx: AgentContext, command: str, spec: CommandSpec, home: Path, workspace: str
) -> tuple[list[str], dict[str, str], list[Mount]]:
    """The command line, environment and mounts of an adapter's CLI: behind the gateway's relay, with a private HOME
    holding its config, its installation mounted read-only at `cli_inside(adapter)`. AgentError for what the operator
    must fix."""
    from crewwork.agents.cli_adapter import CliRun, compose_prompt
    from crewwork.agents.cli_registry import ADAPTERS

    handle = ctx.extra.get("gateway")
    if handle is None:
        raise AgentError(f"command {command!r} needs the model gateway, which this attempt was not given")
    assert spec.adapter is not None and spec.install_dir is not None and ctx.sandbox is not None
    if not ctx.sandbox.remaps:
        raise AgentError(f"command {command!r} (an agent CLI) needs an isolating sandbox backend, not `local`")
    adapter = ADAPTERS[spec.adapter]
    install = Path(spec.install_dir)
    executable = adapter.locate(install)
    if executable is None:
        raise AgentError(
            f"command {command!r}: no {adapter.name} installation in {install} (install it with: {adapter.package})"
        )
    model = spec.model or dict(handle.models).get(adapter.protocol)
    if not model:
        raise AgentError(
            f"command {command!r}: no endpoint on route {spec.workload!r} speaks {adapter.protocol!r} "
            "(set `protocols` on an endpoint of CREWWORK_MODEL_ENDPOINTS)"
        )
    run = CliRun(
        prompt=compose_prompt(ctx.instruction, ctx.diagnostics, ctx.review_comment),
        base_url=handle.base_url,
        root_url=handle.root_url,
        token=handle.token,
        model=model,
        install=Path(cli_inside(adapter.name)),
        workspace=workspace,
        home=f"{workspace}/{home.name}",
    )
    prepared = adapter.prepare(run, Path(cli_inside(adapter.name)) / executable.relative_to(install))
    for rel, content in prepared.files.items():
        target = home / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    owner = ctx.workspace.stat() if ctx.workspace is not None else None
    if owner is not None and (owner.st_uid, owner.st_gid) != (os.geteuid(), os.getegid()):
        chown_tree(home, (owner.st_uid, owner.st_gid))  # the sandbox's user owns the workspace, and so its HOME
    from crewwork.gateway.forwarder import INSIDE

    mounts = [Mount(Path(handle.host_dir), INSIDE), Mount(install, cli_inside(adapter.name))]
    return handle.relay_argv(prepared.argv), prepared.env, mounts


async def keep_session_logs(ctx: AgentContext, spec: CommandSpec, home: Path, redact: Redactor) -> list[str]:
    """The CLI's session logs as artifacts of the attempt (read without following links, bounded, masked)."""
    from crewwork.agents.cli_registry import ADAPTERS
    from crewwork.boundary.safefs import Refused, read_bytes

    if spec.adapter is None or ctx.save_artifact is None:
        return []
    kept: list[str] = []
    for path in ADAPTERS[spec.adapter].session_logs(home)[:8]:
        try:
            # Beneath the workspace, every component checked: HOME or a directory in it may be a link by now.
            rel = f"{home.name}/{path.relative_to(home)}"
            data = read_bytes(home.parent, rel, max_bytes=SESSION_LOG_MAX_BYTES)
        except (Refused, OSError, ValueError) as exc:
            kept.append(f"{path.name}: not kept ({exc})")
            continue
        name = f"attempt-{ctx.attempt}-{spec.adapter}-{path.name}"
        ref = await ctx.save_artifact(name, redact(data.decode("utf-8", "replace")).encode(), "application/x-ndjson")
        kept.append(str(getattr(ref, "id", ref)))
    return kept


def _write_inputs(io_dir: Path, ctx: AgentContext) -> dict[str, Path]:
    files = {
        "instruction_file": io_dir / "instruction.md",
        "diagnostics_file": io_dir / "diagnostics.md",
        "review_file": io_dir / "review.md",
    }
    files["instruction_file"].write_text(ctx.instruction or "", encoding="utf-8")
    files["diagnostics_file"].write_text(ctx.diagnostics or "", encoding="utf-8")
    files["review_file"].write_text(ctx.review_comment or "", encoding="utf-8")
    meta = {"work_item_id": ctx.work_item_id, "attempt": ctx.attempt, "kind": str(ctx.kind)}
    (io_dir / "context.json").write_text(json.dumps(meta), encoding="utf-8")
    # Readable by whichever uid the sandbox maps the CLI to; never writable (it is also mounted read-only).
    io_dir.chmod(0o755)
    for p in io_dir.iterdir():
        p.chmod(0o644)
    return files


def _operator_mount(entry: str) -> Mount:
    """`HOST` (seen at the same path) or `HOST:INSIDE` (the last colon separates them, so a host path may hold one when
    the place inside is given). Raises ValueError for a place inside that Mount refuses."""
    host, sep, inside = entry.rpartition(":")
    if not sep:
        host, inside = entry, entry
    if not host:
        raise ValueError(f"mount {entry!r}: no host path")
    return Mount(Path(host), os.path.normpath(inside))


def _substitute(arg: str, values: Mapping[str, str]) -> str:
    # Plain replacement, not str.format: an argv may legitimately contain other braces (JSON, shell code).
    for key in _PLACEHOLDERS:
        arg = arg.replace("{" + key + "}", values[key])
    return arg


def _limits(ctx: AgentContext, spec: CommandSpec) -> Any:
    limits = ctx.limits
    if limits is None:
        limits = SandboxLimits()
    if spec.timeout_s is not None and spec.timeout_s < limits.timeout_s:
        limits = dataclasses.replace(limits, timeout_s=spec.timeout_s)
    return limits


def _failure(result: Any, spec: CommandSpec, timeout_s: float | None) -> str | None:
    if getattr(result, "timed_out", False):
        return f"timed out after {timeout_s}s"
    if getattr(result, "oom_killed", False):
        return "was killed for exceeding the memory limit"
    if getattr(result, "pids_limited", False):
        return "hit the process limit"
    if getattr(result, "killed_by_signal", None) is not None:
        return f"was killed by signal {result.killed_by_signal}"
    if result.exit_code not in spec.success_exit_codes:
        return f"exited with code {result.exit_code}"
    return None


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        data = data[-_OUTPUT_KEEP:].decode("utf-8", "replace")
    return data[-_OUTPUT_KEEP:]


async def _heartbeating(call: Awaitable[T], ctx: AgentContext, details: dict[str, Any], every: float = 5.0) -> T:
    task = asyncio.ensure_future(call)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every)
            if done:
                return task.result()
            ctx.heartbeat(details)
    finally:
        if not task.done():
            task.cancel()
