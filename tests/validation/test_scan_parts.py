"""The scanners' parts without Temporal: the dependency read of a real git diff, bounded SARIF reading, what counts as
introduced, the policy, grading and the diagnostics packet; and the kit's runner in a real bwrap sandbox, where a
repository's files cannot shadow the scanners and suppression comments hide nothing. End to end through a crew:
tests/security/test_scanners.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from crewwork.config.sandbox import SandboxSettings
from crewwork.models import WorkItemSpec
from crewwork.models.scan import ScanFinding, ScannersSpec, ScanOutcome
from crewwork.sandbox.backends import SANDBOXES, get_sandbox
from crewwork.sandbox.base import SandboxLimits
from crewwork.steps.validate.scankit import RUNNER, kit_mount
from crewwork.validation.diagnostics import build_diagnostics
from crewwork.validation.evidence import ValidationEvidence
from crewwork.validation.grading import Cause, grade
from crewwork.validation.scanners import sarif
from crewwork.validation.scanners.findings import added_lines, blocking, introduced
from crewwork.validation.scanners.requirements import dependency_changes
from tests.conftest import GIT_ENV, make_repo

PASSING = (Path(__file__).resolve().parents[1] / "fixtures" / "junit" / "pytest_all_pass.xml").read_bytes()


def git_diff(tmp_path: Path, before: dict[str, str], after: dict[str, str]) -> bytes:
    repo = make_repo(tmp_path / "repo", before)
    for rel, text in after.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, env=GIT_ENV)
    return subprocess.run(["git", "diff", "--cached"], cwd=repo, check=True, capture_output=True, env=GIT_ENV).stdout


# ---------------------------------------------------------------- dependencies


def test_requirements_added_or_changed_are_named_with_their_versions(tmp_path: Path) -> None:
    before = {
        "requirements.txt": "# pinned\nrequests==2.30.0\nflask>=2\n",
        "pyproject.toml": '[project]\nname = "app"\nversion = "1.0"\ndependencies = [\n    "httpx>=0.27",\n]\n',
        "setup.cfg": "[options]\ninstall_requires =\n    click>=8\n",
        "requirements/dev.in": "pytest\n",
        "README.md": "requests==9.9.9\n",
    }
    after = {
        "requirements.txt": "# pinned, updated\nrequests==2.31.0\nflask>=2\n-r other.txt\nnumpy==1.26.4  # fast\n",
        "pyproject.toml": '[project]\nname = "app2"\nversion = "1.1"\ndependencies = [\n    "httpx>=0.27",\n'
        "    \"rich[jupyter]>=13; python_version >= '3.11'\",\n]\n",
        "setup.cfg": "[options]\ninstall_requires =\n    click>=8\n    attrs==23.1\nzip_safe = False\n",
        "requirements/dev.in": "pytest\nhypothesis\n",
        "README.md": "requests==10.0.0\n",
        "Pipfile": '[packages]\ndjango = "==5.0"\nanything = "*"\n',
    }
    changes, total = dependency_changes(git_diff(tmp_path, before, after))
    got = {(c.path, c.line, c.message()) for c in changes}
    assert got == {
        ("requirements.txt", 2, "requests changed: ==2.30.0 -> ==2.31.0"),
        ("requirements.txt", 5, "numpy ==1.26.4 added"),
        ("pyproject.toml", 6, 'rich [jupyter]>=13; python_version >= "3.11" added'),
        ("setup.cfg", 4, "attrs ==23.1 added"),
        ("requirements/dev.in", 2, "hypothesis (any version) added"),
        ("Pipfile", 2, "django ==5.0 added"),
        ("Pipfile", 3, "anything (any version) added"),
    }, got
    assert total == len(changes)


def test_a_requirement_only_moved_is_not_a_change(tmp_path: Path) -> None:
    diff = git_diff(tmp_path, {"requirements.txt": "a==1\nb==2\n"}, {"requirements.txt": "b==2\na==1\n"})
    assert dependency_changes(diff) == ([], 0)


# ---------------------------------------------------------------- SARIF


def test_sarif_reading_refuses_what_is_not_a_log_and_bounds_the_rest() -> None:
    assert sarif.parse(b"{not json", default_tool="t").errors == ["t: the SARIF log is not JSON (JSONDecodeError)"]
    bomb = sarif.parse(b"[" * 200_000 + b"]" * 200_000, default_tool="t")
    assert bomb.results == [] and bomb.errors and "not JSON" in bomb.errors[0]
    assert sarif.parse(b'{"version": "2.1.0"}', default_tool="t").errors == ["t: the SARIF log has no runs"]
    result = {
        "ruleId": "R",
        "level": "bogus",
        "message": {"text": "x" * 10_000},
        "locations": [
            {"physicalLocation": {"artifactLocation": {"uri": "file:///workspace/./a.py"}, "region": {"startLine": 3}}}
        ],
    }
    many = {"runs": [{"tool": {"driver": {"name": "mine"}}, "results": [result] * (sarif.MAX_RESULTS + 5)}]}
    parsed = sarif.parse(json.dumps(many).encode(), default_tool="t", roots=("/workspace",))
    assert len(parsed.results) == sarif.MAX_RESULTS and parsed.truncated == 5
    r = parsed.results[0]
    assert (r.tool, r.path, r.line, r.level, len(r.message)) == ("mine", "a.py", 3, "warning", sarif.MAX_TEXT)
    failed = {
        "runs": [
            {
                "invocations": [
                    {"executionSuccessful": False, "toolExecutionNotifications": [{"message": {"text": "boom"}}]}
                ]
            }
        ]
    }
    assert sarif.parse(json.dumps(failed).encode(), default_tool="t").errors == ["t: did not finish: boom"]


def _r(tool: str, rule: str, line: int, fp: str, severity: str | None = None, level: str = "error") -> sarif.Result:
    return sarif.Result(tool, rule, level, "a.py", line, "m", fp, severity=severity)


def test_base_results_cancel_after_results_one_for_one() -> None:
    base = [_r("bandit", "B307", 4, "B307:x")]
    after = [_r("bandit", "B307", 9, "B307:x"), _r("bandit", "B307", 12, "B307:x"), _r("secrets", "AWS", 2, "k")]
    assert [new for _r0, new in introduced(after, base)] == [False, True, True]


def test_the_policy_blocks_secrets_and_bandit_at_or_above_its_severity() -> None:
    spec = ScannersSpec()
    assert blocking(_r("secrets", "AWS", 1, ""), spec)
    assert blocking(_r("bandit", "B602", 1, "", "high"), spec)
    assert not blocking(_r("bandit", "B307", 1, "", "medium"), spec)
    assert blocking(_r("bandit", "B307", 1, "", "medium"), ScannersSpec(python_block_severity="medium"))
    assert not blocking(_r("secrets", "AWS", 1, ""), ScannersSpec(secrets="flag"))
    assert not blocking(_r("dependencies", "dependency-added", 1, ""), spec)
    assert blocking(_r("dependencies", "dependency-added", 1, ""), ScannersSpec(dependencies="block"))
    custom = ScannersSpec.model_validate(
        {"custom": [{"name": "team", "command": ["t"], "sarif_path": "out.sarif", "on_finding": "block"}]}
    )
    assert blocking(_r("team", "X", 1, ""), custom) and not blocking(_r("team", "X", 1, "", level="warning"), custom)


def test_the_spec_is_checked_at_submission() -> None:
    item = {"kind": "code_change", "repo": {"url": "/r"}, "instruction": "x", "validation": {"command": ["pytest"]}}
    assert WorkItemSpec.model_validate(item).validation.scanners is None  # type: ignore[union-attr]
    on = WorkItemSpec.model_validate({**item, "validation": {"command": ["pytest"], "scanners": {}}})
    assert on.validation is not None and on.validation.scanners == ScannersSpec()
    for bad in (
        {"secrets": "maybe"},
        {"custom": [{"name": "bandit", "command": ["x"], "sarif_path": "a.sarif"}]},
        {"custom": [{"name": "ok", "command": ["x"], "sarif_path": "../a.sarif"}]},
        {"timeout_s": 0},
        {"unknown": 1},
    ):
        with pytest.raises(ValidationError):
            WorkItemSpec.model_validate({**item, "validation": {"command": ["pytest"], "scanners": bad}})


def test_added_lines_are_the_new_files_line_numbers(tmp_path: Path) -> None:
    diff = git_diff(tmp_path, {"a.py": "x = 1\ny = 2\n"}, {"a.py": "x = 1\nz = 3\ny = 2\n", "b.py": "q = 1\n"})
    assert added_lines(diff) == {"a.py": {2}, "b.py": {1}}


# ---------------------------------------------------------------- grading


def _scan(*findings: ScanFinding, errors: list[str] | None = None) -> ScanOutcome:
    return ScanOutcome(findings=list(findings), total=len(findings), errors=errors or [], tools=["secrets"])


SECRET = ScanFinding(
    tool="secrets", rule="AWS Access Key", level="error", path="calc.py", line=3, message="m", blocking=True
)
FLAGGED = ScanFinding(
    tool="bandit", rule="B307", level="warning", severity="medium", path="calc.py", line=9, message="eval"
)


def _ev(**kw: object) -> ValidationEvidence:
    return ValidationEvidence(diff_nonempty=True, exit_code=0, report=PASSING, **kw)  # type: ignore[arg-type]


def test_a_blocking_finding_fails_a_passing_run_and_flagged_ones_do_not() -> None:
    blocked = grade(_ev(scan=_scan(SECRET, FLAGGED)))
    assert blocked.cause == Cause.security_finding and not blocked.passed
    assert "calc.py:3: secrets AWS Access Key [blocks]" in blocked.reason
    assert grade(_ev(scan=_scan(FLAGGED))).passed, "a finding the policy does not block is shown, not decisive"
    assert grade(_ev()).passed


def test_failing_tests_keep_their_own_cause_and_carry_the_findings() -> None:
    failing = (Path(__file__).resolve().parents[1] / "fixtures" / "junit" / "pytest_mixed.xml").read_bytes()
    verdict = grade(_ev(scan=_scan(SECRET)).model_copy(update={"report": failing, "exit_code": 1}))
    assert verdict.cause == Cause.test_failure


def test_a_scanner_without_evidence_fails_only_when_required() -> None:
    broken = _scan(errors=["built-in scanners timed out"])
    assert grade(_ev(scan=broken)).passed
    required = grade(_ev(scan=broken, scan_required=True))
    assert required.cause == Cause.scan_failed and "timed out" in required.reason


def test_the_diagnostics_packet_lists_the_findings() -> None:
    ev = _ev(scan=_scan(SECRET, FLAGGED))
    text = build_diagnostics(grade(ev), ev, 1, None)
    assert "What the security scanners found in the change" in text
    assert "- calc.py:3: secrets AWS Access Key [blocks]: m" in text and "calc.py:9: bandit B307" in text


# ---------------------------------------------------------------- the runner in a real sandbox

SHADOWS = {
    # A repository that ships modules named like the scanners' own: with `-I` and the kit first they are never
    # imported (each would make the scan fail or lie).
    "yaml.py": "raise SystemExit('shadowed yaml imported')\n",
    "bandit/__init__.py": "raise SystemExit('shadowed bandit imported')\n",
    "detect_secrets/__init__.py": "raise SystemExit('shadowed detect_secrets imported')\n",
    "sitecustomize.py": "raise SystemExit('sitecustomize imported')\n",
}


async def test_the_runner_in_bwrap_ignores_shadows_and_suppression_comments(tmp_path: Path) -> None:
    ok, why = SANDBOXES["bwrap"].available()
    if not ok:
        pytest.skip(f"bwrap is not available: {why}")
    sandbox = get_sandbox("bwrap", settings=SandboxSettings())
    ws = tmp_path / "ws"
    ws.mkdir()
    for rel, text in SHADOWS.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    (ws / "app.py").write_text(
        'import yaml\nKEY = "AKIAIOSFODNN7EXAMPLQ"  # pragma: allowlist secret\n'
        "data = yaml.load(open('x'))  # nosec\n"
    )
    (ws / "out").mkdir()
    (ws / "out" / "m.json").write_text(
        json.dumps({"after": ["app.py", "yaml.py"], "base": [], "tools": ["secrets", "bandit"], "out": "out/s.sarif"})
    )
    for p in [ws, *ws.rglob("*")]:
        p.chmod(0o777 if p.is_dir() else 0o666)
    mount = kit_mount(tmp_path / "data")
    argv = ["python3", "-I", f"{sandbox.inside(mount)}/{RUNNER}", "out/m.json"]
    run = await sandbox.run(argv, workspace=ws, limits=SandboxLimits(timeout_s=120, memory_mb=1024), mounts=[mount])
    assert run.exit_code == 0, run.stderr[-2000:]
    parsed = sarif.parse((ws / "out" / "s.sarif").read_bytes(), default_tool="t")
    assert parsed.errors == []
    got = {(r.tool, r.rule, r.path, r.line) for r in parsed.results}
    assert ("secrets", "AWS Access Key", "app.py", 2) in got, got
    assert ("bandit", "B506", "app.py", 3) in got, got


def test_sarif_fields_of_the_wrong_type_are_skipped_not_trusted() -> None:
    odd = {
        "runs": [
            {"tool": "x", "invocations": 5, "results": {"a": 1}},
            {"tool": {"driver": []}, "invocations": [{"executionSuccessful": False, "toolExecutionNotifications": 7}]},
            {
                "results": [
                    1,
                    {"locations": "a"},
                    {"locations": [{"physicalLocation": {"artifactLocation": {"uri": 9}}}]},
                ]
            },
        ]
    }
    parsed = sarif.parse(json.dumps(odd).encode(), default_tool="t")
    assert parsed.results == [] and parsed.errors == ["t: did not finish"]


def test_a_worker_without_the_scanners_says_how_to_install_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crewwork.steps.validate import scankit

    monkeypatch.setattr(scankit, "PACKAGES", ("bandit", "no-such-scanner-dist"))
    with pytest.raises(scankit.KitUnavailable, match=r"'no-such-scanner-dist' is not installed.*crewwork\[scanners\]"):
        scankit.ensure_kit(tmp_path)
    assert not (tmp_path / "scanners").exists()


def test_the_kit_is_built_once_read_only_for_others_and_with_bytecode(tmp_path: Path) -> None:
    from crewwork.steps.validate import scankit

    kit = scankit.ensure_kit(tmp_path)
    assert scankit.ensure_kit(tmp_path) == kit and (kit / scankit.READY).is_file()
    assert (kit / scankit.RUNNER).stat().st_mode & 0o777 == 0o644
    assert any((kit / "site" / "bandit").rglob("*.pyc")), "bytecode ships with the kit"
    assert not list((kit / "site").glob("crewwork*")), "nothing of crewwork's own install is in the kit"
