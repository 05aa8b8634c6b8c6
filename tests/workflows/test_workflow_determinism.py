"""Workflow code must be deterministic: no clock, randomness, I/O, threads or environment.

The control pool runs workflows without Temporal's sandbox by default (CREWWORK_WORKFLOW_SANDBOX=off, see
crewwork/workers/pools.py), so this test is the guard: it reads the workflow modules' source and rejects imports and
calls that are non-deterministic. Imports inside `workflow.unsafe.imports_passed_through()` are crewwork's own models
and the steps' contracts (`crewwork.steps.<step>`: models and policy), which the rule below also covers by name; a
step's activity (`crewwork.steps.<step>.activity`) and the ports it is bound to are never imported: the workflow runs
steps by name through its one call path. The committed histories are, in addition, replayed under the full sandbox
in tests/integration/test_replay.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import crewwork.workflows as workflows_pkg

WORKFLOW_FILES = sorted(Path(workflows_pkg.__path__[0]).glob("*.py"))

FORBIDDEN_MODULES = {
    "time",
    "random",
    "secrets",
    "uuid",
    "os",
    "sys",
    "socket",
    "subprocess",
    "threading",
    "multiprocessing",
    "concurrent",
    "pathlib",
    "shutil",
    "tempfile",
    "httpx",
    "sqlalchemy",
    "crewwork.store",
    "crewwork.workspace.gitops",
    "crewwork.sandbox",
    "crewwork.agents",
}
# The I/O side of a step: its activity and the ports (store, repositories, sandboxes) activities are bound to.
FORBIDDEN_MODULES |= {"crewwork.steps.ports", "crewwork.repos", "crewwork.attestation", "crewwork.preview"}


def _is_activity_module(name: str) -> bool:
    return name.startswith("crewwork.steps.") and name.rsplit(".", 1)[-1] == "activity"


FORBIDDEN_CALLS = {"open", "input", "print", "now", "utcnow", "today", "sleep", "getenv"}
# asyncio's own sleep/wait are non-deterministic outside Temporal's event loop; workflow.sleep/wait_condition are
# the deterministic ones. `workflow.now()` is Temporal's deterministic clock and allowed.
ALLOWED_QUALIFIED = {"workflow.now", "workflow.sleep"}


def _qualified(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_qualified(node.value)}.{node.attr}"
    return ""


def problems(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            names = []
        for name in names:
            if any(name == m or name.startswith(m + ".") for m in FORBIDDEN_MODULES) or _is_activity_module(name):
                found.append(f"line {node.lineno}: import of {name}")
                break
        if isinstance(node, ast.Call):
            q = _qualified(node.func)
            last = q.rsplit(".", 1)[-1]
            if last in FORBIDDEN_CALLS and q not in ALLOWED_QUALIFIED:
                found.append(f"line {node.lineno}: call of {q}()")
            if q in {"asyncio.sleep", "asyncio.wait", "asyncio.as_completed"}:
                found.append(f"line {node.lineno}: call of {q}() (use workflow.sleep / workflow.wait)")
    return found


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_workflow_module_has_no_nondeterministic_code(path: Path) -> None:
    assert problems(path.read_text()) == []


@pytest.mark.parametrize(
    "snippet",
    [
        "import time",
        "from random import random",
        "import crewwork.store.store",
        "x = datetime.datetime.now()",
        "open('/etc/hostname')",
        "await asyncio.sleep(1)",
        "os.getenv('X')",
        "from crewwork.steps.land.activity import land_change",
        "from crewwork.steps import ports",
        "import crewwork.steps.agent.activity",
        "from crewwork.repos.worker import Repositories",
    ],
)
def test_the_guard_catches_nondeterministic_code(snippet: str) -> None:
    source = f"async def f():\n    {snippet}\n" if snippet.startswith("await") else snippet
    assert problems(source), snippet


def test_the_guard_allows_temporal_deterministic_apis() -> None:
    assert problems("async def f():\n    t = workflow.now()\n    await workflow.sleep(1)\n") == []


def test_the_guard_allows_step_contracts() -> None:
    source = (
        "from crewwork.steps.admit import ADMIT, AdmitInput\n"
        "async def f():\n    await self._call(ADMIT, lambda step: AdmitInput(step=step), 'admit')\n"
    )
    assert problems(source) == []
