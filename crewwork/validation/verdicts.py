"""The vocabulary of a verdict (crewwork.validation.grading): the closed set of causes, the verdict with the facts it
rests on, and its constructors. Apart from grading so that the parts of the pure grading function kept in other
modules for size (crewwork.validation.comparison) build verdicts without importing grading back."""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field

from crewwork.models import (
    ArtifactRef,
    EvidenceCut,
    ExtraRun,
    PreviewOutcome,
    ResetPath,
    SandboxReport,
    TestCaseResult,
    ValidationOutcome,
)
from crewwork.preview.verdict import PreviewVerdict

# Protected paths an outcome lists (all are counted): a diff may create thousands of bytecode files, and the outcome
# travels through Temporal.
MAX_PROTECTED_RESET_SHOWN = 200


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
    not_judged = "not_judged"
    report_unparseable = "report_unparseable"
    exit_mismatch = "exit_mismatch"
    infrastructure = "infrastructure"
    preview_not_started = "preview_not_started"
    preview_limit = "preview_limit"
    preview_crashed = "preview_crashed"
    preview_not_ready = "preview_not_ready"
    probe_missing = "probe_missing"
    probe_failure = "probe_failure"
    suspected_tampering = "suspected_tampering"
    security_finding = "security_finding"
    scan_failed = "scan_failed"
    check_failed = "check_failed"


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
    cuts: list[EvidenceCut] = Field(
        default_factory=list, description="What bounds cut from the evidence, decisive or not (rule `not_judged`)."
    )
    doubts: list[str] = Field(
        default_factory=list,
        description="Why the report is not believed (rule `suspected_tampering`), at most MAX_DOUBTS; the last says "
        "how many more there were.",
    )
    runner_reach: list[str] = Field(
        default_factory=list, description="Lines the change adds that reach into the test runner, decisive or not."
    )
    weakened: list[str] = Field(
        default_factory=list,
        description="Ways the change weakens a check (a lint disable, a skip ...): never decisive.",
    )
    unlisted_failing: list[str] = Field(
        default_factory=list,
        description="With fail_to_pass/pass_to_pass lists: failing tests the lists do not name (they do not decide).",
    )
    pre_existing: list[str] = Field(
        default_factory=list, description="Failing after the change and at the base commit too (validation.baseline)."
    )
    flaky: list[str] = Field(
        default_factory=list,
        description="`id: failed in ...; passed in ...` of each failing test a rerun of the same tree passed.",
    )
    fixed: list[str] = Field(
        default_factory=list, description="Failing at the base commit, passing after the change: evidence of the fix."
    )
    baseline: str | None = Field(
        default=None, description="What the baseline was and whether it was used (None: no baseline ran)."
    )

    def to_outcome(
        self,
        *,
        sandbox: SandboxReport | None = None,
        log_ref: ArtifactRef | None = None,
        report_ref: ArtifactRef | None = None,
        diagnostics: str | None = None,
        protected_reset: list[ResetPath] | None = None,
        preview: PreviewOutcome | None = None,
        witness_ref: ArtifactRef | None = None,
        extra_runs: list[ExtraRun] | None = None,
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
            witness_ref=witness_ref,
            diagnostics=diagnostics,
            fingerprint=self.fingerprint or None,
            protected_reset=list(protected_reset or [])[:MAX_PROTECTED_RESET_SHOWN],
            protected_reset_total=len(protected_reset)
            if protected_reset and len(protected_reset) > MAX_PROTECTED_RESET_SHOWN
            else None,
            preview=preview,
            cuts=list(self.cuts),
            doubts=list(self.doubts),
            runner_reach=list(self.runner_reach),
            weakened=list(self.weakened),
            unlisted_failing=list(self.unlisted_failing),
            pre_existing=list(self.pre_existing),
            flaky=list(self.flaky),
            fixed=list(self.fixed),
            baseline=self.baseline,
            extra_runs=list(extra_runs or []),
        )


def fail(cause: Cause, reason: str, **kw: object) -> Verdict:
    return Verdict(passed=False, cause=cause, reason=reason, **kw)  # type: ignore[arg-type]


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
