"""Truncated evidence never becomes a pass (crewwork.validation.bounded, rule `not_judged` of the grading): every
bound on what the grading reads keeps what decides (failures, errors and listed tests kept; counts exact; the end of
a command's output kept), and where a bound still cuts what could decide, the verdict is `not_judged`, saying what
was cut and why. Also: the XML parser refuses depth bombs, and a million test cases parse within the bounds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crewwork.models import ResetPath, TestCaseResult
from crewwork.sandbox._proc import OutputCapture
from crewwork.steps.execution import bounded, read_report_bounded
from crewwork.steps.validate.output import stdout_cut
from crewwork.validation import parsers
from crewwork.validation.bounded import Sample
from crewwork.validation.diagnostics import build_diagnostics
from crewwork.validation.grading import MAX_PROTECTED_RESET_SHOWN, Cause, ValidationEvidence, grade
from crewwork.validation.parsers import MAX_CASES, parse_junit, parse_pytest_terminal


def junit(passing: int, failing_at_end: int = 0, *, prefix: str = "t") -> bytes:
    cases = [f'<testcase classname="tests.test_many" name="{prefix}{i}"/>' for i in range(passing)]
    cases += [
        f'<testcase classname="tests.test_many" name="late{i}"><failure message="boom {i}">assert 0</failure>'
        "</testcase>"
        for i in range(failing_at_end)
    ]
    return (
        f'<testsuite name="pytest" tests="{passing + failing_at_end}" failures="{failing_at_end}">'.encode()
        + ("".join(cases) + "</testsuite>").encode()
    )


def evidence(**kw: object) -> ValidationEvidence:
    fields: dict[str, object] = {"diff_nonempty": True, "exit_code": 0}
    fields.update(kw)
    return ValidationEvidence(**fields)  # type: ignore[arg-type]


# ---------------------------------------------------------------- what decides is kept


def test_one_failure_after_sixty_thousand_passes_is_kept_and_named() -> None:
    report = junit(60_000, 1)
    parsed = parse_junit(report)
    assert parsed.counts == {"passed": 60_000, "failed": 1, "error": 0, "skipped": 0}
    assert "tests/test_many.py::late0" in parsed.by_id()  # past MAX_CASES, but a failure: kept
    assert len(parsed.tests) == MAX_CASES + 1
    [cut] = parsed.cuts
    assert cut.bound == "MAX_CASES" and cut.seen == 60_000 and cut.kept == MAX_CASES and not cut.decisive
    verdict = grade(evidence(report=report, exit_code=1))
    assert verdict.cause is Cause.test_failure and verdict.failing_tests == ["tests/test_many.py::late0"]
    assert verdict.tests[0].message == "boom 0\n\nassert 0"  # the failure leads the verdict, with its message
    assert verdict.cuts == [cut]  # recorded, and judged: passing cases past a sample cannot decide


def test_a_listed_test_past_the_sample_is_kept_and_the_attempt_passes() -> None:
    report = junit(60_000)
    listed = "tests/test_many.py::t59999"
    verdict = grade(evidence(report=report, pass_to_pass=[listed], fail_to_pass=["tests/test_many.py::t0"]))
    assert verdict.passed, verdict.reason  # not "missing from the report": listed tests are always kept


def test_failures_past_their_own_bound_are_counted_and_still_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parsers, "MAX_FAILURES_KEPT", 10)
    monkeypatch.setattr(parsers, "MAX_FAILURE_MESSAGES", 3)
    parsed = parse_junit(junit(5, 25))
    assert parsed.counts["failed"] == 25 and len([t for t in parsed.tests if t.outcome == "failed"]) == 10
    assert sum(1 for t in parsed.tests if t.message) == 3
    assert {c.bound for c in parsed.cuts} == {"MAX_FAILURES_KEPT", "MAX_FAILURE_MESSAGES"}
    assert not any(c.decisive for c in parsed.cuts)  # the exact count fails the attempt whatever was kept
    assert grade(evidence(report=junit(5, 25), exit_code=1)).cause is Cause.test_failure


def test_a_huge_failure_message_is_bounded_and_the_test_still_fails() -> None:
    big = "x" * (20 * 1024 * 1024)
    report = (
        f'<testsuite name="pytest"><testcase classname="tests.test_a" name="test_big">'
        f'<failure message="{big[:1_000_000]}">{big}</failure></testcase></testsuite>'
    ).encode()
    verdict = grade(evidence(report=report, exit_code=1))
    assert verdict.cause is Cause.test_failure and verdict.failing_tests == ["tests/test_a.py::test_big"]
    assert len(verdict.tests[0].message or "") <= 2_000


# Writing and parsing a report of a million cases: ~6 s of CPU, run by `make test`.
@pytest.mark.heavy
def test_a_million_test_cases_keep_exact_counts_within_the_bounds() -> None:
    cases = "".join(f'<testcase name="t{i}"/>' for i in range(1_000_000))
    report = f'<testsuite name="suite">{cases}<testcase name="x"><error/></testcase></testsuite>'
    assert len(report) < parsers.MAX_REPORT_BYTES
    parsed = parse_junit(report)
    assert parsed.counts["passed"] == 1_000_000 and parsed.counts["error"] == 1
    assert len(parsed.tests) == MAX_CASES + 1 and parsed.tests[-1].outcome == "error"


# ---------------------------------------------------------------- what a bound cuts is not judged


def test_a_report_over_the_parsers_size_bound_is_not_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parsers, "MAX_REPORT_BYTES", 10_000)
    report = junit(1_000)
    verdict = grade(evidence(report=report))
    assert verdict.cause is Cause.not_judged and not verdict.passed
    [cut] = verdict.cuts
    assert (cut.bound, cut.limit, cut.seen, cut.kept, cut.decisive) == (
        "MAX_REPORT_BYTES",
        10_000,
        len(report),
        0,
        True,
    )
    assert "Not judged" in verdict.reason and "MAX_REPORT_BYTES = 10000" in verdict.reason
    packet = build_diagnostics(verdict, evidence(report=report), 1, None)
    assert "Evidence cut by bounds" in packet and "DECIDES: junit report" in packet


def test_a_report_the_host_did_not_read_for_its_size_is_not_judged(tmp_path: Path) -> None:
    (tmp_path / "report.xml").write_bytes(junit(2_000))
    size = (tmp_path / "report.xml").stat().st_size
    data, refused, cut = read_report_bounded(tmp_path, "report.xml", 4096)
    assert data is None and refused is not None and cut is not None and cut.seen == size and cut.decisive
    verdict = grade(evidence(report=None, report_refused=refused, cuts=[cut], stdout_tail="1 passed in 0.1s\n"))
    assert verdict.cause is Cause.not_judged and verdict.cuts == [cut]


def test_a_report_nested_past_its_depth_bound_is_not_judged() -> None:
    depth = 100_000
    report = b'<testsuite name="x">' * depth + b"</testsuite>" * depth
    verdict = grade(evidence(report=report))
    assert verdict.cause is Cause.not_judged and verdict.cuts[0].bound == "MAX_XML_DEPTH"


def test_terminal_output_cut_before_its_summary_is_not_judged() -> None:
    # A test run that prints more than its log bound, so the sandbox kept its start and end, and the evidence its
    # last 8000 bytes: a summary that is not in the tail could have been cut.
    cut = stdout_cut(b"x" * 20_000, False, 8000, 8 * 1024 * 1024)
    assert cut is not None and not cut.decisive
    ev = evidence(report_format=None, stdout_tail="x" * 8000, stdout_cut=cut)
    verdict = grade(ev)
    assert verdict.cause is Cause.not_judged and verdict.cuts[0].decisive
    # Without a cut the same output is simply unparseable.
    assert grade(evidence(report_format=None, stdout_tail="x")).cause is Cause.report_unparseable


def test_a_listed_test_not_in_the_kept_output_is_not_judged() -> None:
    tail = "tests/test_a.py::test_one PASSED\n==== 2 passed in 0.5s ====\n"
    cut = stdout_cut(b"y" * 50_000 + tail.encode(), False, 8000, 8 * 1024 * 1024)
    listed = ["tests/test_a.py::test_one", "tests/test_a.py::test_two"]
    verdict = grade(evidence(report_format=None, stdout_tail=tail, stdout_cut=cut, pass_to_pass=listed))
    assert verdict.cause is Cause.not_judged and "test_two" in verdict.cuts[0].why
    # Had the whole output been kept, test_two really would be missing: an ordinary failure.
    whole = grade(evidence(report_format=None, stdout_tail=tail, pass_to_pass=listed))
    assert whole.cause is Cause.test_failure
    # And with every listed test in the tail the cut cannot decide: judged.
    verdict = grade(evidence(report_format=None, stdout_tail=tail, stdout_cut=cut, pass_to_pass=listed[:1]))
    assert verdict.passed and verdict.cuts == [cut]


def test_terminal_parse_names_its_cut() -> None:
    parsed = parse_pytest_terminal("garbage\n", input_cut=stdout_cut(b"z" * 9000, True, 8000, 1 << 20))
    assert not parsed.ok and parsed.cuts[0].decisive and parsed.cuts[0].seen is None


# ---------------------------------------------------------------- the end of a log is kept


def test_captured_output_keeps_its_end() -> None:
    capture = OutputCapture(1024)
    for _ in range(10_000):
        capture.add(b"noise " * 20 + b"\n")
    capture.add(b"==== 1 failed, 3 passed in 0.2s ====\n")
    value = capture.value()
    assert capture.truncated and value.endswith(b"==== 1 failed, 3 passed in 0.2s ====\n")
    assert len(value) < 1024 + 100 and b"bytes of output not kept here" in value
    small = OutputCapture(1024)
    small.add(b"all of it\n")
    assert small.value() == b"all of it\n" and not small.truncated


def test_a_stored_log_cut_to_the_artifact_limit_keeps_its_end() -> None:
    log = b"start\n" + b"." * 100_000 + b"\n==== 5 passed in 1s ====\n"
    kept = bounded(log, 4096)
    assert len(kept) <= 4096 and kept.startswith(b"start\n") and kept.endswith(b"==== 5 passed in 1s ====\n")


async def test_a_sandboxed_command_that_floods_its_output_keeps_its_summary(tmp_path: Path) -> None:
    from crewwork.config.sandbox import SandboxLimits, SandboxSettings
    from crewwork.sandbox.backends import SANDBOXES, get_sandbox

    ok, why = SANDBOXES["bwrap"].available()
    if not ok:
        pytest.skip(f"bubblewrap unavailable: {why}")
    sandbox = get_sandbox("bwrap", settings=SandboxSettings())
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chmod(ws, 0o777)
    script = "import sys\nfor _ in range(200_000): print('x' * 99)\nprint('==== 1 failed, 2 passed in 0.1s ====')\n"
    run = await sandbox.run(
        ["python3", "-c", script], workspace=ws, limits=SandboxLimits(timeout_s=60, max_log_bytes=64 * 1024)
    )
    assert run.truncated and run.stdout.rstrip().endswith(b"==== 1 failed, 2 passed in 0.1s ====")
    assert parse_pytest_terminal(run.report(8000).stdout_tail).counts["failed"] == 1


# ---------------------------------------------------------------- protected paths, and the Sample itself


def test_an_outcome_lists_a_bounded_number_of_protected_paths_and_counts_them_all() -> None:
    resets = [ResetPath(path=f"__pycache__/m{i}.pyc", action="removed", why="compiled bytecode") for i in range(5000)]
    outcome = grade(evidence(report=junit(1))).to_outcome(protected_reset=resets)
    assert len(outcome.protected_reset) == MAX_PROTECTED_RESET_SHOWN and outcome.protected_reset_total == 5000
    assert len(outcome.model_dump_json()) < 100_000  # it travels through Temporal


def test_a_sample_keeps_deciding_and_listed_items_and_counts_everything() -> None:
    sample: Sample[TestCaseResult] = Sample(
        what="results",
        deciding=frozenset({"failed"}),
        keep_deciding=2,
        deciding_bound="D",
        keep_rest=3,
        rest_bound="R",
        merge=lambda a, b: b if b.outcome == "failed" else a,
        kind_of=lambda r: r.outcome,
        must_keep=frozenset({"p9"}),
    )
    for i in range(10):
        sample.add(f"p{i}", TestCaseResult(id=f"p{i}", outcome="passed"))
    for i in range(4):
        sample.add(f"f{i}", TestCaseResult(id=f"f{i}", outcome="failed"))
    assert sorted(sample.items) == ["f0", "f1", "p0", "p1", "p2", "p9"]
    assert sample.counts == {"passed": 10, "failed": 4} and sample.dropped == {"passed": 6, "failed": 2}
    assert [(c.bound, c.seen, c.kept) for c in sample.cuts()] == [("D", 4, 2), ("R", 10, 4)]


def test_the_rule_order_is_the_same_in_the_code_and_in_the_docs() -> None:
    import re
    from pathlib import Path

    from crewwork.validation import grading

    causes = {c.value for c in Cause}

    def ordered(tokens: list[str]) -> list[str]:
        return list(dict.fromkeys(t for t in tokens if t in causes))

    in_code = ordered(re.findall(r"``([a-z_]+)``", grading.__doc__ or ""))
    doc = (Path(__file__).resolve().parents[2] / "docs" / "lifecycle.md").read_text()
    table = doc.split("`grade` decides", 1)[1].split("\n\n", 2)[1]
    in_docs = ordered([t for row in table.splitlines() for t in re.findall(r"`([a-z_]+)`", row.split("|")[1])])
    assert set(in_code) == set(in_docs) == causes
    assert in_code == in_docs
