"""A prepared environment's identity and plan: whose it is (`CacheOwner`), its cache key (`prepare_key`: every input
that can change what a setup produces, secrets by keyed digest), the setup to run (`SetupPlan`), a ready entry
(`PreparedEnv`) and the setup's failure. The cache that builds and serves entries is crewwork/sandbox/prepare.py."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from crewwork.sandbox.base import Mount, SandboxRunResult

MAKE_VENV = r"""
import os, shutil, subprocess, sys
target = sys.argv[1]
try:
    import ensurepip  # noqa: F401
    has_ensurepip = True
except ImportError:
    has_ensurepip = False
subprocess.run([sys.executable, "-m", "venv", *([] if has_ensurepip else ["--without-pip"]), target], check=True)
if not has_ensurepip:
    try:
        import pip
    except ImportError:
        sys.exit(f"{sys.executable} has neither ensurepip nor pip: the environment's venv would have no pip")
    py = os.path.join(target, "bin", "python")
    purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    shutil.copytree(os.path.dirname(pip.__file__), os.path.join(purelib, "pip"))
    print(f"{sys.executable} has no ensurepip: venv made without pip, the interpreter's pip copied in")
"""
READY = "READY.json"
SETUP_LOG = "setup.log"
DEFAULT_MAX_BYTES = 10 * 1024**3
ENV_INSIDE = "/crewwork/env"
"""Where a run sees its prepared environment (writable while it is built, read-only afterwards)."""
NET_INSIDE = "/crewwork/net"
"""Where a setup run sees the allowlisting proxy's socket and relay."""
DIGEST_KEY = ".secret-digest-key"


@dataclasses.dataclass(frozen=True)
class CacheOwner:
    """Whose inputs an entry is built from; it is served to nobody else."""

    tenant_id: str
    repository: str
    """The tenant's registration of the repository (its id; its URL where there is no registration)."""


def prepare_key(
    owner: CacheOwner,
    repo: str,
    base_commit: str,
    setup: Sequence[Sequence[str]],
    *,
    runner: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    plan: SetupPlan | None = None,
    secret_digests: Mapping[str, str] | None = None,
) -> str:
    """Key of a prepared environment: any change in anything the setup could produce or see gives another key.

    `runner` says what runs the setup (`Sandbox.runner()`: backend, interpreter or image); `secret_digests` maps each
    secret's variable name to a keyed digest of its value (`PreparedEnvCache.secret_digests`)."""
    spec: dict[str, Any] = {
        "tenant": owner.tenant_id,
        "repository": owner.repository,
        "repo": repo,
        "commit": base_commit,
        "setup": [list(c) for c in setup],
        "env": dict(env or {}),
        "runner": dict(runner),
        "secrets": dict(secret_digests or {}),
    }
    if plan is not None and not plan.empty:
        spec["plan"] = plan.key_fields()
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


@dataclasses.dataclass(frozen=True)
class SetupPlan:
    """How a repository's environment is built, beyond its setup commands (see the module docstring)."""

    python: str | None = None
    """Interpreter (as seen inside the sandbox) the venv is created from; None: no venv."""
    allowlist: tuple[str, ...] = ()
    """host:port the setup may reach through the allowlisting proxy; empty: no network."""
    secrets: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Environment variable -> value, for setup commands only."""
    image: str | None = None
    redact: Callable[[str], str] | None = None
    """Masks secrets in the setup log (the secret values are masked regardless)."""

    @property
    def empty(self) -> bool:
        return self.python is None and not self.allowlist and not self.secrets and self.image is None

    def key_fields(self) -> dict[str, Any]:
        """What the plan contributes to the key (secret values enter only as keyed digests, see `prepare_key`)."""
        return {
            "python": self.python,
            "allowlist": sorted(self.allowlist),
            "secrets": sorted(self.secrets),
            "image": self.image,
        }

    def mask(self, text: str) -> str:
        for value in sorted((v for v in self.secrets.values() if len(v) >= 4), key=len, reverse=True):
            text = text.replace(value, "[REDACTED]")
        return self.redact(text) if self.redact is not None else text


@dataclasses.dataclass
class PreparedEnv:
    """A ready environment: give a run `mounts()` and add `env()` to its environment."""

    key: str
    root: Path
    cold: bool
    setup_results: list[SandboxRunResult]
    prepare_s: float
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    inside: str = ENV_INSIDE
    """Where runs of the backend it was built for see `env_dir` (its host path on `local`)."""
    _hold: int | None = dataclasses.field(default=None, repr=False, compare=False)
    """With `get_or_prepare(hold=True)`: the open lock file whose shared lock keeps the entry from eviction."""

    @property
    def env_dir(self) -> Path:
        return self.root / "env"

    def release(self) -> None:
        """Let eviction have the entry again (`get_or_prepare(hold=True)`); safe to call twice."""
        fd, self._hold = self._hold, None
        if fd is not None:
            os.close(fd)

    @property
    def has_venv(self) -> bool:
        # Decided when the build ended, without following links (`_made_venv`); never by looking into the
        # tenant's environment again, where a link could make the host answer for a path of its own.
        return bool(self.meta.get("venv"))

    def mounts(self) -> list[Mount]:
        return [Mount(self.env_dir, ENV_INSIDE)]

    def env(self, python_version: str | None = None) -> dict[str, str]:
        """What a run in this environment needs: the venv's bin first on PATH (no PYTHONPATH) when there is a
        venv, else PYTHONPATH into what `pip install --prefix $CREWWORK_ENV` put there."""
        if self.has_venv:
            venv = f"{self.inside}/venv"
            return {
                "CREWWORK_ENV": self.inside,
                "VIRTUAL_ENV": venv,
                "PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin",
            }
        version = python_version or f"python{sys.version_info.major}.{sys.version_info.minor}"
        return {"CREWWORK_ENV": self.inside, "PYTHONPATH": f"{self.inside}/lib/{version}/site-packages"}

    def setup_log(self) -> bytes:
        """The setup commands' output as the build recorded it (secrets masked)."""
        try:
            return (self.root / SETUP_LOG).read_bytes()
        except OSError:
            return b""

    def evidence(self) -> dict[str, Any]:
        """Cache hit or build, durations of the build's steps, the setup network's decisions."""
        return {
            "key": self.key,
            "cold": self.cold,
            "seconds": round(self.prepare_s, 3),
            "built_at": self.meta.get("built_at"),
            "build_seconds": self.meta.get("build_seconds"),
            "steps": self.meta.get("steps", []),
            "network": self.meta.get("network", []),
            "venv": bool(self.meta.get("venv")),
            "disk": self.meta.get("disk", "none"),
        }


class SetupFailed(RuntimeError):
    """A setup command exited non-zero or hit a cap: a property of the work item, not of the machinery."""

    def __init__(
        self,
        message: str,
        results: list[SandboxRunResult],
        log: bytes = b"",
        network: list[dict[str, object]] | None = None,
    ) -> None:
        super().__init__(message)
        self.results = results
        self.log = log
        self.network = network or []


def _meta(entry: Path) -> dict[str, Any]:
    try:
        data = json.loads((entry / READY).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
