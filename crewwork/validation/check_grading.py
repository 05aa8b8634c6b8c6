"""Grading the named checks (`validation.checks`, docs/checks.md): each check's verdict from its own evidence, and
the attempt's verdict with the checks' results. Pure functions, like `crewwork.validation.grading.grade`, which they
build on: a check's run meets the same rules first (the sandbox's caps, a missing program, a failing setup, the
outcome witness's doubts), then its report format decides:

- ``exit``   exit code 0 passes; any other fails (cause ``check_failed``), with the output's last lines as findings.
- ``junit``  exactly the tests' rules (report parsed, checked against the exit code; a cut that could decide is
  ``not_judged``).
- ``sarif``  a SARIF 2.1.0 log must be there and be read whole (refused: ``report_unparseable``; cut by a bound or
  holding more results than are read: ``not_judged``); a result of level ``error`` fails it (``check_failed``), as
  does a non-zero exit with no result at all (the tool failed); other levels are listed.

A required check that does not pass fails an attempt whose tests passed, with cause ``check_failed`` naming it; one
that is not required is named in the reason and never decides. Checks run only when the change reached the tests
(a diff that does not apply, or one that is all protected, is decided before)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pydantic import BaseModel, Field

from crewwork.models import CheckResult, CheckSpec, EvidenceCut
from crewwork.models.matrix import MAX_CHECK_FINDINGS, CheckEnvironment
from crewwork.validation.evidence import ValidationEvidence
from crewwork.validation.fingerprint import fingerprint
from crewwork.validation.grading import grade
from crewwork.validation.scanners import sarif
from crewwork.validation.verdicts import Cause, Verdict, fail

RUN_RULES = frozenset(
    {
        Cause.infrastructure,
        Cause.empty_diff,
        Cause.patch_failed,
        Cause.no_effective_change,
        Cause.timeout,
        Cause.oom,
        Cause.pids,
        Cause.disk,
        Cause.command_not_found,
        Cause.signal,
        Cause.setup_failed,
        Cause.suspected_tampering,
    }
)
"""Causes the run itself decides, whatever the check's report format says."""

MAX_OUTPUT_LINES = 20
"""Last lines of an `exit` check's output kept as its findings (the whole log is an artifact)."""
MAX_ATTEMPT_FINDINGS = 50
"""Failing checks' findings the attempt's verdict carries in all."""


@dataclass(frozen=True)
class CheckEvidence:
    """What one check's run left: the run's evidence (a JUnit report in it for `junit`), and for `sarif` the log's
    bytes as the host read them, or why it did not."""

    spec: CheckSpec
    run: ValidationEvidence
    sarif: bytes | None = None
    sarif_refused: str | None = None
    sarif_cut: EvidenceCut | None = None


def grade_check(ce: CheckEvidence) -> Verdict:
    """Decide one check from its evidence. Pure and deterministic; never raises on bad evidence."""
    verdict = _decide(ce)
    return verdict.model_copy(update={"fingerprint": fingerprint(verdict)})


def _decide(ce: CheckEvidence) -> Verdict:
    run = grade(ce.run)
    if ce.spec.report == "junit" or run.cause in RUN_RULES:
        return run
    ev, code = ce.run, ce.run.exit_code
    assert code is not None  # grade() decided `infrastructure` otherwise
    if ce.spec.report == "exit":
        if code == 0:
            return Verdict(passed=True, cause=Cause.passed, reason="Exited 0.", exit_code=0)
        last = _output_lines(ev)
        return fail(
            Cause.check_failed,
            f"Exited {code}" + (f": {last[-1]}" if last else "."),
            exit_code=code,
            error_signature=last[-1][:300] if last else f"exit {code}",
        )
    # sarif
    if ce.sarif_refused is not None:
        return fail(Cause.report_unparseable, f"Its SARIF log was refused: {ce.sarif_refused}.", exit_code=code)
    if ce.sarif_cut is not None:
        return fail(Cause.not_judged, f"Its SARIF log was cut: {ce.sarif_cut.describe()}.", exit_code=code)
    if ce.sarif is None:
        return fail(
            Cause.report_unparseable, f"Exited {code} and wrote no SARIF log at {ce.spec.report_path}.", exit_code=code
        )
    parsed = sarif.parse(ce.sarif, default_tool=ce.spec.name, keep_unlocated=True)
    if parsed.errors:
        return fail(Cause.report_unparseable, "; ".join(parsed.errors)[:500], exit_code=code)
    if parsed.truncated:
        return fail(
            Cause.not_judged,
            f"Its SARIF log holds {parsed.truncated} results past the {sarif.MAX_RESULTS} that are read.",
            exit_code=code,
        )
    errors = [_finding(r) for r in parsed.results if r.level == "error"]
    if errors:
        return fail(
            Cause.check_failed,
            f"{len(errors)} result{'s' if len(errors) != 1 else ''} of level error: {errors[0]}",
            exit_code=code,
            failing_tests=sorted(errors),
        )
    if code != 0 and not parsed.results:
        return fail(
            Cause.check_failed,
            f"Exited {code} with no result in its SARIF log (the tool failed).",
            exit_code=code,
            error_signature=f"exit {code}",
        )
    others = len(parsed.results)
    return Verdict(
        passed=True,
        cause=Cause.passed,
        reason="No result of level error" + (f" ({others} of lower levels)." if others else "."),
        exit_code=code,
    )


def _finding(r: sarif.Result) -> str:
    where = f"{r.path}:{r.line}" if r.path else "(no location)"
    return f"{where}: {r.rule}: {r.message}"[:300]


def _output_lines(ev: ValidationEvidence) -> list[str]:
    lines = [ln.rstrip()[:300] for ln in f"{ev.stdout_tail}\n{ev.stderr_tail}".splitlines() if ln.strip()]
    return lines[-MAX_OUTPUT_LINES:]


def check_result(ce: CheckEvidence, verdict: Verdict, **refs: object) -> CheckResult:
    """The result the outcome carries: the verdict, its findings (bounded) and the artifacts' refs."""
    spec = ce.spec
    if verdict.failing_tests:
        findings, total = list(verdict.failing_tests), len(verdict.failing_tests)
    elif not verdict.passed and spec.report == "exit":
        findings = _output_lines(ce.run)
        total = len(findings)
    else:
        findings, total = [], 0
    env = spec.environment
    return CheckResult(
        name=spec.name,
        required=spec.required,
        report=spec.report,
        passed=verdict.passed,
        cause=verdict.cause.value,
        reason=verdict.reason,
        exit_code=verdict.exit_code,
        findings=findings[:MAX_CHECK_FINDINGS],
        findings_total=total,
        environment=_describe_env(env) if env is not None else None,
        fingerprint=verdict.fingerprint or None,
        **refs,  # type: ignore[arg-type]
    )


def _describe_env(env: CheckEnvironment) -> str:
    parts = []
    if env.python:
        parts.append(f"python {env.python}")
    if env.setup is not None:
        parts.append("setup: " + "; ".join(" ".join(a) for a in env.setup)[:200] if env.setup else "no setup")
    return ", ".join(parts) or "the item's"


def with_checks(verdict: Verdict, checks: list[CheckResult]) -> Verdict:
    """The attempt's verdict once its checks are in: a required check that did not pass fails tests that passed."""
    if not checks:
        return verdict
    failing = [c for c in checks if not c.passed and c.required]
    optional = [c for c in checks if not c.passed and not c.required]
    if not verdict.passed:
        return verdict
    if not failing:
        if not optional:
            return verdict
        names = ", ".join(f"`{c.name}`" for c in optional)
        return verdict.model_copy(update={"reason": f"{verdict.reason} Not required, and failed: {names}."})
    said = "; ".join(f"`{c.name}`: {c.reason}" for c in failing)
    findings = [f"{c.name}: {f}" for c in failing for f in c.findings][:MAX_ATTEMPT_FINDINGS]
    update = {
        "passed": False,
        "cause": Cause.check_failed,
        "reason": f"Required check{'s' if len(failing) != 1 else ''} failed: {said}"[:2000],
        "failing_tests": findings,
        "error_signature": "checks: " + ", ".join(f"{c.name}={c.fingerprint}" for c in failing),
    }
    failed = verdict.model_copy(update=update)
    return failed.model_copy(update={"fingerprint": fingerprint(failed)})


def checks_diagnostics(checks: list[CheckResult], max_chars: int = 6000) -> str | None:
    """What the next attempt needs to know of every check that did not pass (required or not), or None."""
    failing = [c for c in checks if not c.passed]
    if not failing:
        return None
    out = ["## Checks that did not pass", ""]
    for c in failing:
        out.append(f"- `{c.name}` ({'required' if c.required else 'not required'}): {c.cause}: {c.reason}")
        if c.pre_existing:
            out.append(f"    (not the change's: {len(c.pre_existing)} failing at the base commit too)")
        out += [f"    {f}" for f in c.findings]
        if c.findings_total > len(c.findings):
            out.append(f"    … and {c.findings_total - len(c.findings)} more")
    text = "\n".join(out)
    return text if len(text) <= max_chars else text[: max_chars - 2] + " …"


class CheckBase(BaseModel):
    """What a check showed on the base commit (validation.baseline), as the store keeps it: whether it can be
    compared with (`usable`: its run was judged by the check's own rules, not stopped by a cap or cut by a bound),
    whether it passed, and its failing tests or results (`path: rule: message`, without the line, which a change
    moves)."""

    usable: bool
    passed: bool
    cause: str
    failing: list[str] = Field(default_factory=list)


def _key(report: str, finding: str) -> str:
    """A finding as compared with the base: a SARIF result without its line number; a test id as it is."""
    if report != "sarif":
        return finding
    path, _, rest = finding.partition(":")
    _line, _, rest = rest.partition(": ")
    return f"{path}: {rest}"


def base_facts(spec: CheckSpec, verdict: Verdict) -> CheckBase:
    usable = verdict.cause in (Cause.passed, Cause.check_failed, Cause.test_failure)
    return CheckBase(
        usable=usable,
        passed=verdict.passed,
        cause=verdict.cause.value,
        failing=sorted(_key(spec.report, f) for f in verdict.failing_tests),
    )


def against_base(spec: CheckSpec, after: Verdict, base: CheckBase, mode: str) -> tuple[Verdict, list[str], str]:
    """A failing check compared with its run on the base commit: what failed there too is pre-existing (it blocks
    only with `baseline: block`), what the change introduced fails it. Returns the verdict, the pre-existing
    findings and a note of what the baseline was. An `exit` check has no findings to compare: failing at the base
    too, the whole check is pre-existing."""
    if base.passed:
        return after, [], "the check passes at the base commit: the change made it fail"
    if not base.usable:
        return after, [], f"its run on the base commit was not usable ({base.cause}): not compared"
    introduced: list[str] = []
    pre: list[str] = []
    if spec.report == "exit":
        pre = ["the whole check: it fails at the base commit too"]
    else:
        # As many of each as the base had are pre-existing; one more of the same result is the change's.
        known = Counter(base.failing)
        for f in after.failing_tests:
            k = _key(spec.report, f)
            if known[k] > 0:
                known[k] -= 1
                pre.append(f)
            else:
                introduced.append(f)
    note = f"{len(pre)} pre-existing (failing at the base commit too)" if spec.report != "exit" else pre[0]
    if introduced or mode == "block":
        reason = f"{after.reason} ({note}{'; baseline: block' if mode == 'block' and not introduced else ''})"
        failed = after.model_copy(update={"reason": reason, "failing_tests": introduced or after.failing_tests})
        return failed.model_copy(update={"fingerprint": fingerprint(failed)}), pre, note
    passed = Verdict(
        passed=True,
        cause=Cause.passed,
        reason=f"Nothing the change introduced; {note}.",
        exit_code=after.exit_code,
    )
    return passed, pre, note
