"""Fixtures for agent tests: a scripted OpenAI-compatible server, a real git repository, a context factory."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from crewwork.agents.base import AgentContext  # noqa: E402
from crewwork.models import WorkItemKind  # noqa: E402
from tests.fakes.openai_server import FakeOpenAIServer  # noqa: E402

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TEST_CALC = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        # safe.directory: a sandbox run hands the repository (used as the workspace here) to the sandbox uid.
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "safe.directory=*", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    """A real git repository with a bug in calc.py and a test that exposes it."""
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text(CALC)
    (repo / "tests" / "test_calc.py").write_text(TEST_CALC)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "initial")
    return repo


def git_diff(repo: Path) -> str:
    _git(repo, "add", "-A")
    return _git(repo, "diff", "--cached")


@pytest.fixture
def make_ctx(git_repo: Path) -> Callable[..., AgentContext]:
    def make(config: dict[str, Any], **kw: Any) -> AgentContext:
        heartbeats: list[Any] = kw.pop("heartbeats", [])
        defaults: dict[str, Any] = {
            "work_item_id": "wi-1",
            "attempt": 1,
            "activity_attempt": 1,
            "kind": WorkItemKind.code_change,
            "config": config,
            "instruction": "Fix add() in calc.py so tests/test_calc.py passes.",
            "workspace": git_repo,
            "heartbeat": lambda *d: heartbeats.append(d[0] if d else None),
        }
        defaults.update(kw)
        return AgentContext(**defaults)

    return make
