"""Fixtures for the containment suite: attacks against the host, run for real on every isolating backend.

Every attack here is harmless by construction: it targets files under the test's own tmp_path (a marker a
command would create, a victim file it would delete, a secret it would read), so a regression shows up as a
failed assertion, never as damage.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from crewwork.sandbox.backends import SANDBOXES
from crewwork.store.tables import Artifact
from crewwork.temporal.devserver import DevServer
from tests.conftest import Crew, make_repo, make_settings, running_crew

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BACKENDS = [
    pytest.param("bwrap", id="bwrap"),
    pytest.param("docker", id="docker", marks=pytest.mark.docker),
    pytest.param("gvisor", id="gvisor", marks=pytest.mark.docker),
]

PYTEST = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml"]
VALIDATION: dict[str, Any] = {
    "command": PYTEST,
    "junit_path": ".crewwork/junit.xml",
    "timeout_s": 120,
    "test_files": ["tests/test_calc.py"],
}
BUGGY = "def add(a, b):\n    return a - b\n"
RIGHT = "def add(a, b):\n    return a + b\n"
TEST = (
    "from calc import add\n\n\ndef test_adds_positive_numbers():\n    assert add(2, 3) == 5\n\n\n"
    "def test_adds_negative_numbers():\n    assert add(-1, -2) == -3\n"
)


def require(backend: str) -> str:
    ok, why = SANDBOXES[backend].available()
    if not ok:
        hint = "run `.ci/docker-up.sh` as root" if backend in ("docker", "gvisor") else "apt-get install bubblewrap"
        pytest.skip(f"sandbox backend {backend} is not available: {why} ({hint})")
    return backend


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return require(request.param)


@pytest.fixture
def calc(tmp_path: Path) -> Path:
    """The calc repository: a bug, a test that exposes it, and an (empty) root conftest.py."""
    return make_repo(tmp_path / "repo", {"calc.py": BUGGY, "tests/test_calc.py": TEST, "conftest.py": ""})


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    """A host directory no work item may touch: secrets to steal, victims to delete, markers RCE would create."""
    d = tmp_path / "host"
    d.mkdir()
    (d / "secret.txt").write_text("HOST-SECRET-7f3a9c\n")
    (d / "secret.txt").chmod(0o600)
    (d / "victim.txt").write_text("do not delete\n")
    (d / "markers").mkdir()
    return d


@contextlib.asynccontextmanager
async def crew_on(tmp_path: Path, temporal: DevServer, pg_url: str, backend: str, **kw: Any) -> AsyncIterator[Crew]:
    settings = make_settings(tmp_path / f"crew-{backend}", temporal, pg_url, sandbox_backend=backend, **kw)
    async with running_crew(settings) as crew:
        yield crew


def code_change(
    repo: Path, agent: dict[str, Any], validation: dict[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    item: dict[str, Any] = {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix add() so the tests pass",
        "validation": validation or VALIDATION,
        "agent": agent,
        "budget": {"max_attempts": 1},
    }
    item.update(kw)
    return item


def scripted(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": "scripted", "config": {"attempts": list(steps)}}


def command_agent(monkeypatch: pytest.MonkeyPatch, name: str, code: str, *args: str) -> dict[str, Any]:
    """An operator-defined command agent that runs `python3 -c code args...` inside the sandbox."""
    spec = {"argv": ["python3", "-c", code, *args], "timeout_s": 120}
    monkeypatch.setenv("CREWWORK_COMMAND_AGENTS", json.dumps({"commands": {name: spec}}))
    monkeypatch.setenv("CREWWORK_COMMAND_AGENT_ENABLED", "true")
    return {"name": "command", "config": {"command": name}}


async def artifacts_of(crew: Crew, work_item_id: str) -> list[bytes]:
    async with crew.store.session() as s:
        rows = (await s.scalars(select(Artifact.content).where(Artifact.work_item_id == work_item_id))).all()
    return [bytes(r) for r in rows if r is not None]


async def artifact_named(crew: Crew, work_item_id: str, suffix: str) -> bytes | None:
    async with crew.store.session() as s:
        rows = (
            await s.execute(select(Artifact.name, Artifact.content).where(Artifact.work_item_id == work_item_id))
        ).all()
    for name, content in rows:
        if name.endswith(suffix) and content is not None:
            return bytes(content)
    return None


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """Samples this (worker) process's resident memory every few milliseconds while a block runs: `growth` is
    the peak above where it started (the process peak, ru_maxrss, would hide growth below an earlier peak)."""

    def __init__(self) -> None:
        self.start = rss_bytes()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth(self) -> int:
        return self.peak - self.start


@pytest.fixture
def worker_secret(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A secret in the worker's own environment (like a database password): it must never reach a sandbox."""
    value = "worker-env-secret-91c2e"
    monkeypatch.setenv("CREWWORK_TEST_WORKER_SECRET", value)
    yield value


def markers(host_dir: Path) -> list[str]:
    return sorted(os.listdir(host_dir / "markers"))
