"""The caps of one sandboxed run, as every backend receives them (crewwork.sandbox.config resolves them from the
operator's settings and a work item's request)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxLimits:
    """Hard caps for one sandboxed run. Every backend enforces all of them or says which it could not."""

    memory_mb: int = 1024
    """Memory (RSS + page cache charged to the run) in MiB; swap is capped to the same value (no swapping)."""
    pids: int = 256
    """Processes and threads alive at once inside the sandbox (a fork bomb stops here)."""
    cpus: float = 1.0
    """CPU bandwidth in cores (1.5 = one and a half cores' worth of time per period)."""
    timeout_s: float = 600.0
    """Wall-clock seconds from start to exit; the whole process tree is killed when it runs out."""
    tmpfs_mb: int = 256
    """Size in MiB of the private, memory-backed /tmp (the only writable place besides the workspace)."""
    output_tail_bytes: int = 8192
    """Bytes of the end of stdout and of stderr kept in reports (the full logs become artifacts)."""
    max_log_bytes: int = 8 * 1024 * 1024
    """Bytes of stdout and of stderr kept at most; output beyond is dropped and `truncated` is set."""
    disk_mb: int = 4096
    """Size in MiB of each workspace's own file system (its disk cap; see crewwork.sandbox.disk)."""

    def __post_init__(self) -> None:
        for name in ("memory_mb", "pids", "cpus", "timeout_s", "tmpfs_mb", "max_log_bytes", "disk_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox limit {name} must be positive, got {getattr(self, name)!r}")
        if self.output_tail_bytes < 0:
            raise ValueError("sandbox limit output_tail_bytes must not be negative")
