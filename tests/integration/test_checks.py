"""Named checks (validation.checks, docs/checks.md), for real: a repository with a lint (pyflakes), a type check
(mypy --strict), a SARIF check of the repository's own (tools/todo_sarif.py), a matrix cell in another dependency
set, and checks that are not required. Attempt 1 passes the tests but breaks lint, types and the SARIF check (and
tries to switch the SARIF check off by editing its program, which is put back): it fails with `check_failed`, every
failing check's findings in the diagnostics. Attempt 2 is clean and lands; its bundle verifies with every check's
result in it. Real sandbox, real Temporal and PostgreSQL, pyflakes and mypy installed into the repository's
environment from a loopback package index (nothing fetched from the internet)."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from crewwork.attestation.keys import generate, load_trusted
from crewwork.attestation.verify import verify_bundle
from crewwork.cli.demo import TEST
from crewwork.config.attestation import EvidenceSettings
from crewwork.temporal.devserver import DevServer
from tests.conftest import Crew, make_repo, make_settings, running_crew
from tests.repos.pkgindex import PackageIndex, packages_ready

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

BUGGY = "def add(a: int, b: int) -> int:\n    return a - b\n"
SLOPPY = "import os\n\n\ndef add(a: int, b: int) -> int:\n    total: str = a + b  # TODO: overflow\n    return total\n"
CLEAN = "def add(a: int, b: int) -> int:\n    return a + b\n"

TODO_SARIF = '''"""Writes a SARIF log with an error result for each TODO in the repository's Python files (not tools/, tests/)."""
import json
import pathlib
import sys

results = []
for path in sorted(pathlib.Path(".").rglob("*.py")):
    if path.parts[0] in ("tools", "tests", ".crewwork"):
        continue
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if "TODO" in line:
            results.append({
                "ruleId": "todo",
                "level": "error",
                "message": {"text": "a TODO left in the code"},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": str(path)}, "region": {"startLine": n}}}],
            })
log = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "todo"}}, "results": results}]}
pathlib.Path(sys.argv[1]).write_text(json.dumps(log))
'''
SILENCED = TODO_SARIF.replace('if "TODO" in line:', "if False:")


@pytest.fixture
def packages() -> None:
    ok, why = packages_ready()
    if not ok:
        pytest.skip(why)


def pip(index: PackageIndex, *pins: str) -> list[str]:
    return ["python", "-m", "pip", "install", "--no-cache-dir", "-q", "--index-url", index.url, *pins]


def checks_item(repo: Path, index: PackageIndex) -> dict[str, Any]:
    mypy = ["mypy==2.4.1", "mypy_extensions==1.2.0", "typing_extensions==4.16.0", "pathspec==1.1.1"]
    mypy += ["librt==0.17.0", "ast-serialize==0.13.1"]
    return {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix add() so the tests pass",
        "environment": {
            "python": "/usr/bin/python3",
            "setup": [pip(index, "pytest==8.3.5", "pyflakes==3.4.0", *mypy)],
            "network": True,
        },
        "validation": {
            "command": ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml"],
            "junit_path": ".crewwork/junit.xml",
            "timeout_s": 120,
            "test_files": ["tests/test_calc.py"],
            "check_parallel": 3,
            "checks": [
                {"name": "lint", "command": ["python", "-m", "pyflakes", "calc.py"]},
                {"name": "types", "command": ["python", "-m", "mypy", "--strict", "--no-incremental", "calc.py"]},
                {
                    "name": "todo",
                    "command": ["python", "tools/todo_sarif.py", ".crewwork/todo.sarif"],
                    "report": "sarif",
                    "report_path": ".crewwork/todo.sarif",
                },
                {
                    # The matrix's second cell: the tests again, in another dependency set (blinker added).
                    "name": "tests-blinker",
                    "command": [
                        "sh",
                        "-c",
                        "python -c 'import blinker' && exec python -m pytest -q -p no:cacheprovider "
                        "--junitxml=.crewwork/blinker.xml tests",
                    ],
                    "report": "junit",
                    "report_path": ".crewwork/blinker.xml",
                    "environment": {"setup": [pip(index, "pytest==8.3.5", "blinker==1.9.0")]},
                },
                # Not required: shown, never deciding. The item's own environment has no blinker.
                {"name": "no-blinker", "command": ["python", "-c", "import blinker"], "required": False},
            ],
        },
        "agent": {
            "name": "scripted",
            "config": {
                "attempts": [
                    {"files": {"calc.py": SLOPPY, "tools/todo_sarif.py": SILENCED}},
                    {"files": {"calc.py": CLEAN}},
                ]
            },
        },
        "budget": {"max_attempts": 3},
        "review": {"required": False},
    }


def by_name(checks: list[Any]) -> dict[str, Any]:
    return {c.name: c for c in checks}


async def test_lint_types_and_a_sarif_check_fail_the_first_attempt_and_the_repair_lands_with_them_signed(
    packages: None, tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str
) -> None:
    repo = make_repo(
        tmp_path / "repo",
        {"calc.py": BUGGY, "tests/test_calc.py": TEST, "tests/__init__.py": "", "tools/todo_sarif.py": TODO_SARIF},
    )
    key = tmp_path / "keys" / "evidence"
    key.parent.mkdir()
    generate(key)
    with PackageIndex(tmp_path / "index") as index:
        settings = make_settings(
            tmp_path / "data",
            temporal_server,
            pg_url,
            sandbox_backend=sandbox_backend,
            setup_network_allowlist=index.hostport,
            evidence=EvidenceSettings(signing_key_file=key),
        )
        async with running_crew(settings) as crew:
            wid = await crew.submit(checks_item(repo, index))
            result = await crew.result(wid, timeout_s=900)
            assert result.state == "succeeded", result.reason
            assert [a.verdict for a in result.attempts] == ["failed", "passed"]
            first, second = (a.validation for a in result.attempts)
            assert first is not None and second is not None

            # Attempt 1: the tests passed; lint, types and the SARIF check failed, each with what it found.
            assert first.cause == "check_failed", first.reason
            assert first.tests_executed == 2 and not any(t.outcome != "passed" for t in first.tests)
            checks = by_name(first.checks)
            assert {n: (c.passed, c.cause) for n, c in checks.items()} == {
                "lint": (False, "check_failed"),
                "types": (False, "check_failed"),
                "todo": (False, "check_failed"),
                "tests-blinker": (True, "passed"),
                "no-blinker": (False, "check_failed"),
            }
            for name in ("lint", "types", "todo"):
                assert f"`{name}`" in first.reason
            assert "no-blinker" not in first.reason
            assert any("'os' imported but unused" in f for f in checks["lint"].findings), checks["lint"].findings
            assert any("Incompatible types in assignment" in f for f in checks["types"].findings)
            assert checks["todo"].findings == ["calc.py:5: todo: a TODO left in the code"]
            assert any("No module named 'blinker'" in f for f in checks["no-blinker"].findings)
            assert checks["tests-blinker"].environment and "blinker" in checks["tests-blinker"].environment
            # Switching the SARIF check off by editing its program did not reach the run.
            assert any(r.path == "tools/todo_sarif.py" and "check `todo`" in r.why for r in first.protected_reset)
            # Every failing check's findings reached the next attempt (its agent's transcript holds what it was given).
            agent = result.attempts[1].agent
            assert agent is not None and agent.transcript_ref is not None
            given = (await crew.store.artifact_content(agent.transcript_ref.id) or b"").decode()
            assert "Checks that did not pass" in given and "imported but unused" in given, given[-3000:]
            assert "calc.py:5: todo" in given and "Incompatible types in assignment" in given
            # Each check's log and report are artifacts.
            lint_log = await crew.store.artifact_content(checks["lint"].log_ref.id)  # type: ignore[union-attr]
            assert lint_log is not None and lint_log.startswith(b"$ python -m pyflakes calc.py")
            sarif = await crew.store.artifact_content(checks["todo"].report_ref.id)  # type: ignore[union-attr]
            assert sarif is not None and json.loads(sarif)["runs"][0]["results"][0]["ruleId"] == "todo"

            # Attempt 2: every required check passed.
            assert second.cause == "passed"
            checks = by_name(second.checks)
            assert all(c.passed for c in checks.values() if c.required), second.checks
            assert "Not required, and failed: `no-blinker`" in second.reason

            # The landed change's evidence bundle verifies, with every check's result in it.
            commit = result.landed_commit
            assert commit
            note = subprocess.run(
                ["git", "notes", f"--ref=crewwork/{wid}", "show", commit], cwd=repo, capture_output=True, check=True
            ).stdout
            report = verify_bundle(note, load_trusted([key.with_name("evidence.pub")]), repo=repo, work_item=wid)
            assert report.ok, report.problems
            # The validation record is a subject of the signed statements, embedded in the bundle (its digest checked).
            embedded = json.loads(note)["files"]["validation.json"]
            record = json.loads(base64.b64decode(embedded["base64"]))
            assert {c["name"]: c["passed"] for c in record["checks"]} == {
                "lint": True,
                "types": True,
                "todo": True,
                "tests-blinker": True,
                "no-blinker": False,
            }
            assert all(c["log_sha256"] for c in record["checks"])


async def test_a_required_check_whose_program_is_missing_ends_the_item_at_once(crew: Crew, calc_repo: Path) -> None:
    from crewwork.cli.demo import RIGHT
    from tests.integration.test_lifecycle import VALIDATION, code_change

    validation = {**VALIDATION, "checks": [{"name": "lint", "command": ["no-such-linter", "."]}]}
    wid = await crew.submit(
        code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], validation=validation, review={"required": False})
    )
    result = await crew.result(wid)
    assert result.state == "failed"
    assert [a.verdict for a in result.attempts] == ["failed"], "no second attempt is paid for"
    assert result.reason.startswith("check `lint`: `no-such-linter` does not exist"), result.reason
    only = result.attempts[0].validation
    assert only is not None and only.cause == "check_failed"
    assert only.checks[0].cause == "command_not_found"


BASE_WITH_DEBT = '# TODO: decide on floats\ndef add(a, b):\n    print("adding")\n    return a - b\n'


async def test_with_a_baseline_a_checks_pre_existing_failures_do_not_block_and_new_ones_do(
    crew: Crew, tmp_path: Path
) -> None:
    from tests.integration.test_lifecycle import VALIDATION, code_change

    repo = make_repo(
        tmp_path / "debt",
        {"calc.py": BASE_WITH_DEBT, "tests/test_calc.py": TEST, "conftest.py": "", "tools/todo_sarif.py": TODO_SARIF},
    )
    fixed = BASE_WITH_DEBT.replace("a - b", "a + b")
    validation = {
        **VALIDATION,
        "baseline": "compare",
        "checks": [
            {
                "name": "todo",
                "command": ["python", "tools/todo_sarif.py", ".crewwork/todo.sarif"],
                "report": "sarif",
                "report_path": ".crewwork/todo.sarif",
            },
            # Fails at the base already (calc.py prints): an exit check has no findings to compare, so it is
            # pre-existing as a whole.
            {"name": "noprint", "command": ["sh", "-c", "! grep -n 'print(' calc.py"]},
        ],
    }
    steps = [
        {"files": {"calc.py": fixed + "# TODO: handle overflow\n"}},  # one TODO more than the base: the change's
        {"files": {"calc.py": fixed}},
    ]
    wid = await crew.submit(code_change(repo, steps, validation=validation, review={"required": False}))
    result = await crew.result(wid)
    assert result.state == "succeeded", result.reason
    first, second = (a.validation for a in result.attempts)
    assert first is not None and second is not None
    todo, noprint = first.checks
    assert (first.cause, todo.passed, noprint.passed) == ("check_failed", False, True), first.reason
    assert todo.findings == ["calc.py:5: todo: a TODO left in the code"], todo.findings
    assert todo.pre_existing == ["calc.py:1: todo: a TODO left in the code"]
    assert noprint.pre_existing == ["the whole check: it fails at the base commit too"]
    assert "`todo`" in first.reason and "`noprint`" not in first.reason
    todo, noprint = second.checks
    assert second.cause == "passed" and todo.passed and noprint.passed
    assert todo.pre_existing == ["calc.py:1: todo: a TODO left in the code"] and todo.findings == []
    assert todo.baseline == "1 pre-existing (failing at the base commit too)"
