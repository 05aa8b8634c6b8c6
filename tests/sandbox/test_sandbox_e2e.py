"""A work item end to end with validation inside gVisor: real Temporal, real PostgreSQL, real docker+runsc."""

from __future__ import annotations

from pathlib import Path

import pytest

from crewwork.cli.demo import RIGHT, WRONG
from crewwork.sandbox.backends import SANDBOXES
from crewwork.temporal.devserver import DevServer
from tests.conftest import make_settings, running_crew

pytestmark = [pytest.mark.postgres, pytest.mark.temporal, pytest.mark.docker]


async def test_work_item_is_repaired_and_validated_inside_gvisor(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, calc_repo: Path
) -> None:
    ok, why = SANDBOXES["gvisor"].available()
    if not ok:
        pytest.skip(f"gvisor sandbox not available: {why} (run `.ci/docker-up.sh` as root)")
    settings = make_settings(tmp_path, temporal_server, pg_url, sandbox_backend="gvisor")
    item = {
        "kind": "code_change",
        "repo": {"url": str(calc_repo), "ref": "main"},
        "instruction": "Fix add() so the tests pass",
        "validation": {
            "command": ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml"],
            "junit_path": ".crewwork/junit.xml",
            "timeout_s": 120,
            "test_files": ["tests/test_calc.py"],
        },
        "agent": {
            "name": "scripted",
            "config": {"attempts": [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": RIGHT}}]},
        },
        "budget": {"max_attempts": 3},
    }
    async with running_crew(settings) as crew:
        wid = await crew.submit(item)
        result = await crew.result(wid, timeout_s=240)

    assert result.state == "succeeded", result.reason
    assert [a.verdict for a in result.attempts] == ["failed", "passed"]
    for attempt, exit_code in zip(result.attempts, (1, 0), strict=True):
        report = attempt.validation.sandbox
        assert report is not None and report.backend == "gvisor" and report.isolated
        assert report.enforcement == "docker+runsc" and report.exit_code == exit_code
