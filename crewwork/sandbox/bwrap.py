"""The `bwrap` backend: bubblewrap namespaces plus a per-run cgroup (rlimits where cgroups are unavailable).

No daemon, ~10 ms to start. The sandbox gets fresh user, pid, net, ipc, uts and mount namespaces, sees only
the host's system directories read-only (not all of `/`: the worker's home, /run sockets and service data
stay invisible), a private /tmp, and the workspace as its single writable bind. It shares the host kernel,
so a kernel exploit escapes it; use gVisor for untrusted code that may try one.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from crewwork.sandbox._proc import (
    apply_rlimits,
    rlimit_enforcement,
    rlimit_prefix,
    run_process,
    shell_status,
    signal_from_returncode,
)
from crewwork.sandbox.base import (
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxRunResult,
    SandboxUnavailable,
    base_env,
    check_argv_and_workspace,
    host_python_path,
)
from crewwork.sandbox.cgroups import JOIN_FAILED, RunCgroup
from crewwork.sandbox.config import SandboxSettings
from crewwork.sandbox.seccomp import filter_fd

INSTALL_HINT = "install bubblewrap: `apt-get install -y bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`"
NOBODY = 65534
# System directories the sandbox sees read-only. Anything else on the host (homes, /run with the Docker and
# PostgreSQL sockets, /var/lib service data, /opt) is simply absent.
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# Readable by root even with every capability dropped, because a root worker's uid owns them.
MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers")


def _python_dirs() -> list[str]:
    """The interpreter's prefixes, so `python -m pytest` works inside even when Python lives in a home dir."""
    dirs = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(sys.executable))}
    return sorted(d for d in dirs if not any(d == s or d.startswith(s + "/") for s in ("/usr", "/etc")))


def _system_binds() -> list[str]:
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for f in MASKED_FILES:
        if os.path.exists(f):
            args += ["--ro-bind", "/dev/null", f]
    return args


class BwrapSandbox(Sandbox):
    """Namespaces via bubblewrap; memory/pids/cpu via cgroups (v1 or v2) or rlimits as a fallback."""

    name: ClassVar[str] = "bwrap"
    isolating: ClassVar[bool] = True

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        self.bwrap = shutil.which("bwrap")
        if self.bwrap is None:
            raise SandboxUnavailable(f"bubblewrap (bwrap) is not on PATH; {INSTALL_HINT}")

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return _probe()

    def command(
        self,
        argv: Sequence[str],
        ws: Path,
        limits: SandboxLimits,
        ro_mounts: Sequence[Path],
        seccomp_fd: int | None = None,
    ) -> list[str]:
        assert self.bwrap is not None
        args = [self.bwrap, "--unshare-all", "--new-session", "--die-with-parent", "--hostname", "sandbox"]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        if os.geteuid() == 0:
            # As root, bwrap would keep full capabilities inside; run as nobody with none instead.
            args += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--cap-drop", "ALL"]
        args += _system_binds()
        args += ["--dev", "/dev", "--proc", "/proc"]
        args += ["--size", str(limits.tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        # After the private /tmp, so an interpreter that lives under /tmp (a CI checkout, say) stays visible.
        for d in _python_dirs():
            args += ["--ro-bind", d, d]
        for m in ro_mounts:
            p = os.path.realpath(m)
            if not os.path.exists(p):
                raise ValueError(f"read-only mount {m} does not exist")
            args += ["--ro-bind", p, p]
        args += ["--bind", str(ws), str(ws), "--chdir", str(ws), "--", *argv]
        return args

    async def run(
        self,
        argv: list[str],
        *,
        workspace: Path,
        limits: SandboxLimits,
        env: Mapping[str, str] | None = None,
        ro_mounts: Sequence[Path] = (),
    ) -> SandboxRunResult:
        ws = check_argv_and_workspace(argv, workspace)
        seccomp_fd = filter_fd() if self.settings.bwrap_seccomp else None
        try:
            return await self._run(argv, ws, limits, env, ro_mounts, seccomp_fd)
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)

    async def _run(
        self,
        argv: list[str],
        ws: Path,
        limits: SandboxLimits,
        env: Mapping[str, str] | None,
        ro_mounts: Sequence[Path],
        seccomp_fd: int | None,
    ) -> SandboxRunResult:
        cmd = self.command(argv, ws, limits, ro_mounts, seccomp_fd)
        cg: RunCgroup | None = None
        if self.settings.bwrap_cgroups:
            try:
                cg = RunCgroup.create(limits)
            except OSError:
                cg = None
        cpu_s = math.ceil(limits.timeout_s * limits.cpus) + 1
        preexec: Callable[[], None] | None = None
        if cg is not None:
            cmd = [*cg.exec_prefix(), *cmd]
        else:
            prefix = rlimit_prefix(limits.memory_mb, limits.pids, cpu_s)
            if prefix is not None:
                cmd = [*prefix, *cmd]
            else:

                def preexec() -> None:
                    apply_rlimits(limits.memory_mb, limits.pids, cpu_s)

        try:
            outcome = await run_process(
                cmd,
                cwd=ws,
                env=base_env(host_python_path(), env),
                timeout_s=limits.timeout_s,
                max_log_bytes=limits.max_log_bytes,
                preexec_fn=preexec,
                kill_extra=cg.kill_all if cg is not None else None,
                pass_fds=(seccomp_fd,) if seccomp_fd is not None else (),
            )
            oom = cg.oom_killed() if cg else False
            pids_hit = cg.pids_limited() if cg else False
            peak = cg.peak_memory_bytes() if cg else None
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxError(f"bwrap sandbox failed to start: {exc}") from exc
        finally:
            if cg is not None:
                cg.kill_all()
                cg.remove()
        if cg is not None and outcome.returncode == JOIN_FAILED and b"cgroup.procs" in outcome.stderr[:2000]:
            raise SandboxError(f"could not enter the run's cgroup: {outcome.stderr[:2000].decode(errors='replace')}")
        if outcome.returncode == 1 and outcome.stderr.startswith(b"bwrap: "):
            # bwrap's own setup failed (bad mount, no user namespaces): the machinery, not the command.
            raise SandboxError(f"bwrap could not build the sandbox: {outcome.stderr.decode(errors='replace')}")
        return SandboxRunResult(
            backend=self.name,
            isolated=True,
            exit_code=shell_status(outcome.returncode),
            duration_s=outcome.duration_s,
            stdout=outcome.stdout,
            stderr=outcome.stderr,
            timed_out=outcome.timed_out,
            oom_killed=oom,
            pids_limited=pids_hit,
            killed_by_signal=signal_from_returncode(outcome.returncode, shell_style=True),
            peak_memory_bytes=peak,
            enforcement=(cg.version if cg is not None else rlimit_enforcement())
            + ("+seccomp" if seccomp_fd is not None else ""),
            truncated=outcome.truncated,
        )


@functools.cache
def _probe() -> tuple[bool, str]:
    exe = shutil.which("bwrap")
    if exe is None:
        return False, f"bwrap not found; {INSTALL_HINT}"
    try:
        r = subprocess.run(
            [exe, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
            capture_output=True,
            timeout=10,
            env={"PATH": "/usr/bin:/bin"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap did not run: {exc}"
    if r.returncode != 0:
        return False, (
            f"bwrap cannot create namespaces here ({r.stderr.decode(errors='replace').strip()}); "
            "unprivileged user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone=1)"
        )
    return True, f"bubblewrap at {exe}"
