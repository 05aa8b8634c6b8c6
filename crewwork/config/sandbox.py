"""Operator configuration of sandboxes, the caps of one run every backend receives (`SandboxLimits`), and how a
work item's requested limits are checked against the operator's maximums. Nothing here runs a sandbox: the API reads
these settings (submissions are checked against the maximums) without loading any backend (crewwork/sandbox/).

Environment variables use the prefix CREWWORK_SANDBOX_ (e.g. CREWWORK_SANDBOX_BACKEND=gvisor,
CREWWORK_SANDBOX_MAX_MEMORY_MB=4096). A work item may ask for different limits, never above the maximums.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from crewwork.models import SandboxSpec

DEFAULT_IMAGE = "crewwork-sandbox:latest"


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
    """Bytes of stdout and of stderr kept at most: beyond it, their first and last halves (the end holds a test run's
    summary), and `truncated` is set."""
    disk_mb: int = 4096
    """Size in MiB of each workspace's own file system (its disk cap; see crewwork.sandbox.disk)."""

    def __post_init__(self) -> None:
        for name in ("memory_mb", "pids", "cpus", "timeout_s", "tmpfs_mb", "max_log_bytes", "disk_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox limit {name} must be positive, got {getattr(self, name)!r}")
        if self.output_tail_bytes < 0:
            raise ValueError("sandbox limit output_tail_bytes must not be negative")


class DockerConfig(BaseModel):
    """What the `docker` and `gvisor` backends need (gvisor forces the runsc runtime)."""

    model_config = ConfigDict(frozen=True)
    type: Literal["docker", "gvisor"]
    image: str
    runtime: str | None
    base_url: str | None


class BwrapConfig(BaseModel):
    """What the `bwrap` backend needs."""

    model_config = ConfigDict(frozen=True)
    type: Literal["bwrap"]
    cgroups: bool
    seccomp: bool
    stage_dir: Path


class LocalConfig(BaseModel):
    """The `local` backend has nothing to configure (and isolates nothing)."""

    model_config = ConfigDict(frozen=True)
    type: Literal["local"]


BackendConfig = Annotated[DockerConfig | BwrapConfig | LocalConfig, Field(discriminator="type")]
_BACKEND_CONFIG: TypeAdapter[DockerConfig | BwrapConfig | LocalConfig] = TypeAdapter(BackendConfig)


class SandboxSettings(BaseSettings):
    """Which backend runs commands, with which image, under which default and maximum caps."""

    model_config = SettingsConfigDict(env_prefix="CREWWORK_SANDBOX_", extra="ignore")

    backend: str | None = Field(
        default=None,
        description="Default backend (gvisor, docker, bwrap, local). None: the best isolating one available.",
    )
    docker_image: str = Field(
        default=DEFAULT_IMAGE,
        description="Image the docker/gvisor backends run. Build the default with "
        "`crewwork sandbox build-image`, or name any local image that has python (e.g. python:3.11-slim).",
    )
    docker_runtime: str | None = Field(
        default=None,
        description="OCI runtime for the `docker` backend: None for the engine default (runc), or runsc.",
    )
    docker_base_url: str | None = Field(
        default=None,
        description="Docker engine address (unix:///var/run/docker.sock). None: DOCKER_HOST or the default.",
    )
    bwrap_cgroups: bool = Field(
        default=True,
        description="Give each bwrap run its own cgroup; when false or unavailable, rlimits are used.",
    )

    bwrap_seccomp: bool = Field(
        default=True,
        description="Install crewwork's seccomp filter in bwrap runs (no nested namespaces, no keyctl/bpf/...).",
    )

    uid: int = Field(
        default=65532,
        gt=0,
        description="Host uid that owns workspaces and runs every sandboxed command when the worker is root "
        "(never 0). Pick one no other account uses.",
    )
    gid: int = Field(default=65532, gt=0, description="Host gid of the sandbox user (never 0).")
    workspace_disk: Literal["auto", "loop", "none"] = Field(
        default="auto",
        description="Disk cap of workspaces: `loop` (each workspace is its own ext4 image; needs root), `none` "
        "(no cap; results say workspace_disk none), `auto` (loop where possible, else none).",
    )
    disk_mb: int = Field(default=4096, gt=0, description="Default size of a workspace's disk, in MiB.")
    max_disk_mb: int = Field(default=65536, gt=0, description="Largest workspace disk a work item may request.")
    prepare_disk_mb: int = Field(
        default=8192,
        gt=0,
        description="Disk cap of one prepared environment (a repository's venv plus what its setup commands "
        "write), in MiB: each entry is its own ext4 image while the workspace disk cap is on; off with it.",
    )
    toolchain_dir: Path | None = Field(
        default=None,
        description="Where the bwrap and local backends keep the sandbox's own Python (a clean virtualenv with "
        "pytest, pip, setuptools and wheel, built once per host from installed files). None: "
        "$XDG_CACHE_HOME/crewwork/sandbox-python (default ~/.cache/...). Must belong to the worker's user.",
    )
    bwrap_stage_dir: Path = Field(
        default=Path("/run/crewwork/bwrap-stage"),
        description="Empty directory over which each bwrap run (as root) mounts its private staging tmpfs, so "
        "the unprivileged sandbox user can reach bind sources whatever their parents' permissions.",
    )

    memory_mb: int = Field(default=1024, gt=0, description="Default memory cap of one run, in MiB.")
    pids: int = Field(default=256, gt=0, description="Default cap on processes and threads alive in one run.")
    cpus: float = Field(default=1.0, gt=0, description="Default CPU bandwidth of one run, in cores.")
    timeout_s: float = Field(default=600.0, gt=0, description="Default wall-clock cap of one run, in seconds.")
    tmpfs_mb: int = Field(default=256, gt=0, description="Size of the private /tmp of one run, in MiB.")

    max_memory_mb: int = Field(default=8192, gt=0, description="Most memory a work item may request, in MiB.")
    max_pids: int = Field(default=4096, gt=0, description="Most processes a work item may request.")
    max_cpus: float = Field(default=4.0, gt=0, description="Most CPU cores a work item may request.")
    max_timeout_s: float = Field(default=3600.0, gt=0, description="Longest wall-clock cap a run may have, seconds.")

    @model_validator(mode="after")
    def _defaults_within_maximums(self) -> SandboxSettings:
        for name in ("memory_mb", "pids", "cpus", "timeout_s", "disk_mb"):
            if getattr(self, name) > getattr(self, f"max_{name}"):
                raise ValueError(
                    f"CREWWORK_SANDBOX_{name.upper()}={getattr(self, name)} is above "
                    f"CREWWORK_SANDBOX_MAX_{name.upper()}={getattr(self, f'max_{name}')}"
                )
        return self

    def backend_config(self, backend: str) -> DockerConfig | BwrapConfig | LocalConfig:
        """The per-backend part of these settings, as the class of that backend (`type` is the backend's name)."""
        raw: dict[str, object] = {"type": backend}
        if backend in ("docker", "gvisor"):
            raw |= {"image": self.docker_image, "runtime": self.docker_runtime, "base_url": self.docker_base_url}
        elif backend == "bwrap":
            raw |= {"cgroups": self.bwrap_cgroups, "seccomp": self.bwrap_seccomp, "stage_dir": self.bwrap_stage_dir}
        return _BACKEND_CONFIG.validate_python(raw)

    def default_limits(self) -> SandboxLimits:
        return SandboxLimits(
            memory_mb=self.memory_mb,
            pids=self.pids,
            cpus=self.cpus,
            timeout_s=self.timeout_s,
            tmpfs_mb=self.tmpfs_mb,
            disk_mb=self.disk_mb,
        )

    def toolchain_root(self) -> Path:
        """Where the sandbox's own Python is kept (crewwork/sandbox/toolchain.py): the setting, else the per-user
        cache directory (XDG_CACHE_HOME, else ~/.cache)."""
        if self.toolchain_dir is not None:
            return self.toolchain_dir
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "crewwork" / "sandbox-python"

    def owner(self) -> tuple[int, int] | None:
        """(uid, gid) workspaces belong to and sandboxes run as, or None when the worker is not root."""
        return (self.uid, self.gid) if os.geteuid() == 0 else None


def resolve_limits(
    spec: SandboxSpec | None, settings: SandboxSettings, timeout_s: float | None = None
) -> SandboxLimits:
    """The limits of one run: the work item's requests over the operator defaults, checked against maximums.

    Raises ValueError naming the field, the requested value and the maximum, so a submission can be rejected
    with a message the submitter can act on.
    """
    requested: dict[str, float | int | None] = {
        "memory_mb": spec.memory_mb if spec else None,
        "pids": spec.pids if spec else None,
        "cpus": spec.cpus if spec else None,
        "timeout_s": timeout_s,
        "disk_mb": spec.disk_mb if spec else None,
    }
    units = {"memory_mb": " MiB", "pids": " processes", "cpus": " cores", "timeout_s": " s", "disk_mb": " MiB"}
    values: dict[str, float | int] = {}
    for name, value in requested.items():
        maximum = getattr(settings, f"max_{name}")
        if value is None:
            values[name] = getattr(settings, name)
            continue
        if value <= 0:
            raise ValueError(f"sandbox {name} must be positive, got {value}")
        if value > maximum:
            raise ValueError(
                f"sandbox {name}={value}{units[name]} exceeds the operator maximum of {maximum}{units[name]} "
                f"(CREWWORK_SANDBOX_MAX_{name.upper()})"
            )
        values[name] = value
    return SandboxLimits(
        memory_mb=int(values["memory_mb"]),
        pids=int(values["pids"]),
        cpus=float(values["cpus"]),
        timeout_s=float(values["timeout_s"]),
        tmpfs_mb=settings.tmpfs_mb,
        disk_mb=int(values["disk_mb"]),
    )
