"""The sandbox specification an evidence bundle signs: what a validation run was given, recorded by the validate
step next to what the run measured (`SandboxReport.spec`).

Honest limit: a Docker image is named as configured (`crewwork-sandbox:latest`), not by its content digest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crewwork.sandbox.base import Mount, Sandbox, SandboxLimits


def sandbox_spec(sandbox: Sandbox, limits: SandboxLimits, mounts: Sequence[Mount] = ()) -> dict[str, Any]:
    return {
        "runner": sandbox.runner(),
        "isolating": sandbox.isolating,
        "limits": {
            "memory_mb": limits.memory_mb,
            "pids": limits.pids,
            "cpus": limits.cpus,
            "timeout_s": limits.timeout_s,
            "tmpfs_mb": limits.tmpfs_mb,
            "disk_mb": limits.disk_mb,
        },
        "network": "none",
        "mounts": [{"inside": m.inside, "writable": m.writable} for m in mounts],
    }
