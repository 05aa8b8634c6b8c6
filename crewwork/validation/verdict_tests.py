"""The tests a verdict carries (crewwork.validation.grading), bounded: it travels through Temporal. The full per-test
results stay in the report artifact and can be re-graded at any time."""

from __future__ import annotations

from typing import TypedDict

from crewwork.models import EvidenceCut, TestCaseResult
from crewwork.validation.evidence import ValidationEvidence
from crewwork.validation.parsers import ParsedReport, normalize_test_id

# Tests carried in a verdict (and so through Temporal): the failing ones first, then listed ones.
MAX_VERDICT_TESTS = 200
MAX_VERDICT_MESSAGE_CHARS = 1_500
MAX_VERDICT_FAILING_IDS = 500


class VerdictTestFields(TypedDict, total=False):
    tests: list[TestCaseResult]
    tests_executed: int
    counts: dict[str, int]
    failing_tests: list[str]
    report_format: str | None
    cuts: list[EvidenceCut]


def test_fields(
    parsed: ParsedReport | None,
    ev: ValidationEvidence,
    *,
    failing: set[str],
    cuts: list[EvidenceCut] | None = None,
) -> VerdictTestFields:
    """Bounded test facts for a verdict: failing tests first, then listed ones, then the rest; and every cut."""
    if cuts is None:
        cuts = [*ev.cuts, *(parsed.cuts if parsed is not None else ())]
    if parsed is None:
        return {"failing_tests": sorted(failing)[:MAX_VERDICT_FAILING_IDS], "cuts": cuts}
    results = parsed.by_id()
    listed = [normalize_test_id(i) for i in (*ev.fail_to_pass, *ev.pass_to_pass)]
    order: list[TestCaseResult] = []
    seen: set[str] = set()

    def take(result: TestCaseResult) -> None:
        if result.id not in seen and len(order) < MAX_VERDICT_TESTS:
            seen.add(result.id)
            order.append(bounded(result))

    for test_id in sorted(failing):
        if test_id in results:
            take(results[test_id])
    for result in parsed.tests:
        if result.outcome in ("failed", "error"):
            take(result)
    for test_id in listed:
        if test_id in results:
            take(results[test_id])
    for result in parsed.tests:
        take(result)
    return {
        "tests": order,
        "tests_executed": parsed.executed,
        "counts": dict(parsed.counts),
        "failing_tests": sorted(failing)[:MAX_VERDICT_FAILING_IDS],
        "report_format": parsed.format,
        "cuts": cuts,
    }


def bounded(result: TestCaseResult) -> TestCaseResult:
    if result.message is None or len(result.message) <= MAX_VERDICT_MESSAGE_CHARS:
        return result
    keep = MAX_VERDICT_MESSAGE_CHARS // 2
    return result.model_copy(update={"message": result.message[:keep] + "\n…\n" + result.message[-keep:]})
