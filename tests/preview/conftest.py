"""Fixtures for the preview tests: real sandboxes on every backend CI runs, a workspace owned by the sandbox user,
and `preview()` running `run_preview` exactly as the validation step does (artifacts kept in memory)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from crewwork.config.sandbox import SandboxSettings
from crewwork.models import ArtifactRef
from crewwork.models.preview import PreviewSpec
from crewwork.preview.run import PreviewRun, run_preview
from crewwork.sandbox.backends import SANDBOXES, get_sandbox
from crewwork.sandbox.base import SandboxLimits

BACKENDS = [
    pytest.param("bwrap", id="bwrap"),
    pytest.param("docker", id="docker", marks=pytest.mark.docker),
    pytest.param("gvisor", id="gvisor", marks=pytest.mark.docker),
]


def require(backend: str) -> str:
    ok, why = SANDBOXES[backend].available()
    if not ok:
        hint = "run `.ci/docker-up.sh` as root" if backend in ("docker", "gvisor") else "apt-get install bubblewrap"
        pytest.skip(f"sandbox backend {backend} is not available: {why} ({hint})")
    return backend


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return require(request.param)


@dataclass
class Saved:
    artifacts: dict[str, tuple[bytes, str]] = field(default_factory=dict)

    async def save(self, name: str, data: bytes, ctype: str) -> ArtifactRef:
        self.artifacts[name] = (data, ctype)
        return ArtifactRef(
            id=f"art_{len(self.artifacts)}",
            name=name,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            content_type=ctype,
        )


def workspace(root: Path, files: dict[str, str]) -> Path:
    ws = root / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    owner = SandboxSettings().owner()
    if owner is not None:
        for dirpath, _dirs, names in os.walk(ws):
            os.chown(dirpath, *owner)
            for n in names:
                os.chown(os.path.join(dirpath, n), *owner)
    return ws


async def preview(
    backend: str, tmp_path: Path, files: dict[str, str], spec: dict[str, Any], **limits: Any
) -> tuple[PreviewRun, Saved]:
    settings = SandboxSettings()
    saved = Saved()
    run = await run_preview(
        PreviewSpec.model_validate(spec),
        sandbox=get_sandbox(backend, settings=settings),
        workspace=workspace(tmp_path, files),
        limits=SandboxLimits(**{"memory_mb": 512, "pids": 128, "timeout_s": 120, **limits}),
        env={},
        mounts=[],
        settings=settings,
        scratch=tmp_path / "scratch",
        save=saved.save,
        prefix="attempt-1",
    )
    return run, saved
