"""`crewwork agents check`: which configured agent CLIs work here, and why not.

For each command of CREWWORK_COMMAND_AGENTS with an `adapter`, in order, the first problem found is its answer:

1. the adapter's CLI is installed in `install_dir` (its executable found where the package puts it);
2. the gateway speaks the CLI's protocol, and the command's route (CREWWORK_MODEL_ENDPOINTS, its `workload`) has an
   endpoint that speaks it;
3. the key variables of those endpoints are set in this process's environment (the agent pool's, when run there);
4. the CLI starts inside the sandbox backend this host would use (`--version`, or an import for mini-swe-agent), with
   its installation mounted as a run mounts it: a library the sandbox image lacks shows here, not in a work item.

It also says which command is the delegated runner and whether the kill switch lets it run.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from crewwork.agents.cli_registry import ADAPTERS, SERVED_PROTOCOLS
from crewwork.agents.command import CommandAgentsSettings, cli_inside
from crewwork.config import Settings
from crewwork.sandbox.base import Mount, SandboxLimits
from crewwork.transport import TransportSettingsError, operator_config


@dataclass
class CliCheck:
    command: str
    adapter: str | None
    ok: bool
    why: str
    delegated: bool = False


def _version_argv(adapter: str, executable: Path) -> list[str]:
    if adapter == "mini-swe-agent":
        return [
            str(executable),
            "-c",
            "import minisweagent, litellm; print('mini-swe-agent', minisweagent.__version__)",
        ]
    return [str(executable), "--version"]


async def check_agents(settings: Settings, *, run: bool = True, env: dict[str, str] | None = None) -> list[CliCheck]:
    env = dict(os.environ) if env is None else env
    commands = CommandAgentsSettings.parse(settings.command_agents).commands
    try:
        transport = operator_config(settings.model_endpoints)
    except TransportSettingsError as exc:
        return [CliCheck(n, s.adapter, False, f"CREWWORK_MODEL_ENDPOINTS: {exc}") for n, s in commands.items()]
    out: list[CliCheck] = []
    for name, spec in sorted(commands.items()):
        delegated = name == settings.delegated_runner
        if spec.adapter is None:
            out.append(CliCheck(name, None, True, "a plain command (no adapter): nothing to check", delegated))
            continue
        adapter = ADAPTERS[spec.adapter]
        install = Path(spec.install_dir or "")
        executable = adapter.locate(install)
        if executable is None:
            why = f"not installed in {install}: install it with `{adapter.package.replace('DIR', str(install))}`"
            out.append(CliCheck(name, spec.adapter, False, why, delegated))
            continue
        if adapter.protocol not in SERVED_PROTOCOLS:
            out.append(
                CliCheck(name, spec.adapter, False, f"the gateway does not speak {adapter.protocol!r}", delegated)
            )
            continue
        try:
            route = transport.route(spec.workload)
        except TransportSettingsError as exc:
            out.append(CliCheck(name, spec.adapter, False, str(exc), delegated))
            continue
        speaking = [n for n in route if adapter.protocol in transport.endpoints[n].protocols]
        if not speaking:
            why = (
                f"no endpoint on route {spec.workload!r} ({', '.join(route)}) speaks {adapter.protocol!r}: add it to an "
                "endpoint's `protocols` in CREWWORK_MODEL_ENDPOINTS"
            )
            out.append(CliCheck(name, spec.adapter, False, why, delegated))
            continue
        unset = sorted(
            {
                e.api_key_env
                for n in speaking
                if (e := transport.endpoints[n]).api_key_env and not env.get(e.api_key_env)
            }
        )
        if unset:
            why = f"key variable(s) {', '.join(unset)} not set in this environment (the agent pool needs them)"
            out.append(CliCheck(name, spec.adapter, False, why, delegated))
            continue
        if run:
            problem = await _starts(settings, spec.adapter, executable.relative_to(install), install, spec.timeout_s)
            if problem:
                out.append(CliCheck(name, spec.adapter, False, problem, delegated))
                continue
        where = f"{speaking[0]} ({transport.endpoints[speaking[0]].model})"
        switch = (
            "" if settings.command_agent_enabled else " (but CREWWORK_COMMAND_AGENT_ENABLED=false: it will not run)"
        )
        out.append(CliCheck(name, spec.adapter, True, f"works: {executable} -> gateway -> {where}{switch}", delegated))
    if settings.delegated_runner and settings.delegated_runner not in commands:
        out.append(
            CliCheck(
                settings.delegated_runner,
                None,
                False,
                "CREWWORK_DELEGATED_RUNNER names a command CREWWORK_COMMAND_AGENTS does not define",
                True,
            )
        )
    return out


async def _starts(settings: Settings, adapter: str, executable: Path, install: Path, cap_s: float | None) -> str | None:
    from crewwork.sandbox.backends import best_available, get_sandbox

    try:
        backend = settings.sandbox.backend or best_available(settings.sandbox)[0]
        sandbox = get_sandbox(backend, allow_unsafe=settings.allow_unsafe_sandbox, settings=settings.sandbox)
    except Exception as exc:
        return f"no sandbox to run it in: {exc}"
    with tempfile.TemporaryDirectory(prefix="crewwork-agents-check-") as ws:
        os.chmod(ws, 0o777)
        try:
            result = await sandbox.run(
                _version_argv(adapter, Path(cli_inside(adapter)) / executable),
                workspace=Path(ws),
                limits=SandboxLimits(timeout_s=min(cap_s or 60.0, 60.0), memory_mb=2048),
                env={"HOME": "/tmp"},
                mounts=[Mount(install, cli_inside(adapter))],
            )
        except Exception as exc:
            return f"the {backend} sandbox could not run it: {exc}"
    if not result.ok:
        tail = (result.stderr or result.stdout)[-400:].decode("utf-8", "replace").strip()
        return f"it does not start in the {backend} sandbox ({result.cause}, exit {result.exit_code}): {tail}"
    return None
