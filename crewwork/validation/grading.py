"""Grading: the pure decision whether one attempt succeeded, from the evidence the platform gathered itself.

The validation activity only gathers evidence (did the diff apply, what did the sandbox report, which bytes
did the test run leave as its report) into a `ValidationEvidence`; `grade` decides. Because `grade` is a pure
function of saved evidence, any attempt can be re-graded later, with a fixed parser or a changed rule, without
re-running it.

The rules, in the order they are applied (the first that matches decides the `Cause`):

1. ``infrastructure``  the platform could not run validation (sandbox did not start, no exit code recorded).
2. ``empty_diff``      the attempt changed nothing.
3. ``patch_failed``    the diff did not apply to a clean checkout of the base commit.
4. ``no_effective_change``  everything the diff changed is protected test infrastructure, which was reset.
5. ``timeout`` / ``oom`` / ``pids`` / ``disk`` / ``signal``  a sandbox cap ended the run (cap flags beat any
   report; ``disk``: the workspace or scratch space filled up).
6. ``command_not_found``  the validation command does not exist or is not executable in the sandbox (the
   submission's fault: the attempt is recorded and fails, it is never an infrastructure retry).
7. ``setup_failed``    a setup command exited non-zero.
8. ``report_unparseable``  no usable report: missing when one was expected, malformed, refused by the host
   (a symlink, a FIFO, a directory, a hard link, over the size bound), or its declared counts contradict its
   test cases.
9. ``no_tests``        the report shows no executed test (collected nothing, or everything skipped).
10. ``exit_mismatch``   exit code and report disagree: exit 0 with failing tests, or a non-zero exit with no
   failing test. Neither an edited report nor a forced exit code alone can fake a pass.
11. ``test_failure``   with ``fail_to_pass``/``pass_to_pass`` lists: a fail_to_pass test did not pass, or a
   pass_to_pass test did not pass (missing from the report or skipped counts as not passing); without lists:
   any failed or errored test.
12-17. When the work item declares a preview (`validation.preview`), the tests passed and the live preview
   decides, by `crewwork.preview.grading.grade_preview`'s rules: ``preview_not_started``, ``preview_limit``,
   ``preview_crashed``, ``preview_not_ready``, ``probe_missing`` (declared probes without evidence: never a
   pass), ``probe_failure``.
18. ``passed``        everything above held: a non-empty diff, passing tests and (where declared) every probe
   passing, measured by the platform.

An agent's own claim of success is never an input here.
"""

from __future__ import annotations

import enum
from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from crewwork.models import (
    ArtifactRef,
    PreviewOutcome,
    ResetPath,
    SandboxReport,
    TestCaseResult,
    ValidationOutcome,
)
from crewwork.models.preview import PreviewSpec
from crewwork.preview.evidence import PreviewEvidence
from crewwork.preview.grading import PreviewVerdict, grade_preview
from crewwork.validation.fingerprint import fingerprint
from crewwork.validation.parsers import ParsedReport, normalize_test_id, parse_report

# Tests carried in a verdict (and so through Temporal): the failing ones first, then listed ones. The full
# per-test results stay in the report artifact and can be re-graded at any time.
MAX_VERDICT_TESTS = 200
MAX_VERDICT_MESSAGE_CHARS = 1_500
MAX_VERDICT_FAILING_IDS = 500
MAX_TAIL_CHARS = 64 * 1024


class Cause(enum.StrEnum):
    """The closed set of verdict causes. Fingerprints and the breaker group failures by these."""

    passed = "passed"
    test_failure = "test_failure"
    no_tests = "no_tests"
    empty_diff = "empty_diff"
    patch_failed = "patch_failed"
    setup_failed = "setup_failed"
    timeout = "timeout"
    oom = "oom"
    pids = "pids"
    disk = "disk"
    signal = "signal"
    command_not_found = "command_not_found"
    no_effective_change = "no_effective_change"
    report_unparseable = "report_unparseable"
    exit_mismatch = "exit_mismatch"
    infrastructure = "infrastructure"
    preview_not_started = "preview_not_started"
    preview_limit = "preview_limit"
    preview_crashed = "preview_crashed"
    preview_not_ready = "preview_not_ready"
    probe_missing = "probe_missing"
    probe_failure = "probe_failure"


class ValidationEvidence(BaseModel):
    """Everything grading looks at, as gathered by the validation activity. Serialisable (bytes as base64)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")

    diff_nonempty: bool = Field(description="The attempt's diff changes at least one file.")
    patch_applied: bool = Field(
        default=True, description="The diff applied cleanly to a fresh checkout of the base commit."
    )
    exit_code: int | None = Field(default=None, description="Exit code of the test command; None if none exists.")
    timed_out: bool = Field(default=False, description="The sandbox's wall-clock cap ended the run.")
    oom_killed: bool = Field(default=False, description="The sandbox's memory cap killed the run.")
    pids_limited: bool = Field(default=False, description="The sandbox's process cap was hit.")
    disk_limited: bool = Field(default=False, description="The workspace or scratch space filled up (disk cap).")
    command_not_found: bool = Field(
        default=False, description="The test command does not exist or is not executable inside the sandbox."
    )
    effective_change: bool = Field(
        default=True, description="Something the diff changed survived the reset of protected test infrastructure."
    )
    protected_reset: list[str] = Field(
        default_factory=list, description="`path (why)` of each protected path reset before the run."
    )
    report_refused: str | None = Field(
        default=None, description="Why the host refused to read the report (symlink, FIFO, directory, size ...)."
    )
    killed_by_signal: int | None = Field(default=None, description="Signal number that killed the test command.")
    setup_exit_code: int | None = Field(
        default=None,
        description="Exit code of the first failing setup command; None or 0 when setup was fine.",
    )
    infrastructure_error: str | None = Field(
        default=None, description="Why the platform could not run validation at all (not the agent's fault)."
    )
    report: bytes | None = Field(
        default=None, description="The raw machine-readable report the test run wrote; None if it wrote none."
    )
    report_format: str | None = Field(
        default="junit",
        description="Parser name (a key of PARSERS) for `report`. None: no report expected, so the pytest "
        "terminal summary in `stdout_tail` is parsed instead.",
    )
    stdout_tail: str = Field(default="", description="Bounded tail of the test command's stdout.")
    stderr_tail: str = Field(default="", description="Bounded tail of the test command's stderr.")
    fail_to_pass: list[str] = Field(default_factory=list, description="Test ids that must pass after the change.")
    pass_to_pass: list[str] = Field(default_factory=list, description="Test ids that must keep passing.")
    preview_spec: PreviewSpec | None = Field(
        default=None, description="The declared preview and probes; None: the tests alone decide."
    )
    preview: PreviewEvidence | None = Field(
        default=None, description="What the preview showed; None with a declared preview is missing evidence."
    )

    @classmethod
    def from_sandbox(cls, sandbox: SandboxReport, **facts: Any) -> ValidationEvidence:
        """Evidence from a run's `SandboxReport` (exit code, limits hit, bounded output tails) plus `facts`, the
        fields the activity saw around the run (diff_nonempty, report, fail_to_pass, setup_exit_code, ...)."""
        return cls(
            exit_code=sandbox.exit_code,
            timed_out=sandbox.timed_out,
            oom_killed=sandbox.oom_killed,
            pids_limited=sandbox.pids_limited,
            disk_limited=sandbox.disk_limited,
            command_not_found=sandbox.command_not_found,
            killed_by_signal=sandbox.killed_by_signal,
            stdout_tail=sandbox.stdout_tail[-MAX_TAIL_CHARS:],
            stderr_tail=sandbox.stderr_tail[-MAX_TAIL_CHARS:],
            **facts,
        )


class Verdict(BaseModel):
    """The decision on one attempt, with the facts it rests on (bounded, so it can travel via Temporal)."""

    model_config = ConfigDict(frozen=True)

    passed: bool = Field(description="True only when cause is `passed`.")
    cause: Cause = Field(description="Which rule decided; see the module docstring.")
    reason: str = Field(description="One human sentence saying why.")
    exit_code: int | None = None
    tests: list[TestCaseResult] = Field(
        default_factory=list,
        description="At most MAX_VERDICT_TESTS results, non-passing and listed tests first.",
    )
    tests_executed: int = Field(default=0, description="Tests that ran (passed, failed or errored).")
    counts: dict[str, int] = Field(default_factory=dict, description="Outcome -> number of tests.")
    failing_tests: list[str] = Field(
        default_factory=list, description="Sorted ids of the tests that made this attempt fail."
    )
    error_signature: str | None = Field(
        default=None, description="A short raw error line for failures without failing tests (fingerprinted)."
    )
    report_format: str | None = Field(default=None, description="Parser whose output was used, if any.")
    fingerprint: str = Field(default="", description="Stable id of this failure mode (see fingerprint.py).")
    preview: PreviewVerdict | None = Field(default=None, description="The preview's own verdict, when it ran.")

    def to_outcome(
        self,
        *,
        sandbox: SandboxReport | None = None,
        log_ref: ArtifactRef | None = None,
        report_ref: ArtifactRef | None = None,
        diagnostics: str | None = None,
        protected_reset: list[ResetPath] | None = None,
        preview: PreviewOutcome | None = None,
    ) -> ValidationOutcome:
        """The `ValidationOutcome` the store and workflow carry."""
        return ValidationOutcome(
            passed=self.passed,
            reason=self.reason,
            cause=self.cause.value,
            exit_code=self.exit_code,
            tests=list(self.tests),
            tests_executed=self.tests_executed,
            sandbox=sandbox,
            log_ref=log_ref,
            report_ref=report_ref,
            diagnostics=diagnostics,
            fingerprint=self.fingerprint or None,
            protected_reset=list(protected_reset or []),
            preview=preview,
        )


def grade(evidence: ValidationEvidence) -> Verdict:
    """Decide one attempt from its evidence. Pure and deterministic; never raises on bad evidence."""
    verdict = _decide(evidence)
    return verdict.model_copy(update={"fingerprint": fingerprint(verdict)})


def _fail(cause: Cause, reason: str, **kw: object) -> Verdict:
    return Verdict(passed=False, cause=cause, reason=reason, **kw)  # type: ignore[arg-type]


def _last_line(*texts: str) -> str | None:
    for text in texts:
        for line in reversed(text.strip().splitlines()):
            if line.strip():
                return line.strip()[:300]
    return None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _decide(ev: ValidationEvidence) -> Verdict:
    verdict = _decide_tests(ev)
    if not verdict.passed or ev.preview_spec is None:
        return verdict
    pv = grade_preview(ev.preview_spec, ev.preview)
    if pv.passed:
        return verdict.model_copy(update={"reason": f"{verdict.reason} {pv.reason}", "preview": pv})
    return verdict.model_copy(
        update={
            "passed": False,
            "cause": Cause(pv.cause),
            "reason": pv.reason,
            "failing_tests": pv.failing,
            "error_signature": pv.signature,
            "preview": pv,
        }
    )


def _decide_tests(ev: ValidationEvidence) -> Verdict:
    signature = _last_line(ev.stderr_tail, ev.stdout_tail)
    if ev.infrastructure_error:
        return _fail(
            Cause.infrastructure,
            f"Validation could not run: {ev.infrastructure_error[:500]}",
            error_signature=ev.infrastructure_error[:300],
        )
    if not ev.diff_nonempty:
        return _fail(Cause.empty_diff, "The attempt changed no files, so there is nothing to validate.")
    if not ev.patch_applied:
        return _fail(
            Cause.patch_failed,
            "The attempt's diff did not apply to a clean checkout of the base commit.",
            error_signature=signature,
        )
    if not ev.effective_change:
        shown = "; ".join(ev.protected_reset[:5]) or "protected paths"
        return _fail(
            Cause.no_effective_change,
            f"The change only touched protected test infrastructure, which was reset to the base commit: {shown}.",
            error_signature="protected: " + ",".join(sorted(r.split(" (", 1)[0] for r in ev.protected_reset))[:280],
        )
    # Caps first: a run that was killed tells us nothing reliable through its report or exit code.
    if ev.timed_out:
        return _fail(
            Cause.timeout,
            "The test run exceeded its wall-clock limit and was stopped.",
            exit_code=ev.exit_code,
        )
    if ev.oom_killed:
        return _fail(Cause.oom, "The test run exceeded its memory limit and was killed.", exit_code=ev.exit_code)
    if ev.pids_limited:
        return _fail(Cause.pids, "The test run hit the sandbox's process limit.", exit_code=ev.exit_code)
    if ev.disk_limited and ev.setup_exit_code not in (None, 0):
        return _fail(
            Cause.disk,
            "A setup command filled the prepared environment's disk before the tests ran (its cap is "
            "CREWWORK_SANDBOX_PREPARE_DISK_MB; the setup log says how much was written).",
        )
    if ev.disk_limited:
        return _fail(
            Cause.disk,
            "The test run filled its workspace or scratch space (disk cap) and could not finish normally.",
            exit_code=ev.exit_code,
        )
    if ev.command_not_found:
        return _fail(
            Cause.command_not_found,
            "The validation command does not exist or is not executable in the sandbox; check "
            "validation.command[0] (this is the submission's, not the agent's, problem).",
            exit_code=ev.exit_code,
            error_signature=signature,
        )
    if ev.killed_by_signal is not None:
        return _fail(
            Cause.signal,
            f"The test run was killed by signal {ev.killed_by_signal}.",
            exit_code=ev.exit_code,
            error_signature=f"signal {ev.killed_by_signal}",
        )
    if ev.setup_exit_code not in (None, 0):
        return _fail(
            Cause.setup_failed,
            f"A setup command exited with code {ev.setup_exit_code} before the tests ran.",
            error_signature=signature,
        )
    if ev.exit_code is None:
        return _fail(Cause.infrastructure, "The test command left no exit code.", error_signature=signature)

    parsed, missing_reason = _parse(ev)
    if missing_reason is not None or not parsed.ok or parsed.inconsistent:
        why = missing_reason or parsed.error or "the report could not be read"
        # Whatever the terminal output shows still helps the next attempt, but it cannot make a pass.
        hint = parsed if parsed.ok else None
        return _fail(
            Cause.report_unparseable,
            f"No trustworthy test report: {why} (exit code {ev.exit_code}).",
            exit_code=ev.exit_code,
            error_signature=why[:300],
            **_test_fields(hint, ev, failing=set()),
        )

    fields = _test_fields(parsed, ev, failing=set())
    if parsed.executed == 0:
        skipped = parsed.counts.get("skipped", 0)
        detail = f"all {_plural(skipped, 'test')} were skipped" if skipped else "no tests were collected"
        return _fail(
            Cause.no_tests,
            f"No tests ran: {detail} (exit code {ev.exit_code}).",
            exit_code=ev.exit_code,
            **fields,
        )

    bad = parsed.not_passing
    if ev.exit_code == 0 and bad > 0:
        failing = {t.id for t in parsed.tests if t.outcome in ("failed", "error")}
        return _fail(
            Cause.exit_mismatch,
            f"The test command exited 0 but its report shows {_plural(bad, 'failing test')}; the two disagree.",
            exit_code=ev.exit_code,
            **_test_fields(parsed, ev, failing=failing),
        )
    if ev.exit_code != 0 and bad == 0:
        return _fail(
            Cause.exit_mismatch,
            f"The test command exited {ev.exit_code} but its report shows no failing test; the two disagree.",
            exit_code=ev.exit_code,
            error_signature=signature,
            **fields,
        )

    if ev.fail_to_pass or ev.pass_to_pass:
        results = parsed.by_id()
        f2p_bad = _not_passing(ev.fail_to_pass, results)
        p2p_bad = _not_passing(ev.pass_to_pass, results)
        failing = set(f2p_bad) | set(p2p_bad)
        if failing:
            parts = []
            if f2p_bad:
                parts.append(f"{len(f2p_bad)} of {len(ev.fail_to_pass)} fail_to_pass tests did not pass")
            if p2p_bad:
                parts.append(f"{len(p2p_bad)} of {len(ev.pass_to_pass)} pass_to_pass tests did not pass")
            first = sorted(failing)[0]
            how = f2p_bad.get(first) or p2p_bad.get(first)
            return _fail(
                Cause.test_failure,
                f"{'; '.join(parts).capitalize()} (first: {first}, {how}).",
                exit_code=ev.exit_code,
                **_test_fields(parsed, ev, failing=failing),
            )
        listed = len(set(ev.fail_to_pass) | set(ev.pass_to_pass))
        return Verdict(
            passed=True,
            cause=Cause.passed,
            reason=f"All {_plural(listed, 'listed test')} passed ({parsed.executed} tests ran, exit code "
            f"{ev.exit_code}).",
            exit_code=ev.exit_code,
            **fields,
        )

    if bad > 0:
        failing = {t.id for t in parsed.tests if t.outcome in ("failed", "error")}
        return _fail(
            Cause.test_failure,
            f"{_plural(bad, 'test')} of {parsed.executed} failed (exit code {ev.exit_code}).",
            exit_code=ev.exit_code,
            **_test_fields(parsed, ev, failing=failing),
        )
    return Verdict(
        passed=True,
        cause=Cause.passed,
        reason=f"All {_plural(parsed.executed, 'test')} passed with exit code 0.",
        exit_code=ev.exit_code,
        **fields,
    )


def _parse(ev: ValidationEvidence) -> tuple[ParsedReport, str | None]:
    """The report to judge by, and a reason if the expected report is missing."""
    if ev.report_format is None:
        return parse_report("pytest_terminal", ev.stdout_tail), None
    if ev.report_refused is not None:
        fallback = parse_report("pytest_terminal", ev.stdout_tail)
        return fallback, f"the host refused to read the report: {ev.report_refused}"
    if ev.report is None:
        # Still read the terminal output for the diagnostics, but a missing expected report never passes.
        fallback = parse_report("pytest_terminal", ev.stdout_tail)
        return fallback, f"the expected {ev.report_format} report was not written"
    return parse_report(ev.report_format, ev.report), None


def _not_passing(ids: list[str], results: dict[str, TestCaseResult]) -> dict[str, str]:
    bad: dict[str, str] = {}
    for raw in ids:
        test_id = normalize_test_id(raw)
        result = results.get(test_id)
        if result is None:
            bad[test_id] = "missing from the report"
        elif result.outcome != "passed":
            bad[test_id] = result.outcome
    return bad


class _TestFields(TypedDict, total=False):
    tests: list[TestCaseResult]
    tests_executed: int
    counts: dict[str, int]
    failing_tests: list[str]
    report_format: str | None


def _test_fields(parsed: ParsedReport | None, ev: ValidationEvidence, *, failing: set[str]) -> _TestFields:
    """Bounded test facts for a verdict: failing tests first, then listed ones, then the rest."""
    if parsed is None:
        return {"failing_tests": sorted(failing)[:MAX_VERDICT_FAILING_IDS]}
    results = parsed.by_id()
    listed = [normalize_test_id(i) for i in (*ev.fail_to_pass, *ev.pass_to_pass)]
    order: list[TestCaseResult] = []
    seen: set[str] = set()

    def take(result: TestCaseResult) -> None:
        if result.id not in seen and len(order) < MAX_VERDICT_TESTS:
            seen.add(result.id)
            order.append(_bounded(result))

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
    }


def _bounded(result: TestCaseResult) -> TestCaseResult:
    if result.message is None or len(result.message) <= MAX_VERDICT_MESSAGE_CHARS:
        return result
    keep = MAX_VERDICT_MESSAGE_CHARS // 2
    return result.model_copy(update={"message": result.message[:keep] + "\n…\n" + result.message[-keep:]})
