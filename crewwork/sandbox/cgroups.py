"""Per-run cgroups (v1 or v2) for daemonless backends: hard caps plus the counters that prove a cap was hit.

A run gets its own leaf group, nested under the cgroup this worker already lives in, so whatever limits the
operator put on the worker still bound the sandbox. The child joins the group between fork and exec, so
every descendant is counted from its first instruction.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from crewwork.sandbox.base import SandboxLimits

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
# Exit status of the join prefix when it could not enter the group (a machinery failure, not the command's).
JOIN_FAILED = 125
JOIN_SCRIPT = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo 0 > "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"'
_V1_CONTROLLERS = ("memory", "pids", "cpu")


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _read_kv(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                out[parts[0]] = int(parts[1])
    except OSError:
        pass
    return out


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _own_paths() -> dict[str, str]:
    """controller (or "" for the v2 unified hierarchy) -> this process's cgroup path."""
    out: dict[str, str] = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path
    except (OSError, ValueError):
        pass
    return out


def cgroup_version() -> str | None:
    """`cgroup-v2` on a pure unified host, `cgroup-v1` when memory, pids and cpu v1 are mounted, else None."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return "cgroup-v2"
    if all((CGROUP_ROOT / c / "cgroup.procs").exists() for c in _V1_CONTROLLERS):
        return "cgroup-v1"
    return None


@dataclass
class RunCgroup:
    """The leaf cgroup(s) of one run. `procs_files` are written by the child before exec."""

    version: str
    dirs: dict[str, Path]
    procs_files: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, limits: SandboxLimits) -> RunCgroup:
        """Make and configure the leaf group. Raises OSError when cgroups are not usable here."""
        version = cgroup_version()
        if version == "cgroup-v1":
            return cls._create_v1(limits)
        if version == "cgroup-v2":
            return cls._create_v2(limits)
        raise OSError("no usable cgroup hierarchy (need v2, or v1 memory+pids+cpu) under /sys/fs/cgroup")

    @classmethod
    def _create_v1(cls, limits: SandboxLimits) -> RunCgroup:
        own = _own_paths()
        _sweep_stale([CGROUP_ROOT / c / own.get(c, "/").lstrip("/") for c in _V1_CONTROLLERS], "crewwork-*")
        name = f"crewwork-{uuid.uuid4().hex[:12]}"
        dirs: dict[str, Path] = {}
        cg = cls("cgroup-v1", dirs)
        try:
            for c in _V1_CONTROLLERS:
                parent = CGROUP_ROOT / c / own.get(c, "/").lstrip("/")
                d = parent / name
                d.mkdir()
                dirs[c] = d
            mem = limits.memory_mb * 1024 * 1024
            _write(dirs["memory"] / "memory.limit_in_bytes", str(mem))
            memsw = dirs["memory"] / "memory.memsw.limit_in_bytes"
            # Swap accounting may be off in the kernel; then memory.limit alone still caps RAM.
            if memsw.exists():
                _write(memsw, str(mem))
            _write(dirs["pids"] / "pids.max", str(limits.pids))
            _write(dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(dirs["cpu"] / "cpu.cfs_quota_us", str(max(1000, int(limits.cpus * CPU_PERIOD_US))))
            cg.procs_files = [str(d / "cgroup.procs") for d in dirs.values()]
        except OSError:
            cg.remove()
            raise
        return cg

    @classmethod
    def _create_v2(cls, limits: SandboxLimits) -> RunCgroup:
        own = _own_paths().get("", "/")
        # A v2 group that holds processes cannot delegate controllers to children, so try a sibling
        # namespace under our parent first, then the root.
        candidates = [CGROUP_ROOT]
        if own.strip("/"):
            candidates.insert(0, (CGROUP_ROOT / own.lstrip("/")).parent)
        last: OSError | None = None
        for base in candidates:
            parent = base / "crewwork"
            try:
                parent.mkdir(exist_ok=True)
                for ctl in ("+memory", "+pids", "+cpu"):
                    with contextlib.suppress(OSError):
                        _write(base / "cgroup.subtree_control", ctl)
                    _write(parent / "cgroup.subtree_control", ctl)
                _sweep_stale([parent], "*")
                d = parent / uuid.uuid4().hex[:12]
                d.mkdir()
                cg = cls("cgroup-v2", {"unified": d})
                try:
                    _write(d / "memory.max", str(limits.memory_mb * 1024 * 1024))
                    if (d / "memory.swap.max").exists():
                        _write(d / "memory.swap.max", "0")
                    _write(d / "pids.max", str(limits.pids))
                    _write(d / "cpu.max", f"{max(1000, int(limits.cpus * CPU_PERIOD_US))} {CPU_PERIOD_US}")
                except OSError:
                    cg.remove()
                    raise
                cg.procs_files = [str(d / "cgroup.procs")]
                return cg
            except OSError as exc:
                last = exc
        assert last is not None
        raise last

    def exec_prefix(self) -> list[str]:
        """argv prefix that joins the group, then execs the rest: cheaper than a preexec_fn, which forces a
        full fork() of the (large) worker process instead of vfork()."""
        return ["/bin/sh", "-c", JOIN_SCRIPT, "cgroup-join", str(len(self.procs_files)), *self.procs_files]

    # ------------------------------------------------------------------ evidence

    def oom_killed(self) -> bool:
        if self.version == "cgroup-v1":
            return _read_kv(self.dirs["memory"] / "memory.oom_control").get("oom_kill", 0) > 0
        return _read_kv(self.dirs["unified"] / "memory.events").get("oom_kill", 0) > 0

    def pids_limited(self) -> bool:
        d = self.dirs["pids"] if self.version == "cgroup-v1" else self.dirs["unified"]
        return _read_kv(d / "pids.events").get("max", 0) > 0

    def peak_memory_bytes(self) -> int | None:
        if self.version == "cgroup-v1":
            return _read_int(self.dirs["memory"] / "memory.max_usage_in_bytes")
        return _read_int(self.dirs["unified"] / "memory.peak")

    # ------------------------------------------------------------------ teardown

    def _pids(self) -> list[int]:
        d = self.dirs.get("pids") or self.dirs.get("unified") or next(iter(self.dirs.values()), None)
        if d is None:
            return []
        try:
            return [int(p) for p in (d / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill_all(self) -> None:
        """SIGKILL everything left in the group, including processes that escaped the process group."""
        unified = self.dirs.get("unified")
        if unified is not None and (unified / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(unified / "cgroup.kill", "1")
        for _ in range(100):
            pids = self._pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        for d in self.dirs.values():
            delay = 0.001
            for _ in range(20):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    # Killed processes leave the group only once reaped; give the kernel a moment.
                    time.sleep(delay)
                    delay = min(delay * 2, 0.1)


_last_sweep = 0.0
SWEEP_EVERY_S = 600.0
# A group younger than this may have been created by another worker that has not moved its child in yet.
STALE_AFTER_S = 120.0


def _sweep_stale(parents: list[Path], pattern: str) -> None:
    """Remove empty run groups left by workers that were killed before their cleanup ran.

    rmdir refuses a group that still has processes, so only abandoned, empty groups go.
    """
    global _last_sweep
    now = time.time()
    if now - _last_sweep < SWEEP_EVERY_S:
        return
    _last_sweep = now
    for parent in parents:
        with contextlib.suppress(OSError):
            for d in parent.glob(pattern):
                with contextlib.suppress(OSError):
                    if d.is_dir() and now - d.stat().st_mtime > STALE_AFTER_S and not (d / "cgroup.procs").read_text():
                        d.rmdir()
