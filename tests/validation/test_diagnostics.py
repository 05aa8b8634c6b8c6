"""The diagnostics packet for the next attempt: what it says, that it is bounded, that it is deterministic."""

from __future__ import annotations

from pathlib import Path

import pytest

from crewwork.models import DiffStats
from crewwork.validation.diagnostics import build_diagnostics
from crewwork.validation.grading import Cause, ValidationEvidence, grade

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "junit"


def mixed_evidence(**kw: object) -> ValidationEvidence:
    fields: dict[str, object] = {
        "diff_nonempty": True,
        "exit_code": 1,
        "report": (FIXTURES / "pytest_mixed.xml").read_bytes(),
        "stdout_tail": (FIXTURES / "pytest_mixed.terminal.txt").read_text(),
        "stderr_tail": "warning: something on stderr\n",
        "fail_to_pass": ["tests/test_sample.py::TestGroup::test_method_fail"],
    }
    fields.update(kw)
    return ValidationEvidence(**fields)  # type: ignore[arg-type]


STATS = DiffStats(files_changed=2, insertions=10, deletions=3, files=["src/b.py", "src/a.py"])


def test_packet_names_attempt_cause_failing_tests_messages_changes_and_output() -> None:
    ev = mixed_evidence()
    text = build_diagnostics(grade(ev), ev, attempt=2, diff_stats=STATS)
    assert "attempt 2" in text
    assert "cause: test_failure" in text
    assert "tests/test_sample.py::TestGroup::test_method_fail (failed)" in text
    assert "upper-casing went wrong" in text  # the assertion message
    assert "2 file(s) changed, +10 -3" in text
    assert text.index("- src/a.py") < text.index("- src/b.py")
    assert "## Output tail (stdout)" in text and "short test summary info" in text
    assert "something on stderr" in text
    assert "Reviewer" not in text


def test_unlisted_failures_are_named_apart_from_the_required_tests() -> None:
    ev = mixed_evidence()
    text = build_diagnostics(grade(ev), ev, attempt=1, diff_stats=STATS)
    assert "## Failing tests (1)" in text
    assert "Also failing, but not required by this work item: tests/test_sample.py::test_fail" in text


def test_reviewer_comment_reaches_the_packet() -> None:
    ev = ValidationEvidence(diff_nonempty=True, exit_code=0, report=(FIXTURES / "pytest_all_pass.xml").read_bytes())
    verdict = grade(ev)
    assert verdict.passed
    text = build_diagnostics(verdict, ev, attempt=1, diff_stats=STATS, review_comment="Please rename foo to bar.")
    assert "## Reviewer's comment\nPlease rename foo to bar." in text
    assert "Result: PASSED" in text


@pytest.mark.parametrize("max_chars", [200, 1_000, 4_000, 16_000])
def test_packet_never_exceeds_its_bound(max_chars: int) -> None:
    cases = "".join(
        f'<testcase classname="tests.test_big" name="test_{i}"><failure message="{"m" * 900}">{"t" * 9_000}'
        "</failure></testcase>"
        for i in range(300)
    )
    ev = mixed_evidence(
        report=f'<testsuite name="pytest">{cases}</testsuite>'.encode(),
        fail_to_pass=[],
        stdout_tail="o" * 60_000,
        stderr_tail="e" * 60_000,
    )
    huge_stats = DiffStats(files_changed=500, files=[f"f{i}.py" for i in range(500)])
    text = build_diagnostics(grade(ev), ev, 7, huge_stats, review_comment="r" * 50_000, max_chars=max_chars)
    assert len(text) <= max_chars
    assert "attempt 7" in text


def test_large_packet_still_shows_failing_tests_and_the_end_of_the_output() -> None:
    ev = mixed_evidence(stdout_tail="noise\n" * 20_000 + "THE LAST LINE\n")
    text = build_diagnostics(grade(ev), ev, 3, STATS)
    assert len(text) <= 16_000
    assert "tests/test_sample.py::TestGroup::test_method_fail" in text
    assert "THE LAST LINE" in text
    assert "earlier output cut" in text


def test_packet_is_deterministic() -> None:
    ev = mixed_evidence()
    verdict = grade(ev)
    assert build_diagnostics(verdict, ev, 4, STATS, "c") == build_diagnostics(verdict, ev, 4, STATS, "c")


@pytest.mark.parametrize(
    ("kw", "cause"),
    [
        ({"timed_out": True}, Cause.timeout),
        ({"oom_killed": True}, Cause.oom),
        ({"pids_limited": True}, Cause.pids),
        ({"diff_nonempty": False}, Cause.empty_diff),
        ({"patch_applied": False}, Cause.patch_failed),
        ({"infrastructure_error": "sandbox did not start"}, Cause.infrastructure),
    ],
)
def test_non_test_causes_explain_themselves(kw: dict[str, object], cause: Cause) -> None:
    ev = mixed_evidence(**kw)
    text = build_diagnostics(grade(ev), ev, 1, None)
    assert f"cause: {cause.value}" in text
    assert "Hint: " in text and len(text.split("Hint: ")[1].split("\n")[0]) > 20
    assert "(no diff statistics recorded)" in text


def test_packet_without_evidence_still_builds() -> None:
    ev = mixed_evidence()
    text = build_diagnostics(grade(ev), None, 1, DiffStats())
    assert "No files changed." in text and "Output tail" not in text
