"""The `local` backend: runs on the host with no isolation. Development only, refused unless asked for.

It still applies a wall-clock timeout and rlimits so a runaway command cannot take the worker down, and every
result it produces says `isolated=False`. It runs the sandbox's own Python (crewwork/sandbox/toolchain.py) first on
PATH, never the worker's virtualenv. It cannot remap paths: the workspace and every mount are where they are on the
host (`remaps = False`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from crewwork.config.sandbox import SandboxSettings
from crewwork.sandbox._proc import (
    apply_rlimits,
    rlimit_enforcement,
    run_process,
    shell_status,
    signal_from_returncode,
)
from crewwork.sandbox.base import (
    Mount,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxRunResult,
    base_env,
    check_argv_and_workspace,
    check_mounts,
    disk_limited,
)
from crewwork.sandbox.toolchain import ensure_toolchain, toolchain_fingerprint


class LocalSandbox(Sandbox):
    """UNSAFE: the command sees the host's files and network with the worker's uid."""

    name: ClassVar[str] = "local"
    isolating: ClassVar[bool] = False
    remaps: ClassVar[bool] = False

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()

    @classmethod
    def available(cls, settings: SandboxSettings | None = None) -> tuple[bool, str]:
        return True, "always available; UNSAFE: no isolation (development only)"

    def runner(self) -> dict[str, str]:
        return {"backend": self.name, "python": toolchain_fingerprint()}

    async def run(
        self,
        argv: list[str],
        *,
        workspace: Path,
        limits: SandboxLimits,
        env: Mapping[str, str] | None = None,
        mounts: Sequence[Mount] = (),
        stop: asyncio.Event | None = None,
    ) -> SandboxRunResult:
        ws = check_argv_and_workspace(argv, workspace)
        check_mounts(mounts)  # nothing to mount (the command sees the host), but a missing source is an error
        toolchain = await asyncio.to_thread(ensure_toolchain, self.settings.toolchain_root())
        cpu_s = math.ceil(limits.timeout_s * limits.cpus) + 1

        def preexec() -> None:
            apply_rlimits(limits.memory_mb, limits.pids, cpu_s)

        try:
            outcome = await run_process(
                argv,
                cwd=ws,
                env=base_env(toolchain.path(), env),
                timeout_s=limits.timeout_s,
                max_log_bytes=limits.max_log_bytes,
                preexec_fn=preexec,
                stop=stop,
            )
        except (FileNotFoundError, PermissionError) as exc:
            missing = isinstance(exc, FileNotFoundError)
            return SandboxRunResult(
                backend=self.name, isolated=False, exit_code=127 if missing else 126, duration_s=0.0,
                stdout=b"", stderr=f"command {'not found' if missing else 'not executable'}: {exc.filename}\n".encode(),
                command_not_found=True, enforcement=rlimit_enforcement(),
            )  # fmt: skip
        except OSError as exc:
            raise SandboxError(f"local sandbox could not start {argv[0]!r}: {exc}") from exc
        return SandboxRunResult(
            backend=self.name,
            isolated=False,
            exit_code=shell_status(outcome.returncode),
            duration_s=outcome.duration_s,
            stdout=outcome.stdout,
            stderr=outcome.stderr,
            timed_out=outcome.timed_out,
            stopped=outcome.stopped,
            disk_limited=disk_limited(ws, shell_status(outcome.returncode), outcome.stdout, outcome.stderr),
            killed_by_signal=signal_from_returncode(outcome.returncode, shell_style=False),
            enforcement=rlimit_enforcement(),
            truncated=outcome.truncated,
        )
