"""The named checks' grading (crewwork.validation.check_grading): pure, from saved evidence; each report format's rules, the
run's rules first, and how a check's result changes the attempt's verdict."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from crewwork.models import CheckSpec, EnvironmentSpec, EvidenceCut, ValidationSpec
from crewwork.steps.validate.contract import check_environment, validation_budget_s
from crewwork.validation.check_grading import CheckEvidence, check_result, checks_diagnostics, grade_check, with_checks
from crewwork.validation.evidence import ValidationEvidence
from crewwork.validation.verdicts import Cause, Verdict

JUNIT_FAIL = b"""<?xml version="1.0"?><testsuites><testsuite name="s" tests="2" failures="1" errors="0" skipped="0">
<testcase classname="t" name="test_ok"/><testcase classname="t" name="test_bad"><failure message="boom"/></testcase>
</testsuite></testsuites>"""


def run(**kw: Any) -> ValidationEvidence:
    facts: dict[str, Any] = {"diff_nonempty": True, "exit_code": 0, "report_format": None}
    facts.update(kw)
    return ValidationEvidence(**facts)


def spec(**kw: Any) -> CheckSpec:
    return CheckSpec.model_validate({"name": "lint", "command": ["ruff", "check", "."], **kw})


def sarif_log(*results: dict[str, Any], errors: bool = False) -> bytes:
    run_: dict[str, Any] = {"tool": {"driver": {"name": "ruff"}}, "results": list(results)}
    if errors:
        run_["invocations"] = [{"executionSuccessful": False}]
    return json.dumps({"version": "2.1.0", "runs": [run_]}).encode()


def result(level: str | None, path: str = "calc.py", line: int = 3, rule: str = "F401") -> dict[str, Any]:
    r: dict[str, Any] = {
        "ruleId": rule,
        "message": {"text": "`os` imported but unused"},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": path}, "region": {"startLine": line}}}],
    }
    if level is not None:
        r["level"] = level
    return r


SARIF = {"report": "sarif", "report_path": ".crewwork/lint.sarif"}


def test_an_exit_check_passes_on_exit_0_and_fails_otherwise_with_its_last_lines() -> None:
    assert grade_check(CheckEvidence(spec(), run(exit_code=0))).passed
    ce = CheckEvidence(
        spec(), run(exit_code=1, stdout_tail="calc.py:1:8: F401 `os` imported but unused\nFound 1 error.\n")
    )
    v = grade_check(ce)
    assert (v.passed, v.cause, v.exit_code) == (False, Cause.check_failed, 1)
    assert "Found 1 error." in v.reason and v.fingerprint.startswith("check_failed:")
    r = check_result(ce, v)
    assert r.findings == ["calc.py:1:8: F401 `os` imported but unused", "Found 1 error."]


@pytest.mark.parametrize(
    ("facts", "cause"),
    [
        ({"timed_out": True}, Cause.timeout),
        ({"oom_killed": True}, Cause.oom),
        ({"command_not_found": True, "exit_code": 127}, Cause.command_not_found),
        ({"setup_exit_code": 2}, Cause.setup_failed),
        ({"exit_code": None}, Cause.infrastructure),
        ({"killed_by_signal": 9, "exit_code": None}, Cause.signal),
    ],
)
def test_the_runs_rules_come_first_whatever_the_exit_code(facts: dict[str, Any], cause: Cause) -> None:
    for report in ({}, SARIF):
        v = grade_check(CheckEvidence(spec(**report), run(**{"exit_code": 0, **facts}), sarif=sarif_log()))
        assert not v.passed and v.cause == cause, (report, v)


def test_a_sarif_check_fails_on_an_error_result_and_names_it() -> None:
    ce = CheckEvidence(spec(**SARIF), run(exit_code=1), sarif=sarif_log(result("error"), result("note", line=9)))
    v = grade_check(ce)
    assert (v.passed, v.cause) == (False, Cause.check_failed)
    assert v.failing_tests == ["calc.py:3: F401: `os` imported but unused"]
    assert check_result(ce, v).findings == v.failing_tests


def test_a_sarif_check_with_lower_levels_only_passes_whatever_its_exit_code() -> None:
    # No level is SARIF's default, "warning".
    v = grade_check(CheckEvidence(spec(**SARIF), run(exit_code=1), sarif=sarif_log(result(None), result("note"))))
    assert v.passed and "2 of lower levels" in v.reason


@pytest.mark.parametrize(
    ("sarif", "refused", "cut", "cause"),
    [
        (None, None, None, Cause.report_unparseable),  # the tool wrote none
        (b"{not json", None, None, Cause.report_unparseable),
        (sarif_log(errors=True), None, None, Cause.report_unparseable),  # the tool says it did not finish
        (None, ".crewwork/lint.sarif: a symbolic link", None, Cause.report_unparseable),
        (sarif_log(), None, None, Cause.check_failed),  # exit 2 with no result: the tool failed
    ],
)
def test_a_sarif_check_without_a_believable_log_never_passes(
    sarif: bytes | None, refused: str | None, cut: EvidenceCut | None, cause: Cause
) -> None:
    v = grade_check(CheckEvidence(spec(**SARIF), run(exit_code=2), sarif=sarif, sarif_refused=refused, sarif_cut=cut))
    assert not v.passed and v.cause == cause, v


def test_a_sarif_log_cut_by_a_bound_is_not_judged_even_with_exit_0() -> None:
    cut = EvidenceCut(what="lint.sarif", bound="MAX_SARIF_BYTES", limit=1, unit="bytes", kept=0, decisive=True, why="x")
    v = grade_check(CheckEvidence(spec(**SARIF), run(exit_code=0), sarif_cut=cut))
    assert (v.passed, v.cause) == (False, Cause.not_judged)


def test_a_junit_check_is_graded_like_the_tests() -> None:
    ce = CheckEvidence(
        spec(report="junit", report_path=".crewwork/py312.xml"),
        run(exit_code=1, report=JUNIT_FAIL, report_format="junit"),
    )
    v = grade_check(ce)
    assert (v.passed, v.cause, v.failing_tests) == (False, Cause.test_failure, ["t::test_bad"])
    # Exit 0 with a failing test in the report is the tests' exit_mismatch: neither alone fakes a pass.
    v = grade_check(CheckEvidence(ce.spec, run(exit_code=0, report=JUNIT_FAIL, report_format="junit")))
    assert (v.passed, v.cause) == (False, Cause.exit_mismatch)


def passed_tests() -> Verdict:
    return Verdict(passed=True, cause=Cause.passed, reason="All 3 tests passed.", exit_code=0)


def results(*pairs: tuple[str, bool, bool]) -> list[Any]:
    out = []
    for name, required, ok in pairs:
        s = spec(name=name, required=required)
        ce = CheckEvidence(s, run(exit_code=0 if ok else 1, stdout_tail="" if ok else f"{name}: a finding"))
        out.append(check_result(ce, grade_check(ce)))
    return out


def test_a_required_check_failing_fails_passing_tests_with_its_own_cause() -> None:
    checks = results(("lint", True, False), ("types", True, True), ("docs", False, False))
    v = with_checks(passed_tests(), checks)
    assert (v.passed, v.cause) == (False, Cause.check_failed)
    assert "`lint`" in v.reason and "`docs`" not in v.reason and "`types`" not in v.reason
    assert v.failing_tests == ["lint: lint: a finding"]
    assert v.fingerprint.startswith("check_failed:")
    # The same failure again has the same fingerprint (the breaker groups by it); another check, another one.
    assert with_checks(passed_tests(), results(("lint", True, False))).fingerprint == v.fingerprint
    assert with_checks(passed_tests(), results(("types", True, False))).fingerprint != v.fingerprint
    text = checks_diagnostics(checks)
    assert text is not None and "`lint` (required)" in text and "`docs` (not required)" in text
    assert "`types`" not in text


def test_a_check_that_is_not_required_never_decides() -> None:
    v = with_checks(passed_tests(), results(("docs", False, False), ("types", True, True)))
    assert v.passed and "Not required, and failed: `docs`" in v.reason
    assert with_checks(passed_tests(), results(("types", True, True))) == passed_tests()


def test_failing_tests_keep_their_own_cause_with_failing_checks_beside_them() -> None:
    failed = Verdict(passed=False, cause=Cause.test_failure, reason="1 test failed.", failing_tests=["t::x"])
    assert with_checks(failed, results(("lint", True, False))) == failed


def test_a_declaration_is_checked_before_anything_runs() -> None:
    base = {"command": ["pytest"]}
    bad = [
        {"checks": [{"name": "Lint", "command": ["x"]}]},
        {"checks": [{"name": "tests", "command": ["x"]}]},
        {"checks": [{"name": "a", "command": [""]}]},
        {"checks": [{"name": "a", "command": ["x"], "report": "sarif"}]},
        {"checks": [{"name": "a", "command": ["x"], "report_path": ".crewwork/a"}]},
        {"checks": [{"name": "a", "command": ["x"]}, {"name": "a", "command": ["y"]}]},
        {
            "junit_path": ".crewwork/j.xml",
            "checks": [{"name": "a", "command": ["x"], "report": "junit", "report_path": ".crewwork/j.xml"}],
        },
        {"checks": [{"name": "a", "command": ["x"], "report": "sarif", "report_path": "../out.sarif"}]},
        {"checks": [{"name": f"c{i}", "command": ["x"]} for i in range(9)]},
        {"checks": [{"name": "a", "command": ["x"], "environment": {"image": "other"}}]},
        {"check_parallel": 0},
    ]
    for extra in bad:
        with pytest.raises(ValidationError):
            ValidationSpec.model_validate({**base, **extra})


def test_a_checks_environment_changes_only_the_interpreter_and_setup_and_the_budget_counts_it() -> None:
    item = EnvironmentSpec(python="/usr/bin/python3", setup=[["pip", "install", "-e", "."]], network=True)
    other = spec(environment={"setup": [["pip", "install", "packaging==24.2"]]})
    env = check_environment(other, item)
    assert env is not None and env.python == "/usr/bin/python3" and env.network
    assert env.setup == [["pip", "install", "packaging==24.2"]]
    assert check_environment(spec(), item) is item
    plain = ValidationSpec(command=["pytest"], timeout_s=100)
    checked = plain.model_copy(
        update={"checks": [spec(), other, spec(name="types", timeout_s=50)], "check_parallel": 2}
    )
    # Two waves of the longest check (its own setup included: 100 + 600 * 2).
    assert validation_budget_s(checked, item) - validation_budget_s(plain, item) == 2 * (100 + 600 * 2)


def failing(report: str, findings: list[str], cause: Cause = Cause.check_failed) -> Verdict:
    return Verdict(passed=False, cause=cause, reason="Failed.", exit_code=1, failing_tests=findings)


def test_against_the_base_only_what_the_change_introduced_fails_a_check() -> None:
    from crewwork.validation.check_grading import CheckBase, against_base, base_facts

    s = spec(**SARIF)
    # The same result at the base, on another line (the change moved it): pre-existing.
    base = base_facts(s, failing("sarif", ["calc.py:3: todo: a TODO"]))
    assert base == CheckBase(usable=True, passed=False, cause="check_failed", failing=["calc.py: todo: a TODO"])
    after = failing("sarif", ["calc.py:9: todo: a TODO", "calc.py:12: todo: another"])
    v, pre, note = against_base(s, after, base, "compare")
    assert (v.passed, v.failing_tests, pre) == (False, ["calc.py:12: todo: another"], ["calc.py:9: todo: a TODO"])
    assert "1 pre-existing" in v.reason and "1 pre-existing" in note
    v, pre, _ = against_base(s, failing("sarif", ["calc.py:9: todo: a TODO"]), base, "compare")
    assert v.passed and v.cause == Cause.passed and pre == ["calc.py:9: todo: a TODO"]
    # `block`: pre-existing failures still fail it (and are named).
    v, pre, _ = against_base(s, failing("sarif", ["calc.py:9: todo: a TODO"]), base, "block")
    assert not v.passed and pre and "baseline: block" in v.reason


def test_an_exit_check_failing_at_the_base_too_is_pre_existing_and_one_passing_there_is_the_changes() -> None:
    from crewwork.validation.check_grading import CheckBase, against_base

    s = spec()
    after = failing("exit", [])
    v, pre, _ = against_base(s, after, CheckBase(usable=True, passed=False, cause="check_failed"), "compare")
    assert v.passed and pre == ["the whole check: it fails at the base commit too"]
    v, pre, note = against_base(s, after, CheckBase(usable=True, passed=True, cause="passed"), "compare")
    assert v == after and pre == [] and "made it fail" in note
    # A base run that a cap stopped is not compared with: the check fails as it would without a baseline.
    v, pre, note = against_base(s, after, CheckBase(usable=False, passed=False, cause="timeout"), "compare")
    assert v == after and pre == [] and "not usable (timeout)" in note


def test_a_junit_checks_tests_are_compared_by_id() -> None:
    from crewwork.validation.check_grading import against_base, base_facts

    s = spec(report="junit", report_path=".crewwork/x.xml")
    base = base_facts(s, failing("junit", ["t::test_old"], Cause.test_failure))
    v, pre, _ = against_base(s, failing("junit", ["t::test_old", "t::test_new"], Cause.test_failure), base, "compare")
    assert not v.passed and v.failing_tests == ["t::test_new"] and pre == ["t::test_old"]
    assert v.fingerprint == with_checks(v, []).fingerprint and v.fingerprint.startswith("test_failure:")


def test_one_more_of_the_same_result_than_at_the_base_is_the_changes() -> None:
    from crewwork.validation.check_grading import against_base, base_facts

    s = spec(**SARIF)
    base = base_facts(s, failing("sarif", ["a.py:1: todo: a TODO"]))
    v, pre, _ = against_base(s, failing("sarif", ["a.py:1: todo: a TODO", "a.py:7: todo: a TODO"]), base, "compare")
    assert not v.passed and v.failing_tests == ["a.py:7: todo: a TODO"] and pre == ["a.py:1: todo: a TODO"]


def test_an_error_result_without_a_location_still_fails_a_sarif_check() -> None:
    unlocated = {"ruleId": "config", "level": "error", "message": {"text": "no configuration found"}}
    v = grade_check(CheckEvidence(spec(**SARIF), run(exit_code=0), sarif=sarif_log(unlocated)))
    assert (v.passed, v.cause) == (False, Cause.check_failed)
    assert v.failing_tests == ["(no location): config: no configuration found"]


def test_a_checks_own_environment_budgets_validation_setup_too() -> None:
    item = EnvironmentSpec(python="/usr/bin/python3", setup=[["pip", "install", "-e", "."]])
    own = spec(environment={"setup": [["pip", "install", "blinker"]]})
    plain = ValidationSpec(command=["pytest"], timeout_s=100, checks=[own])
    with_setup = plain.model_copy(update={"setup": [["make", "fixtures"]]})
    # The check's environment is prepared with validation.setup after its own: one more setup_timeout_s (600) there,
    # and one more validation run for the tests' own setup (100).
    assert validation_budget_s(with_setup, item) - validation_budget_s(plain, item) == 600 + 100


async def test_the_checks_and_the_tests_run_together_and_an_error_reaches_temporal_as_itself() -> None:
    import asyncio

    from temporalio.exceptions import ApplicationError

    from crewwork.steps.validate.check_runs import together

    cancelled = asyncio.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def refused() -> None:
        await asyncio.sleep(0)
        raise ApplicationError("bad input: no", non_retryable=True)

    assert await together(asyncio.sleep(0, "a"), asyncio.sleep(0, "b")) == ["a", "b"]
    with pytest.raises(ApplicationError) as raised:
        await together(slow(), refused())
    assert raised.value.non_retryable and cancelled.is_set(), "the error itself, and the other run cancelled"
