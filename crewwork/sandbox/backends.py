"""Backend names -> classes, and the choice of the best isolating backend this host offers.

Adding a backend is one new module and one line in SANDBOXES.
"""

from __future__ import annotations

from crewwork.config.sandbox import SandboxSettings
from crewwork.sandbox.base import Sandbox, SandboxUnavailable
from crewwork.sandbox.bwrap import BwrapSandbox
from crewwork.sandbox.docker import DockerSandbox, GVisorSandbox
from crewwork.sandbox.local import LocalSandbox

SANDBOXES: dict[str, type[Sandbox]] = {
    "gvisor": GVisorSandbox,
    "docker": DockerSandbox,
    "bwrap": BwrapSandbox,
    "local": LocalSandbox,
}
# Strongest isolation first. `local` is never chosen automatically.
PREFERENCE = ("gvisor", "docker", "bwrap")
INSTALL_HINT = (
    "no isolating sandbox is available: install bubblewrap (`apt-get install -y bubblewrap`) or start Docker "
    "with gVisor (`.ci/docker-up.sh`, see docs/sandbox.md)"
)


def get_sandbox(name: str, *, allow_unsafe: bool = False, settings: SandboxSettings | None = None) -> Sandbox:
    """An instance of backend `name`. Raises ValueError for an unknown name or an unrequested `local`,
    SandboxUnavailable when the backend cannot run here (the message says how to fix it)."""
    cls = SANDBOXES.get(name)
    if cls is None:
        raise ValueError(f"unknown sandbox backend {name!r}; choose one of {', '.join(SANDBOXES)}")
    if not cls.isolating and not allow_unsafe:
        raise ValueError(
            f"sandbox backend {name!r} does not isolate anything and is refused unless chosen explicitly "
            "as unsafe (allow_unsafe=True, `--unsafe` on the command line); use it for development only"
        )
    settings = settings or SandboxSettings()
    ok, why = cls.available(settings)
    if not ok:
        raise SandboxUnavailable(f"sandbox backend {name!r} is not available: {why}")
    return cls(settings)


def best_available(settings: SandboxSettings | None = None) -> tuple[str, str]:
    """(name, why) of the backend to use: the configured one, else the strongest available isolating one.

    Returns ("local", <how to install an isolating backend>) only when nothing isolating works.
    """
    settings = settings or SandboxSettings()
    if settings.backend:
        cls = SANDBOXES.get(settings.backend)
        if cls is None:
            raise ValueError(f"CREWWORK_SANDBOX_BACKEND={settings.backend!r} is not one of {', '.join(SANDBOXES)}")
        ok, why = cls.available(settings)
        if not ok:
            raise SandboxUnavailable(f"configured sandbox backend {settings.backend!r} is not available: {why}")
        return settings.backend, f"configured (CREWWORK_SANDBOX_BACKEND): {why}"
    reasons = []
    for name in PREFERENCE:
        ok, why = SANDBOXES[name].available(settings)
        if ok:
            return name, why
        reasons.append(f"{name}: {why}")
    return "local", INSTALL_HINT + " (" + "; ".join(reasons) + ")"
