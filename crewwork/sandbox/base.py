"""The sandbox interface: limits going in, a typed result coming out, and the errors of the machinery itself.

Every command crewwork runs on behalf of an agent or a validation goes through one `Sandbox.run`. Hitting a
cap (time, memory, processes) is not an error: it is evidence, reported in the result's flags. Only a
failure of the sandbox machinery itself (engine down, image missing, cgroup setup failed) raises.

What a run sees of the host is only what it is given, at paths that say nothing about the host: the workspace at
`/workspace`, each `Mount` at its own `inside` path (a prepared environment at `/crewwork/env`, the setup proxy's
socket at `/crewwork/net`), and on host-filesystem backends the sandbox's own clean interpreter at
`/opt/crewwork/python` (crewwork/sandbox/toolchain.py). Where the worker's data directory, its virtualenv or other
work items' workspaces live is never visible inside. The `local` backend cannot remap anything: it runs on the host
paths themselves (`Sandbox.remaps` is False), which callers learn through `Sandbox.inside`.
"""

from __future__ import annotations

import abc
import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from crewwork.boundary.safefs import chown_tree
from crewwork.config.sandbox import SandboxLimits as SandboxLimits
from crewwork.models import SandboxReport
from crewwork.sandbox.disk import is_full

if TYPE_CHECKING:
    from crewwork.config.sandbox import SandboxSettings


WORKSPACE = "/workspace"
"""Where every isolating backend shows the run's workspace (and its working directory)."""

# Paths inside a sandbox that a Mount may not cover: the system, the workspace, the private scratch space, and the
# sandbox's own interpreter.
RESERVED_INSIDE = ("/", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc", "/proc", "/dev",
                   "/sys", "/tmp", WORKSPACE, "/opt/crewwork/python")  # fmt: skip


@dataclass(frozen=True)
class Mount:
    """A host directory a run sees at `inside` (read-only unless `writable`)."""

    host: Path
    inside: str
    """Absolute, normalised path inside the sandbox; it says nothing about where `host` is."""
    writable: bool = False

    def __post_init__(self) -> None:
        if any(c in self.inside for c in _ODD_INSIDE) or any(ord(c) < 32 or ord(c) == 127 for c in self.inside):
            # `:` and `,` are Docker's volume and mount-option syntax; control characters name nothing real.
            raise ValueError(f"mount point {self.inside!r} may not contain ':', ',' or control characters")
        if not self.inside.startswith("/") or os.path.normpath(self.inside) != self.inside:
            raise ValueError(f"mount point {self.inside!r} must be an absolute, normalised path")
        for reserved in RESERVED_INSIDE:
            if self.inside == reserved or (reserved != "/" and self.inside.startswith(reserved + "/")):
                raise ValueError(f"mount point {self.inside} lies in {reserved}, which the sandbox provides itself")
            if reserved.startswith(self.inside + "/"):
                # Covering it from above hides it just the same (a mount at /opt hides /opt/crewwork/python).
                raise ValueError(f"mount point {self.inside} would cover {reserved}, which the sandbox provides itself")


_ODD_INSIDE = (":", ",")


def check_mounts(mounts: Sequence[Mount]) -> list[tuple[str, Mount]]:
    """(resolved host path, mount) of each mount; refuses a missing source, two mounts at one place, or one inside
    another (which of the two a run sees would depend on their order)."""
    seen: list[str] = []
    out = []
    for m in mounts:
        host = os.path.realpath(m.host)
        if not os.path.exists(host):
            raise ValueError(f"mount source {m.host} does not exist")
        for other in seen:
            if m.inside == other:
                raise ValueError(f"two mounts at {m.inside}")
            if m.inside.startswith(other + "/") or other.startswith(m.inside + "/"):
                raise ValueError(f"mounts at {m.inside} and {other}: one lies inside the other")
        seen.append(m.inside)
        out.append((host, m))
    return out


@dataclass
class SandboxRunResult:
    """What one sandboxed command did, measured by the platform (never by the command itself)."""

    backend: str
    isolated: bool
    exit_code: int | None
    duration_s: float
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    oom_killed: bool = False
    pids_limited: bool = False
    disk_limited: bool = False
    """The workspace (or the private /tmp) filled up: the disk cap was hit."""
    command_not_found: bool = False
    """The program in argv[0] does not exist or is not executable inside the sandbox (exit 127 or 126)."""
    killed_by_signal: int | None = None
    peak_memory_bytes: int | None = None
    enforcement: str = ""
    truncated: bool = False
    stopped: bool = False
    """The caller stopped the run (its `stop` event) before it ended by itself; the cap flags still say what it hit."""

    @property
    def ok(self) -> bool:
        """The command exited 0 on its own: no cap was hit and no signal killed it."""
        return (
            self.exit_code == 0
            and not self.timed_out
            and not self.oom_killed
            and not self.pids_limited
            and not self.disk_limited
            and not self.command_not_found
            and self.killed_by_signal is None
        )

    @property
    def cause(self) -> str:
        """One word for why the run ended, for logs and diagnostics packets."""
        if self.timed_out:
            return "timeout"
        if self.oom_killed:
            return "oom"
        if self.pids_limited:
            return "pids"
        if self.disk_limited:
            return "disk"
        if self.command_not_found:
            return "command_not_found"
        if self.stopped:
            return "stopped"
        if self.killed_by_signal is not None:
            return f"signal-{self.killed_by_signal}"
        return "exit" if self.exit_code is not None else "unknown"

    def report(self, tail_bytes: int = 8192) -> SandboxReport:
        return SandboxReport(
            backend=self.backend,
            isolated=self.isolated,
            exit_code=self.exit_code,
            duration_s=round(self.duration_s, 4),
            timed_out=self.timed_out,
            oom_killed=self.oom_killed,
            pids_limited=self.pids_limited,
            disk_limited=self.disk_limited,
            command_not_found=self.command_not_found,
            killed_by_signal=self.killed_by_signal,
            peak_memory_bytes=self.peak_memory_bytes,
            enforcement=self.enforcement,
            stdout_tail=_tail(self.stdout, tail_bytes),
            stderr_tail=_tail(self.stderr, tail_bytes),
        )

    def to_dict(self, tail_bytes: int = 8192) -> dict[str, object]:
        """A JSON-able summary (tails only), as `crewwork sandbox run --json` prints it."""
        data: dict[str, object] = self.report(tail_bytes).model_dump()
        data["truncated"] = self.truncated
        data["ok"] = self.ok
        data["cause"] = self.cause
        return data


def _tail(data: bytes, n: int) -> str:
    if n <= 0:
        return ""
    # Cutting may split a UTF-8 sequence; `replace` keeps the tail printable instead of failing.
    return data[-n:].decode("utf-8", errors="replace")


class SandboxError(RuntimeError):
    """The sandbox machinery itself failed (not the command). Retryable: another attempt may succeed."""


class SandboxUnavailable(SandboxError):
    """The backend cannot run here (not installed, engine down, image missing). The text says how to fix."""


class Sandbox(abc.ABC):
    """One isolation backend. Subclasses are small: build the boundary, run, translate counters into flags."""

    name: ClassVar[str]
    isolating: ClassVar[bool]
    remaps: ClassVar[bool] = True
    """The workspace appears at WORKSPACE and each mount at its `inside` path. False (only `local`): on the host's
    own paths."""

    def inside(self, mount: Mount) -> str:
        """Where a run of this backend sees `mount`: what to put in the run's environment and arguments."""
        return mount.inside if self.remaps else str(Path(mount.host).resolve())

    def runner(self) -> dict[str, str]:
        """What runs commands in this backend (its name; its interpreter or image), for keys of what runs built."""
        return {"backend": self.name}

    def workspace_inside(self, workspace: Path) -> str:
        """Where a run of this backend sees its workspace (its working directory)."""
        return WORKSPACE if self.remaps else str(Path(workspace).resolve())

    def __init__(self, settings: SandboxSettings | None = None) -> None:  # noqa: B027  # a default, not abstract
        """Every backend is built from the operator's sandbox settings (its part: `settings.backend_config`)."""

    @classmethod
    @abc.abstractmethod
    def available(cls, settings: SandboxSettings | None = None) -> tuple[bool, str]:
        """Whether this backend can run on this host under `settings` (default: from the environment), and a
        human reason (or how to install it)."""

    @abc.abstractmethod
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
        """Run `argv` with cwd = `workspace` (seen at `workspace_inside`; writable, like a private /tmp and the
        writable `mounts`), and nothing else of the host but the system directories.

        The environment inside is exactly PATH, LANG, HOME plus `env`; the caller's own environment never
        leaks in. Caps being hit show up as flags in the result. Cancelling the awaiting task kills
        everything the run started. Setting `stop` kills it too, but the run still returns its result (`stopped`,
        with every cap it hit flagged): how a long-running command (a preview's app) ends with its evidence.
        """


# What programs print when a write failed for want of space (the private /tmp has no counter we can read
# after the run; the workspace's own file system is checked directly).
DISK_FULL_MARKERS = (b"No space left on device", b"[Errno 28]", b"ENOSPC", b"Disk quota exceeded")


def disk_limited(ws: Path, exit_code: int | None, stdout: bytes, stderr: bytes) -> bool:
    """Whether a run hit the disk cap: its workspace is full, or it failed saying it ran out of space."""
    if is_full(ws):
        return True
    if exit_code in (0, None):
        return False
    return any(m in stderr[-65536:] or m in stdout[-65536:] for m in DISK_FULL_MARKERS)


def hand_over(ws: Path, owner: tuple[int, int] | None, mounts: Sequence[Mount] = ()) -> None:
    """Make the sandbox user own a workspace (and the writable mounts) it is about to run in (links are never
    followed)."""
    if owner is None:
        return
    for path in [ws, *(Path(m.host) for m in mounts if m.writable)]:
        st = path.stat()
        if (st.st_uid, st.st_gid) != owner:
            chown_tree(path, owner)


def base_env(path: str, env: Mapping[str, str] | None) -> dict[str, str]:
    """The explicit environment inside a sandbox. Nothing comes from the worker, so its secrets stay out."""
    out = {"PATH": path, "LANG": "C.UTF-8", "HOME": "/tmp"}
    if env:
        for key, value in env.items():
            if not key or "=" in key or "\x00" in key or "\x00" in value:
                raise ValueError(f"invalid environment variable name or value for {key!r}")
            out[key] = value
    return out


def check_argv_and_workspace(argv: Sequence[str], workspace: Path) -> Path:
    """Reject what no backend can run, naming the problem. Returns the absolute workspace."""
    if not argv or not argv[0]:
        raise ValueError("sandbox command is empty: give at least a program name")
    if any("\x00" in a for a in argv):
        raise ValueError("sandbox command arguments must not contain NUL bytes")
    ws = Path(workspace).resolve()
    if not ws.is_dir():
        raise ValueError(f"sandbox workspace {ws} does not exist or is not a directory")
    if ws == Path("/"):
        raise ValueError("the host root cannot be a sandbox workspace")
    return ws
