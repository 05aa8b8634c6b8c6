"""Sandboxes: one interface (`Sandbox.run`), several backends (gvisor, docker, bwrap, and an unsafe `local`).

Typical use:

    from crewwork.sandbox import SandboxSettings, best_available, get_sandbox, resolve_limits

    settings = SandboxSettings()
    name, why = best_available(settings)
    sandbox = get_sandbox(name, allow_unsafe=name == "local", settings=settings)
    limits = resolve_limits(spec, settings)
    result = await sandbox.run(["python", "-m", "pytest"], workspace=ws, limits=limits)
"""

from crewwork.sandbox.base import (
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxRunResult,
    SandboxUnavailable,
)
from crewwork.sandbox.config import SandboxSettings, resolve_limits
from crewwork.sandbox.registry import SANDBOXES, best_available, get_sandbox

__all__ = [
    "SANDBOXES",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxRunResult",
    "SandboxSettings",
    "SandboxUnavailable",
    "best_available",
    "get_sandbox",
    "resolve_limits",
]
