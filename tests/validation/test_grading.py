"""Grading from saved evidence: report parsers on real and malformed JUnit files, every rule and cause, and
fingerprint stability. Real pytest reports in tests/fixtures/junit come from generate.py there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from crewwork.models import SandboxReport
from crewwork.validation import parsers
from crewwork.validation.fingerprint import fingerprint, normalize_signature
from crewwork.validation.grading import (
    MAX_VERDICT_TESTS,
    Cause,
    ValidationEvidence,
    Verdict,
    grade,
)
from crewwork.validation.parsers import (
    PARSERS,
    junit_test_id,
    parse_junit,
    parse_pytest_terminal,
    parse_report,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "junit"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def evidence(report: str | bytes | None = "pytest_all_pass.xml", **kw: object) -> ValidationEvidence:
    """Evidence of a clean run unless told otherwise; `report` names a fixture file (or is raw bytes)."""
    data = fixture(report) if isinstance(report, str) else report
    fields: dict[str, object] = {"diff_nonempty": True, "patch_applied": True, "exit_code": 0, "report": data}
    fields.update(kw)
    return ValidationEvidence(**fields)  # type: ignore[arg-type]


MIXED_FAILING = [
    "tests/test_sample.py::TestGroup::test_method_fail",
    "tests/test_sample.py::test_fail",
    "tests/test_sample.py::test_fixture_error",
]


# ---------------------------------------------------------------- parsers


def test_registry_has_junit_and_pytest_terminal_fallback() -> None:
    assert {"junit", "pytest_terminal"} <= set(PARSERS)


@pytest.mark.parametrize("name", ["pytest_mixed.xml", "pytest_mixed_xunit1.xml"])
def test_pytest_junit_report_gives_node_ids_and_outcomes(name: str) -> None:
    report = parse_junit(fixture(name))
    assert report.ok and not report.inconsistent
    outcomes = {t.id: t.outcome for t in report.tests}
    assert outcomes == {
        "tests/test_sample.py::test_pass": "passed",
        "tests/test_sample.py::test_fail": "failed",
        "tests/test_sample.py::TestGroup::test_method_pass": "passed",
        "tests/test_sample.py::TestGroup::test_method_fail": "failed",
        "tests/test_sample.py::test_param[1]": "passed",
        "tests/test_sample.py::test_param[2]": "passed",
        "tests/test_sample.py::test_fixture_error": "error",
        "tests/test_sample.py::test_skipped": "skipped",
        "tests/test_sample.py::test_xfail": "skipped",
    }
    assert report.counts == {"passed": 4, "failed": 2, "error": 1, "skipped": 2}
    assert report.executed == 7


def test_failure_message_keeps_the_assertion() -> None:
    tests = parse_junit(fixture("pytest_mixed.xml")).by_id()
    message = tests["tests/test_sample.py::TestGroup::test_method_fail"].message or ""
    assert "upper-casing went wrong" in message
    assert "assert 'ABC' == 'ABD'" in message
    assert "fixture exploded" in (tests["tests/test_sample.py::test_fixture_error"].message or "")


def test_collection_error_is_an_error_on_the_module_path() -> None:
    report = parse_junit(fixture("pytest_collection_error.xml"))
    assert [(t.id, t.outcome) for t in report.tests] == [("tests/test_broken.py", "error")]
    assert "module_that_does_not_exist" in (report.tests[0].message or "")


def test_generic_junit_with_bare_testsuite_root_keeps_java_names() -> None:
    report = parse_junit(fixture("generic_bare_testsuite.xml"))
    assert report.ok
    assert {t.id: t.outcome for t in report.tests} == {
        "com.example.CalculatorTest::addsNumbers": "passed",
        "com.example.CalculatorTest::dividesByZero": "failed",
        "com.example.CalculatorTest::parsesInput": "error",
        "com.example.CalculatorTest::slowThing": "skipped",
    }


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("truncated.xml", "not well-formed"),
        ("empty.xml", "empty"),
        ("not_xml.xml", "not well-formed"),
        ("billion_laughs.xml", "DOCTYPE"),
        ("external_entity.xml", "DOCTYPE"),
        ("wrong_root.xml", "root element"),
    ],
)
def test_malformed_reports_are_unparseable_not_exceptions(name: str, why: str) -> None:
    report = parse_junit(fixture(name))
    assert not report.ok
    assert why in (report.error or "")
    assert report.tests == ()


def test_entity_bomb_is_refused_quickly_without_expanding() -> None:
    # The refusal happens at the DOCTYPE, before any entity could be expanded.
    report = parse_report("junit", fixture("billion_laughs.xml"))
    assert not report.ok and report.executed == 0


def test_huge_report_is_refused_by_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parsers, "MAX_REPORT_BYTES", 1000)
    report = parse_junit(fixture("pytest_mixed.xml"))
    assert not report.ok and "allowed" in (report.error or "")


def test_kept_test_cases_and_messages_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parsers, "MAX_FAILURES_KEPT", 10)
    cases = "".join(
        f'<testcase classname="tests.test_many" name="test_{i}"><failure message="m">{"x" * 50_000}</failure>'
        "</testcase>"
        for i in range(25)
    )
    report = parse_junit(f'<testsuite name="pytest">{cases}</testsuite>')
    assert report.ok and report.cuts
    assert len(report.tests) == 10
    assert report.counts["failed"] == 25  # counts stay exact beyond the kept list
    assert all(len(t.message or "") <= parsers.MAX_MESSAGE_CHARS + 10 for t in report.tests)


def test_duplicate_test_ids_keep_the_worse_outcome() -> None:
    report = parse_junit(fixture("duplicate_ids.xml"))
    assert [(t.id, t.outcome) for t in report.tests] == [("tests/test_flaky.py::test_sometimes", "failed")]


def test_teardown_error_after_a_failure_keeps_both_messages_and_is_consistent() -> None:
    report = parse_junit(fixture("pytest_teardown_and_xpass.xml"))
    assert report.ok and not report.inconsistent
    tests = report.by_id()
    both = tests["tests/test_edge.py::test_fails_then_teardown_errors"]
    assert both.outcome == "error"
    assert "assert 1 == 2" in (both.message or "") and "teardown exploded" in (both.message or "")
    assert tests["tests/test_edge.py::test_passes_then_teardown_errors"].outcome == "error"
    assert tests["tests/test_edge.py::test_xpass_strict"].outcome == "failed"
    assert tests["tests/test_edge.py::test_xpass_non_strict"].outcome == "passed"


def test_passing_test_with_a_teardown_error_does_not_count_as_passing() -> None:
    verdict = grade(
        evidence(
            "pytest_teardown_and_xpass.xml",
            exit_code=1,
            fail_to_pass=["tests/test_edge.py::test_passes_then_teardown_errors"],
        )
    )
    assert verdict.cause == Cause.test_failure
    assert "error" in verdict.reason


def test_report_whose_declared_counts_exceed_its_cases_is_inconsistent() -> None:
    report = parse_junit(fixture("tampered_counts.xml"))
    assert report.ok and report.inconsistent


def test_unknown_format_is_unparseable() -> None:
    assert not parse_report("tap", b"ok 1").ok


def test_junit_test_id_forms() -> None:
    assert junit_test_id("tests.test_x.TestA", "test_b") == "tests/test_x.py::TestA::test_b"
    assert junit_test_id("test_x", "test_b") == "test_x.py::test_b"
    assert junit_test_id("pkg.mod", "check", pytest_style=True) == "pkg/mod.py::check"
    assert junit_test_id("a.b.Outer.Inner", "t", file="a/b.py") == "a/b.py::Outer::Inner::t"
    assert junit_test_id("com.example.FooTest", "testBar") == "com.example.FooTest::testBar"


@pytest.mark.parametrize(
    "name",
    ["pytest_mixed", "pytest_all_pass", "pytest_skipped_only", "pytest_no_tests", "pytest_collection_error"],
)
def test_terminal_fallback_counts_agree_with_the_junit_report(name: str) -> None:
    terminal = parse_pytest_terminal(fixture(f"{name}.terminal.txt"))
    junit = parse_junit(fixture(f"{name}.xml"))
    assert terminal.ok
    assert terminal.counts == junit.counts
    # Every test the terminal names has the outcome the report gives it.
    by_id = junit.by_id()
    for t in terminal.tests:
        if t.id in by_id:
            assert by_id[t.id].outcome == t.outcome


def test_terminal_fallback_without_summary_line_is_unparseable() -> None:
    assert not parse_pytest_terminal("Traceback (most recent call last):\nboom\n").ok


def test_hostile_terminal_output_is_parsed_in_linear_time() -> None:
    import time

    lines = [
        "1 passed in 1s " + "=" * 200_000 + "x",
        "a" * 100_000 + "::" + "b" * 100_000 + " nope",
        "FAILED " + "c" * 200_000,
        ("x " * 100_000) + "PASSED",
    ]
    started = time.perf_counter()
    report = parse_pytest_terminal("\n".join(lines))
    assert time.perf_counter() - started < 2.0
    assert report.ok and report.counts["passed"] == 1


def test_summary_line_variants() -> None:
    assert parse_pytest_terminal("=== 3 passed, 1 warning in 61.20s (0:01:01) ===").counts["passed"] == 3
    assert parse_pytest_terminal("===== no tests ran in 0.01s =====").executed == 0
    assert parse_pytest_terminal("== 1 failed, 2 deselected in 0.1s ==").counts["failed"] == 1


def test_quiet_summary_line_is_understood() -> None:
    report = parse_pytest_terminal("..F\n1 failed, 2 passed in 0.03s\n")
    assert report.counts == {"passed": 2, "failed": 1, "error": 0, "skipped": 0}


NO_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:schemathesis", "-p", "no:hypothesispytest")


def test_parser_reads_a_report_from_the_installed_pytest(tmp_path: Path) -> None:
    """The fixtures are real pytest output; this guards against a newer pytest changing its report shape."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "test_live.py").write_text(
        "class TestLive:\n    def test_ok(self):\n        pass\n\ndef test_bad():\n    assert 1 == 2, 'live failure'\n"
    )
    proc = subprocess.run(
        # Without the plugins of crewwork's own suite (schemathesis's and hypothesis's cost 1.5 s of CPU a start).
        [sys.executable, "-m", "pytest", "-q", *NO_PLUGINS, "--junitxml=r.xml", "tests"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    verdict = grade(
        evidence(
            (tmp_path / "r.xml").read_bytes(),
            exit_code=proc.returncode,
            fail_to_pass=["tests/test_live.py::test_bad"],
            pass_to_pass=["tests/test_live.py::TestLive::test_ok"],
        )
    )
    assert verdict.cause == Cause.test_failure
    assert verdict.failing_tests == ["tests/test_live.py::test_bad"]
    assert "live failure" in (verdict.tests[0].message or "")


# ---------------------------------------------------------------- grading rules


def test_all_passing_report_with_exit_zero_passes() -> None:
    verdict = grade(evidence())
    assert verdict.passed and verdict.cause == Cause.passed
    assert verdict.tests_executed == 4
    assert verdict.fingerprint.startswith("passed:")


def test_listed_tests_passing_passes_even_if_unlisted_tests_fail() -> None:
    verdict = grade(
        evidence(
            "pytest_mixed.xml",
            exit_code=1,
            fail_to_pass=["tests/test_sample.py::test_pass"],
            pass_to_pass=[
                "tests/test_sample.py::TestGroup::test_method_pass",
                "./tests/test_sample.py::test_param[1]",
            ],
        )
    )
    assert verdict.passed, verdict.reason
    assert "3 listed tests passed" in verdict.reason
    # The lists decide (docs/lifecycle.md, the `passed` row), but the unlisted failures are named, not hidden.
    assert verdict.unlisted_failing == MIXED_FAILING
    assert "3 tests the lists do not name failed, which does not decide (first: " in verdict.reason
    assert verdict.to_outcome().unlisted_failing == MIXED_FAILING


def test_with_lists_an_unlisted_failure_still_needs_an_exit_code_that_agrees() -> None:
    lists = {"fail_to_pass": ["tests/test_sample.py::test_pass"]}
    assert grade(evidence("pytest_mixed.xml", exit_code=0, **lists)).cause == Cause.exit_mismatch
    assert grade(evidence("pytest_all_pass.xml", exit_code=1, **lists)).cause == Cause.exit_mismatch


def test_failing_fail_to_pass_test_fails_with_its_id() -> None:
    verdict = grade(evidence("pytest_mixed.xml", exit_code=1, fail_to_pass=["tests/test_sample.py::test_fail"]))
    assert not verdict.passed and verdict.cause == Cause.test_failure
    assert verdict.failing_tests == ["tests/test_sample.py::test_fail"]
    assert verdict.tests[0].id == "tests/test_sample.py::test_fail"


def test_failing_pass_to_pass_test_fails() -> None:
    verdict = grade(
        evidence(
            "pytest_mixed.xml",
            exit_code=1,
            fail_to_pass=["tests/test_sample.py::test_pass"],
            pass_to_pass=["tests/test_sample.py::TestGroup::test_method_fail"],
        )
    )
    assert verdict.cause == Cause.test_failure
    assert "pass_to_pass" in verdict.reason


def test_listed_test_missing_from_report_counts_as_not_passing() -> None:
    verdict = grade(evidence(fail_to_pass=["tests/test_ok.py::test_that_was_deleted"]))
    assert verdict.cause == Cause.test_failure
    assert "missing from the report" in verdict.reason


def test_listed_test_that_was_skipped_counts_as_not_passing() -> None:
    verdict = grade(evidence("pytest_mixed.xml", exit_code=1, pass_to_pass=["tests/test_sample.py::test_skipped"]))
    assert verdict.cause == Cause.test_failure
    assert verdict.failing_tests == ["tests/test_sample.py::test_skipped"]


def test_failing_tests_without_lists_fail() -> None:
    verdict = grade(evidence("pytest_mixed.xml", exit_code=1))
    assert verdict.cause == Cause.test_failure
    assert verdict.failing_tests == sorted(MIXED_FAILING)
    assert "3 tests of 7 failed" in verdict.reason


def test_collection_error_fails_as_test_failure() -> None:
    verdict = grade(evidence("pytest_collection_error.xml", exit_code=2))
    assert verdict.cause == Cause.test_failure
    assert verdict.failing_tests == ["tests/test_broken.py"]


@pytest.mark.parametrize(
    ("report", "exit_code"),
    [("pytest_no_tests.xml", 5), ("zero_testcases.xml", 0), ("pytest_skipped_only.xml", 0)],
)
def test_no_tests_ran_is_a_failure(report: str, exit_code: int) -> None:
    verdict = grade(evidence(report, exit_code=exit_code))
    assert not verdict.passed and verdict.cause == Cause.no_tests


def test_exit_zero_with_failing_report_is_exit_mismatch() -> None:
    verdict = grade(evidence("pytest_mixed.xml", exit_code=0))
    assert verdict.cause == Cause.exit_mismatch
    assert verdict.failing_tests == sorted(MIXED_FAILING)


def test_nonzero_exit_with_all_pass_report_is_exit_mismatch() -> None:
    """An agent that rewrites the report to all-pass, without also controlling the exit code, gets nothing."""
    verdict = grade(evidence("pytest_all_pass.xml", exit_code=1, stderr_tail="FAIL coverage 80% < 90%"))
    assert verdict.cause == Cause.exit_mismatch


def test_forced_exit_zero_with_lists_satisfied_but_other_failures_is_exit_mismatch() -> None:
    verdict = grade(evidence("pytest_mixed.xml", exit_code=0, fail_to_pass=["tests/test_sample.py::test_pass"]))
    assert verdict.cause == Cause.exit_mismatch


def test_tampered_report_is_not_trusted() -> None:
    verdict = grade(evidence("tampered_counts.xml", exit_code=0))
    assert verdict.cause == Cause.report_unparseable


@pytest.mark.parametrize("name", ["truncated.xml", "empty.xml", "not_xml.xml", "billion_laughs.xml", "wrong_root.xml"])
@pytest.mark.parametrize("exit_code", [0, 1])
def test_malformed_report_never_passes(name: str, exit_code: int) -> None:
    verdict = grade(evidence(name, exit_code=exit_code))
    assert not verdict.passed and verdict.cause == Cause.report_unparseable


def test_every_truncation_of_a_passing_report_fails_without_raising() -> None:
    data = fixture("pytest_all_pass.xml").rstrip()
    complete = len(data)
    for cut in range(0, complete - 1, 7):
        verdict = grade(evidence(data[:cut]))
        assert not verdict.passed, cut


def test_corrupted_reports_never_raise() -> None:
    import random

    rng = random.Random(5)  # fixed seed: a deterministic fuzz, same cases every run
    data = bytearray(fixture("pytest_mixed.xml"))
    for _ in range(300):
        corrupt = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
        verdict = grade(evidence(bytes(corrupt), exit_code=rng.choice([0, 1])))
        assert verdict.cause in set(Cause)
        assert not verdict.passed  # the mixed report has failures; no corruption may turn that into a pass


def test_missing_expected_report_never_passes_but_keeps_terminal_hints() -> None:
    verdict = grade(evidence(None, exit_code=1, stdout_tail=fixture("pytest_mixed.terminal.txt").decode()))
    assert verdict.cause == Cause.report_unparseable
    assert "was not written" in verdict.reason
    assert {t.id for t in verdict.tests if t.outcome != "passed"} >= set(MIXED_FAILING)


def test_missing_expected_report_with_exit_zero_never_passes() -> None:
    verdict = grade(evidence(None, exit_code=0, stdout_tail=fixture("pytest_all_pass.terminal.txt").decode()))
    assert not verdict.passed and verdict.cause == Cause.report_unparseable


def test_terminal_fallback_when_no_report_is_expected() -> None:
    ok = grade(evidence(None, report_format=None, stdout_tail=fixture("pytest_all_pass.terminal.txt").decode()))
    assert ok.passed and ok.report_format == "pytest_terminal"
    bad = grade(
        evidence(None, report_format=None, exit_code=1, stdout_tail=fixture("pytest_mixed.terminal.txt").decode())
    )
    assert bad.cause == Cause.test_failure
    nothing = grade(evidence(None, report_format=None, stdout_tail="all good, trust me\n"))
    assert nothing.cause == Cause.report_unparseable


def test_saved_exit_codes_and_reports_grade_as_pytest_meant() -> None:
    expected = {
        "pytest_all_pass": Cause.passed,
        "pytest_mixed": Cause.test_failure,
        "pytest_mixed_xunit1": Cause.test_failure,
        "pytest_skipped_only": Cause.no_tests,
        "pytest_no_tests": Cause.no_tests,
        "pytest_teardown_and_xpass": Cause.test_failure,
        "pytest_collection_error": Cause.test_failure,
    }
    for name, cause in expected.items():
        exit_code = int(fixture(f"{name}.exit_code"))
        assert grade(evidence(f"{name}.xml", exit_code=exit_code)).cause == cause, name
        terminal = fixture(f"{name}.terminal.txt").decode()
        by_terminal = grade(evidence(None, report_format=None, exit_code=exit_code, stdout_tail=terminal))
        assert by_terminal.cause == cause, name


def test_str_report_and_unknown_format_in_evidence() -> None:
    assert grade(evidence(report_format="tap")).cause == Cause.report_unparseable


def test_empty_diff_fails_even_with_passing_tests() -> None:
    assert grade(evidence(diff_nonempty=False)).cause == Cause.empty_diff


def test_patch_that_did_not_apply_fails() -> None:
    verdict = grade(evidence(patch_applied=False, stderr_tail="error: patch failed: src/app.py:12"))
    assert verdict.cause == Cause.patch_failed
    assert verdict.error_signature == "error: patch failed: src/app.py:12"


@pytest.mark.parametrize(
    ("flags", "cause"),
    [
        ({"timed_out": True}, Cause.timeout),
        ({"oom_killed": True}, Cause.oom),
        ({"pids_limited": True}, Cause.pids),
        ({"killed_by_signal": 9}, Cause.signal),
        ({"timed_out": True, "oom_killed": True, "pids_limited": True}, Cause.timeout),
        ({"oom_killed": True, "killed_by_signal": 9}, Cause.oom),
    ],
)
def test_sandbox_caps_take_precedence_over_a_passing_report(flags: dict[str, object], cause: Cause) -> None:
    verdict = grade(evidence(**flags))
    assert not verdict.passed and verdict.cause == cause


def test_failed_setup_fails() -> None:
    assert grade(evidence(setup_exit_code=1)).cause == Cause.setup_failed


def test_setup_that_filled_its_disk_names_the_prepare_cap() -> None:
    verdict = grade(evidence(setup_exit_code=1, disk_limited=True))
    assert verdict.cause == Cause.disk and "CREWWORK_SANDBOX_PREPARE_DISK_MB" in verdict.reason


def test_infrastructure_error_and_missing_exit_code_are_infrastructure() -> None:
    assert grade(evidence(infrastructure_error="sandbox image not found")).cause == Cause.infrastructure
    assert grade(evidence(exit_code=None)).cause == Cause.infrastructure


def test_every_cause_is_reachable_and_documented() -> None:
    import crewwork.validation.grading as grading_module

    doc = grading_module.__doc__ or ""
    for cause in Cause:
        assert f"``{cause.value}``" in doc


def test_verdict_is_bounded_for_temporal_payloads() -> None:
    cases = "".join(
        f'<testcase classname="tests.test_big" name="test_{i}"><failure message="m">{"y" * 10_000}</failure></testcase>'
        for i in range(1000)
    )
    verdict = grade(evidence(f'<testsuite name="pytest">{cases}</testsuite>'.encode(), exit_code=1))
    assert verdict.cause == Cause.test_failure
    assert len(verdict.tests) == MAX_VERDICT_TESTS
    assert len(verdict.model_dump_json()) < 512 * 1024


def test_evidence_round_trips_through_json_with_binary_report() -> None:
    ev = evidence(b"\xff\xfe<not utf-8>", exit_code=1)
    again = ValidationEvidence.model_validate_json(ev.model_dump_json())
    assert again == ev
    assert grade(again) == grade(ev)


def test_regrading_saved_evidence_gives_the_same_verdict() -> None:
    ev = evidence("pytest_mixed.xml", exit_code=1, fail_to_pass=["tests/test_sample.py::test_fail"])
    assert grade(ev) == grade(ValidationEvidence.model_validate_json(ev.model_dump_json()))


def test_evidence_from_sandbox_report_and_outcome() -> None:
    sandbox = SandboxReport(backend="bwrap", isolated=True, exit_code=1, duration_s=2.5, stdout_tail="out")
    ev = ValidationEvidence.from_sandbox(
        sandbox,
        diff_nonempty=True,
        report=fixture("pytest_mixed.xml"),
        fail_to_pass=["tests/test_sample.py::test_fail"],
    )
    verdict = grade(ev)
    outcome = verdict.to_outcome(sandbox=sandbox, diagnostics="d")
    assert outcome.cause == "test_failure" and not outcome.passed
    assert outcome.fingerprint == verdict.fingerprint and outcome.exit_code == 1
    assert outcome.tests_executed == 7


# ---------------------------------------------------------------- fingerprints


def test_same_failure_across_attempts_gives_the_same_fingerprint() -> None:
    # Different messages, addresses and line numbers, same failing test: same fingerprint.
    a = (
        b'<testsuite name="pytest"><testcase classname="tests.test_x" name="test_a">'
        b'<failure message="assert 1 == 2">obj at 0x7f00aa; tests/test_x.py:10</failure>'
        b"</testcase></testsuite>"
    )
    b = (
        b'<testsuite name="pytest"><testcase classname="tests.test_x" name="test_a">'
        b'<failure message="assert 3 == 2">obj at 0x7fbbcc; tests/test_x.py:14</failure>'
        b"</testcase></testsuite>"
    )
    fa, fb = grade(evidence(a, exit_code=1)).fingerprint, grade(evidence(b, exit_code=1)).fingerprint
    assert fa == fb
    assert fa.startswith("test_failure:") and len(fa) == len("test_failure:") + 12


def test_different_failing_tests_or_causes_give_different_fingerprints() -> None:
    one = grade(evidence("pytest_mixed.xml", exit_code=1, fail_to_pass=["tests/test_sample.py::test_fail"]))
    two = grade(evidence("pytest_mixed.xml", exit_code=1))
    assert one.fingerprint != two.fingerprint
    assert grade(evidence(timed_out=True)).fingerprint != grade(evidence(oom_killed=True)).fingerprint


def test_fingerprint_does_not_depend_on_failing_test_order() -> None:
    base = Verdict(passed=False, cause=Cause.test_failure, reason="x", failing_tests=["b", "a"])
    assert fingerprint(base) == fingerprint(base.model_copy(update={"failing_tests": ["a", "b"]}))


def test_error_signature_is_normalised() -> None:
    a = "Error at /tmp/crewwork-ws-123/src/app.py line 42: <Foo object at 0x7f3a2b1c> 2026-01-01T10:00:00"
    b = "Error at /var/tmp/other-999/src/app.py line 57: <Foo object at 0x7fffffff> 2026-02-03T11:22:33"
    assert normalize_signature(a) == normalize_signature(b)
    va = Verdict(passed=False, cause=Cause.patch_failed, reason="r", error_signature=a)
    vb = Verdict(passed=False, cause=Cause.patch_failed, reason="other words", error_signature=b)
    assert fingerprint(va) == fingerprint(vb)


def test_error_signature_normal_form_is_readable() -> None:
    line = "Error at /tmp/ws-1/src/app.py line 42: <Foo object at 0x7f3a2b1c>"
    assert normalize_signature(line) == "error at app.py line n: <foo object at <addr>>"


def test_normalising_a_hostile_signature_is_fast() -> None:
    import time

    started = time.perf_counter()
    for text in ("/a.." * 5_000, "a/" * 50_000, "x" * 500_000 + "/", "0x" * 100_000):
        assert len(normalize_signature(text)) <= 200
    assert time.perf_counter() - started < 2.0


def test_fingerprint_is_stable_across_processes() -> None:
    """No hash randomisation: the breaker compares fingerprints written by different workers."""
    code = (
        "from crewwork.validation.grading import Verdict, Cause;"
        "from crewwork.validation.fingerprint import fingerprint;"
        "v = Verdict(passed=False, cause=Cause.test_failure, reason='r', failing_tests=['t::a']);"
        "print(fingerprint(v))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1
    assert outs.pop().strip() == fingerprint(
        Verdict(passed=False, cause=Cause.test_failure, reason="r", failing_tests=["t::a"])
    )
