"""Fixtures for the sandbox tests: one real backend per parameter, skipped (a failure under CI) if absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from crewwork.config.sandbox import SandboxSettings
from crewwork.sandbox.backends import SANDBOXES, get_sandbox
from crewwork.sandbox.base import Sandbox

ISOLATING = [
    pytest.param("bwrap", id="bwrap"),
    pytest.param("docker", id="docker", marks=pytest.mark.docker),
    pytest.param("gvisor", id="gvisor", marks=pytest.mark.docker),
]


def require_backend(name: str) -> Sandbox:
    ok, why = SANDBOXES[name].available()
    if not ok:
        hint = "run `.ci/docker-up.sh` as root" if name in ("docker", "gvisor") else "apt-get install -y bubblewrap"
        pytest.skip(f"sandbox backend {name} is not available here: {why} ({hint})")
    return get_sandbox(name, settings=SandboxSettings())


@pytest.fixture(params=ISOLATING)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return require_backend(request.param)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws
