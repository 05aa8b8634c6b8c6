"""Prepared environments in the lifecycle: setup runs once per (repo, base commit, setup); attempts reuse it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from crewwork.cli.demo import BUGGY, RIGHT, TEST, WRONG
from tests.conftest import Crew, make_repo
from tests.integration.test_lifecycle import VALIDATION, code_change

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

PYVER = f"python{sys.version_info.major}.{sys.version_info.minor}"
SETUP = [
    "sh",
    "-c",
    f'mkdir -p "$CREWWORK_ENV/lib/{PYVER}/site-packages" && '
    f'echo "VALUE = 5" > "$CREWWORK_ENV/lib/{PYVER}/site-packages/installed_dep.py"',
]


async def test_setup_runs_once_and_every_attempt_reuses_it(crew: Crew, tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "dep-repo",
        {
            "calc.py": BUGGY,
            "tests/test_calc.py": TEST,
            "tests/test_dep.py": "from installed_dep import VALUE\n\n\ndef test_dependency_is_installed():\n"
            "    assert VALUE == 5\n",
            "conftest.py": "",
        },
    )
    validation = {**VALIDATION, "setup": [SETUP], "test_files": ["tests/test_calc.py", "tests/test_dep.py"]}
    wid = await crew.submit(
        code_change(repo, [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": RIGHT}}], validation=validation)
    )
    result = await crew.result(wid)
    assert result.state == "succeeded", result.reason
    passed = result.attempts[-1].validation
    assert passed is not None
    assert any(t.id.endswith("test_dependency_is_installed") and t.outcome == "passed" for t in passed.tests)
    prepared = [e.data for e in await crew.store.list_events(wid) if e.type == "environment_prepared"]
    assert [p["cold"] for p in prepared] == [True, False], "the second attempt must reuse the first one's setup"
    assert len({p["key"] for p in prepared}) == 1


async def test_failing_setup_is_evidence_not_an_infrastructure_error(crew: Crew, calc_repo: Path) -> None:
    validation = {**VALIDATION, "setup": [["sh", "-c", "echo cannot install >&2; exit 3"]]}
    wid = await crew.submit(
        code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], validation=validation, budget={"max_attempts": 1})
    )
    result = await crew.result(wid)
    assert result.state == "failed"
    v = result.attempts[0].validation
    assert v is not None and v.cause == "setup_failed", v.reason if v else None
