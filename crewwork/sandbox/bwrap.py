"""The `bwrap` backend: bubblewrap namespaces plus a per-run cgroup (rlimits where cgroups are unavailable).

No daemon, ~10-30 ms to start. The sandbox gets fresh user, pid, net, ipc, uts, cgroup and mount namespaces, a
read-only root that holds only the host's system directories (`/usr` and the `/lib*`, `/bin` links), an
explicit allowlist of `/etc` files (never the whole directory: no shadow files, no SSH host keys, no engine
keys) plus a synthetic passwd/group/hosts, a private sized `/tmp` and `/dev/shm`, the workspace at `/workspace`
as its single writable bind (with any writable `Mount`), and the sandbox's own Python (crewwork/sandbox/toolchain.py)
at `/opt/crewwork/python`, first on PATH. The worker's virtualenv is never mounted; the base interpreter it was made
from is, at its own path, with its global site-packages hidden under an empty tmpfs.

The sandbox never runs as host root. When the worker is root, each run first enters a private mount namespace
where the bind sources are bind-mounted onto a fresh staging tmpfs (so no parent directory has to be opened to
the sandbox user), then drops to the configured unprivileged uid (`CREWWORK_SANDBOX_UID`, default 65532) with
`setpriv` (no capabilities, empty bounding set, no_new_privs) and only then starts bwrap, which maps the
sandbox's uid 65534 to that host uid. Files the sandbox creates belong to that uid; root-owned host files are
as unreadable to it as to any other unprivileged user. It shares the host kernel, so a kernel exploit escapes
it; use gVisor for untrusted code that may try one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import math
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from crewwork.config.sandbox import BwrapConfig, SandboxSettings
from crewwork.sandbox._proc import (
    apply_rlimits,
    rlimit_enforcement,
    rlimit_prefix,
    run_process,
    shell_status,
    signal_from_returncode,
)
from crewwork.sandbox.base import (
    WORKSPACE,
    Mount,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxRunResult,
    SandboxUnavailable,
    base_env,
    check_argv_and_workspace,
    check_mounts,
    disk_limited,
    hand_over,
)
from crewwork.sandbox.cgroups import JOIN_FAILED, RunCgroup
from crewwork.sandbox.seccomp import filter_fd
from crewwork.sandbox.toolchain import (
    TOOLCHAIN_INSIDE,
    Toolchain,
    base_prefixes,
    base_site_packages,
    ensure_toolchain,
    toolchain_fingerprint,
)

INSTALL_HINT = "install bubblewrap: `apt-get install -y bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`"
NOBODY = 65534
# System directories the sandbox sees read-only. Anything else on the host (homes, /run with the Docker and
# PostgreSQL sockets, /var/lib service data, /opt, /etc) is simply absent.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# The only host /etc entries a sandbox sees (if they exist): what the dynamic loader, Python, TLS and name
# lookups read. Each is world-readable on a normal host; nothing secret (shadow, ssh, docker, ssl/private).
ETC_ALLOWLIST = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/alternatives",
    "/etc/ssl/certs",
    "/etc/ca-certificates.conf",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/mime.types",
    "/etc/protocols",
    "/etc/services",
    "/etc/os-release",
    "/etc/debian_version",
    "/etc/python3",
    "/etc/python3.*",
)
# Written by crewwork itself: the sandbox learns nothing about the host's accounts or network names.
SYNTHETIC_ETC = {
    "/etc/passwd": b"root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/tmp:/usr/sbin/nologin\n",
    "/etc/group": b"root:x:0:\nnogroup:x:65534:\n",
    "/etc/hosts": b"127.0.0.1 localhost sandbox\n::1 localhost\n",
    "/etc/hostname": b"sandbox\n",
    "/etc/resolv.conf": b"",
}
# Runs as root in the run's private mount namespace: a fresh tmpfs over the staging directory, each bind source
# bind-mounted onto it (a directory or a file), then exec the rest (setpriv ... bwrap ...).
STAGE_SCRIPT = r"""set -e
stage=$1; n=$2; shift 2
mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev crewwork-stage "$stage"
i=0
while [ "$i" -lt "$n" ]; do
    if [ -d "$1" ]; then mkdir "$stage/$i"; else : > "$stage/$i"; fi
    mount --bind "$1" "$stage/$i"
    i=$((i+1)); shift
done
exec "$@"
"""


def _etc_entries() -> list[tuple[str, str | None]]:
    """(path, symlink target or None) of the allowlisted /etc entries present on this host."""
    out: list[tuple[str, str | None]] = []
    for pattern in ETC_ALLOWLIST:
        for path in sorted(glob.glob(pattern)) if "*" in pattern else [pattern]:
            if path in SYNTHETIC_ETC:
                continue
            if os.path.islink(path):
                out.append((path, os.readlink(path)))
            elif os.path.exists(path):
                out.append((path, None))
    return out


@dataclass
class _Bind:
    src: str
    dest: str
    writable: bool


def _synthetic_fds() -> list[tuple[int, str]]:
    fds = []
    for dest, data in SYNTHETIC_ETC.items():
        fd = os.memfd_create("crewwork-etc", 0)
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        fds.append((fd, dest))
    return fds


class BwrapSandbox(Sandbox):
    """Namespaces via bubblewrap; memory/pids/cpu via cgroups (v1 or v2) or rlimits as a fallback."""

    name: ClassVar[str] = "bwrap"
    isolating: ClassVar[bool] = True

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        config = self.settings.backend_config(self.name)
        assert isinstance(config, BwrapConfig)
        self.config = config
        self.bwrap = shutil.which("bwrap")
        if self.bwrap is None:
            raise SandboxUnavailable(f"bubblewrap (bwrap) is not on PATH; {INSTALL_HINT}")
        self._toolchain: Toolchain | None = None

    def runner(self) -> dict[str, str]:
        return {"backend": self.name, "python": toolchain_fingerprint()}

    async def toolchain(self) -> Toolchain:
        if self._toolchain is None:
            self._toolchain = await asyncio.to_thread(ensure_toolchain, self.settings.toolchain_root())
        return self._toolchain

    @classmethod
    def available(cls, settings: SandboxSettings | None = None) -> tuple[bool, str]:
        return _probe((settings or SandboxSettings()).owner())

    def command(
        self,
        argv: Sequence[str],
        ws: Path,
        limits: SandboxLimits,
        mounts: Sequence[Mount],
        toolchain: Toolchain,
        seccomp_fd: int | None = None,
        data_fds: Sequence[tuple[int, str]] = (),
        status_fd: int | None = None,
    ) -> list[str]:
        assert self.bwrap is not None
        owner = self.settings.owner()
        args = [self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--new-session"]
        args += ["--die-with-parent", "--hostname", "sandbox", "--uid", str(NOBODY), "--gid", str(NOBODY)]
        if status_fd is not None:
            # bwrap's own account of the run, on a pipe the sandbox never sees (crewwork.sandbox.bwrap.RunStatus).
            args += ["--json-status-fd", str(status_fd)]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        for d in SYSTEM_DIRS:
            if os.path.islink(d):
                args += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                args += ["--ro-bind", d, d]
        args += ["--dir", "/etc"]
        for path, target in _etc_entries():
            args += ["--symlink", target, path] if target is not None else ["--ro-bind", path, path]
        for fd, dest in data_fds:
            args += ["--perms", "0444", "--ro-bind-data", str(fd), dest]
        args += ["--dev", "/dev", "--proc", "/proc"]
        scratch = str(limits.tmpfs_mb * 1024 * 1024)
        args += ["--size", scratch, "--tmpfs", "/tmp", "--size", scratch, "--tmpfs", "/dev/shm"]
        # After the private /tmp, so an interpreter that lives under /tmp (a CI checkout, say) stays visible.
        binds = [_Bind(d, d, False) for d in base_prefixes()]
        binds.append(_Bind(str(toolchain.root), TOOLCHAIN_INSIDE, False))
        for host, m in check_mounts(mounts):
            binds.append(_Bind(host, m.inside, m.writable))
        binds.append(_Bind(str(ws), WORKSPACE, True))
        prefix: list[str] = []
        if owner is not None:
            stage = str(self.config.stage_dir)
            sources = [b.src for b in binds]
            for i, b in enumerate(binds):
                b.src = f"{stage}/{i}"
            prefix = [_tool("unshare"), "--mount", "--propagation", "private", "--", "/bin/sh", "-c", STAGE_SCRIPT]
            prefix += ["crewwork-stage", stage, str(len(sources)), *sources]
            prefix += [_tool("setpriv"), f"--reuid={owner[0]}", f"--regid={owner[1]}", "--clear-groups"]
            prefix += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        for b in binds:
            args += ["--bind" if b.writable else "--ro-bind", b.src, b.dest]
        # Whatever was installed into the base interpreter globally stays out of sight (not only off sys.path).
        for site in base_site_packages():
            args += ["--size", "4096", "--perms", "0555", "--tmpfs", site, "--remount-ro", site]
        args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKSPACE, "--", *argv]
        return prefix + args

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
        toolchain = await self.toolchain()
        owner = self.settings.owner()
        hand_over(ws, owner, mounts)
        if owner is not None:
            self.config.stage_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        seccomp_fd = filter_fd() if self.config.seccomp else None
        data_fds = _synthetic_fds()
        try:
            return await self._run(argv, ws, limits, env, mounts, toolchain, seccomp_fd, data_fds, stop)
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
            for fd, _ in data_fds:
                os.close(fd)

    async def _run(
        self,
        argv: list[str],
        ws: Path,
        limits: SandboxLimits,
        env: Mapping[str, str] | None,
        mounts: Sequence[Mount],
        toolchain: Toolchain,
        seccomp_fd: int | None,
        data_fds: Sequence[tuple[int, str]],
        stop: asyncio.Event | None = None,
    ) -> SandboxRunResult:
        status_r, status_w = os.pipe()
        try:
            cmd = self.command(argv, ws, limits, mounts, toolchain, seccomp_fd, data_fds, status_w)
            return await self._run_command(
                cmd, ws, limits, env, toolchain, seccomp_fd, data_fds, status_r, status_w, stop
            )
        finally:
            for fd in (status_r, status_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    async def _run_command(
        self,
        cmd: list[str],
        ws: Path,
        limits: SandboxLimits,
        env: Mapping[str, str] | None,
        toolchain: Toolchain,
        seccomp_fd: int | None,
        data_fds: Sequence[tuple[int, str]],
        status_r: int,
        status_w: int,
        stop: asyncio.Event | None = None,
    ) -> SandboxRunResult:
        """Run the built command line; `status_w` is bwrap's --json-status-fd, read back from `status_r`."""
        cg: RunCgroup | None = None
        if self.config.cgroups:
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
                env=base_env(toolchain.path(TOOLCHAIN_INSIDE), env),
                timeout_s=limits.timeout_s,
                max_log_bytes=limits.max_log_bytes,
                preexec_fn=preexec,
                kill_extra=cg.kill_all if cg is not None else None,
                pass_fds=((seccomp_fd,) if seccomp_fd is not None else ())
                + tuple(fd for fd, _ in data_fds)
                + (status_w,),
                stop=stop,
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
        # bwrap has exited, so its records are all in the pipe (our write end stays open: read what is there).
        status = RunStatus.read(status_r)
        # What the machinery says about itself is believed only when bwrap's status shows that the command never
        # ran: once it has run, its output is its own, and a program that writes `bwrap: execvp …`, `mount: …` or
        # `cgroup.procs` and exits 1 is a failed run, not a missing command nor a broken sandbox.
        if (
            not status.started
            and cg is not None
            and outcome.returncode == JOIN_FAILED
            and b"cgroup.procs" in outcome.stderr[:2000]
        ):
            raise SandboxError(f"could not enter the run's cgroup: {outcome.stderr[:2000].decode(errors='replace')}")
        bwrap_failed = not status.ran and outcome.returncode == 1 and outcome.stderr.startswith(b"bwrap: ")
        not_found = bwrap_failed and status.started and outcome.stderr.startswith(b"bwrap: execvp ")
        if bwrap_failed and not not_found:
            # bwrap's own setup failed (bad mount, no user namespaces): the machinery, not the command.
            raise SandboxError(f"bwrap could not build the sandbox: {outcome.stderr.decode(errors='replace')}")
        if not status.started and owner_stage_failed(outcome.returncode, outcome.stderr):
            raise SandboxError(f"bwrap staging failed: {outcome.stderr[:2000].decode(errors='replace')}")
        exit_code = shell_status(outcome.returncode)
        if not_found:
            # The program does not exist (127) or is not executable (126) inside: the submission's problem.
            exit_code = 126 if b"Permission denied" in outcome.stderr[:4000] else 127
        return SandboxRunResult(
            backend=self.name,
            isolated=True,
            exit_code=exit_code,
            duration_s=outcome.duration_s,
            stdout=outcome.stdout,
            stderr=outcome.stderr,
            timed_out=outcome.timed_out,
            stopped=outcome.stopped,
            oom_killed=oom,
            pids_limited=pids_hit,
            disk_limited=not not_found and disk_limited(ws, exit_code, outcome.stdout, outcome.stderr),
            command_not_found=not_found,
            killed_by_signal=None if not_found else signal_from_returncode(outcome.returncode, shell_style=True),
            peak_memory_bytes=peak,
            enforcement=(cg.version if cg is not None else rlimit_enforcement())
            + ("+seccomp" if seccomp_fd is not None else "")
            + _uid_tag(self.settings.owner()),
            truncated=outcome.truncated,
        )


def _uid_tag(owner: tuple[int, int] | None) -> str:
    return f"+uid{owner[0]}" if owner is not None else f"+uid{os.geteuid()}"


def _tool(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin:/bin") or name


@dataclass(frozen=True)
class RunStatus:
    """bwrap's `--json-status-fd` records of one run: `child-pid` once it has made the sandbox's process (so
    everything before it, staging and the cgroup, worked), `exit-code` once that process has run and exited. bwrap
    writes them from outside the sandbox, on a pipe the sandboxed program does not inherit, so nothing the program
    prints or does can forge or remove them; a program bwrap could not exec has a `child-pid` and no `exit-code`."""

    started: bool
    ran: bool

    @classmethod
    def read(cls, fd: int) -> RunStatus:
        os.set_blocking(fd, False)
        data = b""
        with contextlib.suppress(OSError):  # BlockingIOError: all there is has been read
            while len(data) < 65536 and (chunk := os.read(fd, 4096)):
                data += chunk
        return cls(started=b'"child-pid"' in data, ran=b'"exit-code"' in data)


def owner_stage_failed(returncode: int | None, stderr: bytes) -> bool:
    """The root-side staging (unshare, mount, setpriv) failed before bwrap started."""
    head = stderr[:2000]
    return returncode not in (0, None) and (
        head.startswith((b"unshare: ", b"setpriv: ", b"mount: ")) or b"crewwork-stage: " in head
    )


@functools.cache
def _probe(owner: tuple[int, int] | None) -> tuple[bool, str]:
    exe = shutil.which("bwrap")
    if exe is None:
        return False, f"bwrap not found; {INSTALL_HINT}"
    cmd = [exe, "--unshare-all", "--unshare-user", "--die-with-parent", "--ro-bind", "/", "/", "true"]
    if owner is not None:
        for tool in ("setpriv", "unshare"):
            if shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin") is None:
                return False, f"{tool} (util-linux) is needed to run bwrap as the unprivileged sandbox user"
        cmd = [_tool("setpriv"), f"--reuid={owner[0]}", f"--regid={owner[1]}", "--clear-groups", "--", *cmd]
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=10, env={"PATH": "/usr/bin:/bin"}, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap did not run: {exc}"
    if r.returncode != 0:
        return False, (
            f"bwrap cannot create namespaces as uid {owner[0] if owner else os.geteuid()} here "
            f"({r.stderr.decode(errors='replace').strip()}); unprivileged user namespaces may be disabled "
            "(sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone, or an AppArmor userns restriction)"
        )
    return True, f"bubblewrap at {exe}" + (f", as uid {owner[0]}" if owner else "")
