"""Grading's comparison with the baseline (crewwork.validation.baseline): the rule `test_failure` without lists when
the base commit's run is usable, and the note that says what the baseline was. Part of the pure grading function
(crewwork.validation.grading), kept apart for size; nothing here runs anything. What one extra run gives grading is
`crewwork.validation.grading.run_facts` (it grades the run)."""

from __future__ import annotations

from crewwork.validation.baseline import (
    MAX_BASELINE_SHOWN,
    BaselineEvidence,
    compare,
)
from crewwork.validation.evidence import ValidationEvidence
from crewwork.validation.parsers import ParsedReport
from crewwork.validation.verdict_tests import test_fields as _test_fields
from crewwork.validation.verdicts import Cause, Verdict
from crewwork.validation.verdicts import fail as _fail
from crewwork.validation.verdicts import plural as _plural


def against_baseline(
    ev: ValidationEvidence, parsed: ParsedReport, failing: set[str], base: BaselineEvidence
) -> Verdict:
    """Without lists, with a usable baseline: only the change's regressions fail the attempt (and pre-existing
    failures, when the item asks); flaky tests neither pass nor fail it."""
    passing = {t.id for t in parsed.tests if t.outcome == "passed"}
    cmp = compare(failing, passing, base)
    facts = {
        "pre_existing": cmp.pre_existing[:MAX_BASELINE_SHOWN],
        "flaky": [cmp.flaky_runs[t] for t in cmp.flaky[:MAX_BASELINE_SHOWN]],
        "fixed": cmp.fixed[:MAX_BASELINE_SHOWN],
        "baseline": baseline_note(base),
    }
    besides = _besides(cmp.pre_existing, cmp.flaky, cmp.fixed)
    if cmp.regressions:
        first = cmp.regressions[0]
        return _fail(
            Cause.test_failure,
            f"{_plural(len(cmp.regressions), 'test')} of {parsed.executed} failed that did not fail at the base "
            f"commit: the change's regressions (first: {first}){besides} (exit code {ev.exit_code}).",
            exit_code=ev.exit_code,
            **_test_fields(parsed, ev, failing=set(cmp.regressions)),
            **facts,  # type: ignore[arg-type]
        )
    if cmp.pre_existing and base.mode == "block":
        return _fail(
            Cause.test_failure,
            f"{_plural(len(cmp.pre_existing), 'test')} failed that fail at the base commit too, and the item asks "
            f"that pre-existing failures block (validation.baseline: block; first: {cmp.pre_existing[0]})"
            f"{_besides([], cmp.flaky, cmp.fixed)}.",
            exit_code=ev.exit_code,
            **_test_fields(parsed, ev, failing=set(cmp.pre_existing)),
            **facts,  # type: ignore[arg-type]
        )
    steady = parsed.executed - len(failing)
    if steady <= 0:
        return _fail(
            Cause.test_failure,
            f"No test passed that is not pre-existing or flaky{besides}: nothing shows the change works "
            f"(exit code {ev.exit_code}).",
            exit_code=ev.exit_code,
            **_test_fields(parsed, ev, failing=failing),
            **facts,  # type: ignore[arg-type]
        )
    return Verdict(
        passed=True,
        cause=Cause.passed,
        reason=f"{_plural(steady, 'test')} passed and no test failed that passes at the base commit{besides} "
        f"(exit code {ev.exit_code}).",
        exit_code=ev.exit_code,
        **_test_fields(parsed, ev, failing=set()),
        **facts,  # type: ignore[arg-type]
    )


def _besides(pre_existing: list[str], flaky: list[str], fixed: list[str]) -> str:
    parts = []
    if pre_existing:
        parts.append(f"{_plural(len(pre_existing), 'pre-existing failure')} (failing at the base commit too)")
    if flaky:
        parts.append(f"{_plural(len(flaky), 'flaky test')} (failed, then passed in a rerun of the same tree)")
    if fixed:
        parts.append(f"{_plural(len(fixed), 'test')} fixed (failing at the base commit)")
    return "; " + "; ".join(parts) if parts else ""


def baseline_note(base: BaselineEvidence) -> str:
    """One sentence for the outcome: which baseline, whether it was used, and the reruns."""
    where = f"base commit {base.base_commit[:12]}{' (cached)' if base.cached else ''}"
    rerun_note = ""
    if base.reruns:
        unusable = [r for r in base.reruns if not r.usable]
        rerun_note = f"; {_plural(len(base.reruns), 'rerun')} of the change's tree" + (
            f", {len(unusable)} not usable ({unusable[0].cause}: {unusable[0].reason[:200]})" if unusable else ""
        )
    if not base.base.usable:
        return (
            f"Baseline on {where} not used: it was graded {base.base.cause} ({base.base.reason[:300]}); "
            f"every failing test counts{rerun_note}."
        )
    return (
        f"Baseline on {where}: {_plural(base.base.executed, 'test')} ran, {len(base.base.failing)} failing "
        f"(validation.baseline: {base.mode}){rerun_note}."
    )
