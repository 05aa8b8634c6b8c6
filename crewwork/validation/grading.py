"""Grading: the pure decision whether one attempt succeeded, from the evidence the platform gathered itself.

The validation activity only gathers evidence (did the diff apply, what did the sandbox report, which bytes
did the test run leave as its report, what the outcome witness recorded) into a `ValidationEvidence`
(crewwork.validation.evidence); `grade` decides. Because `grade` is a pure function of saved evidence, any attempt
can be re-graded later, with a fixed parser or a changed rule, without re-running it.

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
8. ``suspected_tampering``  the outcome witness disagrees with the report or the exit code, could not finish, or
   recorded nothing although the command runs pytest (crewwork.validation.witness); or the change adds code that
   reaches into the test runner (crewwork.validation.reach) and the submission did not allow runner code. Never a
   pass, whatever review is set to; the verdict's `doubts` say why.
9. ``not_judged``      a bound cut evidence that could decide the verdict (crewwork.validation.bounded): the
   report over the host's or the parser's size bound or nested past its depth bound, or terminal output cut
   before its summary line or a listed test. Never a pass; the verdict's `cuts` say what was cut and why.
   (A bound that cuts only what cannot decide, such as passing test cases past a sample whose counts stay
   exact, is recorded in `cuts` and judged normally.)
10. ``report_unparseable``  no usable report: missing when one was expected, malformed, refused by the host
   (a symlink, a FIFO, a directory, a hard link), or its declared counts contradict its test cases.
11. ``no_tests``        the report shows no executed test (collected nothing, or everything skipped).
12. ``exit_mismatch``   exit code and report disagree: exit 0 with failing tests, or a non-zero exit with no
   failing test. Neither an edited report nor a forced exit code alone can fake a pass.
13. ``test_failure``   with ``fail_to_pass``/``pass_to_pass`` lists: a fail_to_pass test did not pass, or a
   pass_to_pass test did not pass (missing from the report or skipped counts as not passing); without lists:
   any failed or errored test. With lists, tests the lists do not name neither pass nor fail the attempt (a failing
   one makes the exit code non-zero, which then agrees with the report); the verdict names them.
   Without lists and with a usable baseline (``validation.baseline``, crewwork.validation.baseline): a failing test
   that failed at the base commit too is ``pre_existing`` (named; it blocks only with ``baseline: block``), one
   that failed in the change's run and passed in a usable rerun of the same tree is ``flaky`` (named; it neither
   passes nor fails the attempt), and only the rest, the change's ``regressions``, fail it; at least one test must
   pass that is neither. A failing base test the change makes pass is named ``fixed``. A baseline that is not
   usable (cut by a bound, not believed, no report) is named in ``baseline`` and changes nothing.
14-19. When the work item declares a preview (`validation.preview`), the tests passed and the live preview
   decides, by `crewwork.preview.verdict.grade_preview`'s rules: ``preview_not_started``, ``preview_limit``,
   ``preview_crashed``, ``preview_not_ready``, ``probe_missing`` (declared probes without evidence: never a
   pass), ``probe_failure``.
20-21. Then the scanners (`validation.scanners`, docs/scanners.md): ``security_finding``, ``scan_failed``.
22. ``check_failed``   then a required named check (`validation.checks`, docs/checks.md) did not pass by its own
   rules (crewwork.validation.check_grading.with_checks, applied to this verdict once the checks are in).
23. ``passed``        everything above held: a non-empty diff, passing tests and (where declared) every probe
   passing, measured by the platform.

An agent's own claim of success is never an input here.
"""

from __future__ import annotations

import dataclasses

from crewwork.models import (
    TestCaseResult,
)
from crewwork.preview.verdict import grade_preview
from crewwork.validation.baseline import MAX_BASELINE_FAILING, RunFacts, usable_baseline
from crewwork.validation.comparison import against_baseline, baseline_note
from crewwork.validation.evidence import ValidationEvidence
from crewwork.validation.fingerprint import fingerprint
from crewwork.validation.parsers import ParsedReport, normalize_test_id, parse_report
from crewwork.validation.scanners.decide import scan_decision
from crewwork.validation.verdict_tests import MAX_VERDICT_FAILING_IDS as MAX_VERDICT_FAILING_IDS
from crewwork.validation.verdict_tests import MAX_VERDICT_MESSAGE_CHARS as MAX_VERDICT_MESSAGE_CHARS
from crewwork.validation.verdict_tests import MAX_VERDICT_TESTS as MAX_VERDICT_TESTS
from crewwork.validation.verdict_tests import test_fields as _test_fields
from crewwork.validation.verdicts import MAX_PROTECTED_RESET_SHOWN as MAX_PROTECTED_RESET_SHOWN
from crewwork.validation.verdicts import Cause as Cause
from crewwork.validation.verdicts import Verdict as Verdict
from crewwork.validation.verdicts import fail as _fail
from crewwork.validation.verdicts import plural as _plural
from crewwork.validation.witness import MAX_DOUBTS, witness_doubts


def grade(evidence: ValidationEvidence) -> Verdict:
    """Decide one attempt from its evidence. Pure and deterministic; never raises on bad evidence."""
    verdict = _decide(evidence)
    return verdict.model_copy(update={"fingerprint": fingerprint(verdict)})


def _last_line(*texts: str) -> str | None:
    for text in texts:
        for line in reversed(text.strip().splitlines()):
            if line.strip():
                return line.strip()[:300]
    return None


def _decide(ev: ValidationEvidence) -> Verdict:
    verdict = _decide_run(ev)
    decided = scan_decision(ev.scan, ev.scan_required) if ev.scan is not None and verdict.passed else None
    if decided is None:
        return verdict
    update = {"passed": False, "cause": Cause(decided[0]), "reason": decided[1], "error_signature": decided[2]}
    return verdict.model_copy(update=update)


def _decide_run(ev: ValidationEvidence) -> Verdict:
    verdict = _decide_tests(ev)
    if ev.baseline is not None and verdict.baseline is None:
        verdict = verdict.model_copy(update={"baseline": baseline_note(ev.baseline)})
    if ev.runner_reach or ev.weakened:
        verdict = verdict.model_copy(update={"runner_reach": ev.runner_reach, "weakened": ev.weakened})
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
    doubts = _doubts(ev, parsed if missing_reason is None and parsed.ok and not parsed.inconsistent else None)
    if doubts:
        kept = doubts[:MAX_DOUBTS]
        if len(doubts) > MAX_DOUBTS:
            kept.append(f"... and {len(doubts) - MAX_DOUBTS} more")
        return _fail(
            Cause.suspected_tampering,
            f"Suspected tampering with the test runner: {doubts[0]}"
            + (f" (and {_plural(len(doubts) - 1, 'more reason')})" if len(doubts) > 1 else "")
            + ". The report is not believed.",
            exit_code=ev.exit_code,
            error_signature=f"tampering: {doubts[0]}"[:300],
            doubts=kept,
            **_test_fields(parsed if parsed.ok else None, ev, failing=set()),
        )
    cuts = [*ev.cuts, *parsed.cuts]
    decisive = [c for c in cuts if c.decisive]
    if decisive:
        shown = "; ".join(c.describe() for c in decisive[:3])
        return _fail(
            Cause.not_judged,
            f"Not judged: a bound cut evidence that could decide the verdict ({shown}).",
            exit_code=ev.exit_code,
            error_signature=f"cut: {', '.join(sorted({c.what for c in decisive}))}"[:300],
            **_test_fields(parsed if parsed.ok else None, ev, failing=set(), cuts=cuts),
        )
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
        unlisted = sorted(t.id for t in parsed.tests if t.outcome in ("failed", "error"))
        note = (
            f"; {_plural(bad, 'test')} the lists do not name failed, which does not decide (first: {unlisted[0]})"
            if bad and unlisted
            else ""
        )
        return Verdict(
            passed=True,
            cause=Cause.passed,
            reason=f"All {_plural(listed, 'listed test')} passed ({parsed.executed} tests ran, exit code "
            f"{ev.exit_code}{note}).",
            exit_code=ev.exit_code,
            unlisted_failing=unlisted[:MAX_VERDICT_FAILING_IDS],
            **fields,
        )

    if bad > 0:
        failing = {t.id for t in parsed.tests if t.outcome in ("failed", "error")}
        base = usable_baseline(ev.baseline)
        # Only when every failing test is known by id: a failure cut from the report could be a regression.
        if base is not None and len(failing) == bad:
            return against_baseline(ev, parsed, failing, base)
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


def _doubts(ev: ValidationEvidence, parsed: ParsedReport | None) -> list[str]:
    """Every reason not to believe the report: the witness's, the host's refusals of it, and (unless the submission
    allows runner code) the lines of the change that reach into the runner."""
    cut = any(c.decisive and c.what.startswith("witness") for c in ev.cuts)
    doubts = [f"the host refused a witness stream: {r}" for r in ev.witness_refused]
    if not cut:
        doubts += witness_doubts(
            expected=ev.witness_expected,
            streams=ev.witness_streams,
            parsed=parsed,
            exit_code=ev.exit_code,
            listed=[*ev.fail_to_pass, *ev.pass_to_pass],
            changed=ev.changed_paths,
            report_path=ev.report_path,
        )
    if ev.runner_reach and not ev.runner_code_allowed:
        doubts.append(
            f"the change adds {_plural(max(ev.runner_reach_total, len(ev.runner_reach)), 'line')} that reach into "
            f"the test runner (first: {ev.runner_reach[0]})"
        )
    return doubts


def _parse(ev: ValidationEvidence) -> tuple[ParsedReport, str | None]:
    """The report to judge by, and a reason if the expected report is missing. The listed tests are kept whatever
    the parser's bounds; terminal output is parsed knowing how it was cut."""
    keep = [*ev.fail_to_pass, *ev.pass_to_pass]
    if ev.report_format is None:
        return parse_report("pytest_terminal", ev.stdout_tail, keep=keep, input_cut=ev.stdout_cut), None
    # A fallback to the terminal output only helps the diagnostics: its cuts never decide (the report does).
    if ev.report_refused is not None:
        fallback = _without_cuts(parse_report("pytest_terminal", ev.stdout_tail))
        return fallback, f"the host refused to read the report: {ev.report_refused}"
    if ev.report is None:
        # Still read the terminal output for the diagnostics, but a missing expected report never passes.
        fallback = _without_cuts(parse_report("pytest_terminal", ev.stdout_tail))
        return fallback, f"the expected {ev.report_format} report was not written"
    return parse_report(ev.report_format, ev.report, keep=keep), None


def _without_cuts(parsed: ParsedReport) -> ParsedReport:
    return dataclasses.replace(parsed, cuts=())


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


def run_facts(ev: ValidationEvidence, label: str, candidates: set[str] | None = None) -> RunFacts:
    """What one extra run (the baseline, or a rerun of the change's tree: `candidates` are the tests to watch)
    gives grading: usable only when graded `passed` or `test_failure` with every failing test known by id."""
    verdict = grade(ev)
    if verdict.cause not in (Cause.passed, Cause.test_failure):
        return RunFacts(label=label, usable=False, cause=verdict.cause.value, reason=verdict.reason)
    parsed, _ = _parse(ev)
    failing = sorted({t.id for t in parsed.tests if t.outcome in ("failed", "error")})
    if len(failing) != parsed.not_passing or len(failing) > MAX_BASELINE_FAILING:
        return RunFacts(
            label=label,
            usable=False,
            cause=Cause.not_judged.value,
            reason=f"{parsed.not_passing} failing tests, {len(failing)} known by id (at most "
            f"MAX_BASELINE_FAILING = {MAX_BASELINE_FAILING} are kept)",
            executed=parsed.executed,
        )
    passed = sorted(t.id for t in parsed.tests if t.outcome == "passed" and t.id in (candidates or set()))
    return RunFacts(
        label=label,
        usable=True,
        cause=verdict.cause.value,
        reason=verdict.reason,
        executed=parsed.executed,
        failing=failing if candidates is None else [t for t in failing if t in candidates],
        passed=passed,
    )
