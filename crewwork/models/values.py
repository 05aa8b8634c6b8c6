"""The values workflows and activities exchange: admission terms, the workflow's input and carry, artifact references,
sandbox and agent outcomes, validation and preview evidence, attempt summaries, status, result and review decisions.

Pydantic models, carried by Temporal's pydantic data converter; large things travel as `ArtifactRef`s."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from crewwork.models.review import ReviewDecision as ReviewDecision
from crewwork.models.review import ReviewRecord
from crewwork.models.scan import ScanOutcome
from crewwork.models.spec import (
    BudgetSpec,
    WorkItemSpec,
    WorkItemState,
)


class AdmissionTerms(BaseModel):
    """An admission decided before the workflow started (crewwork/admission/starts.py: at submission, or when a freed place
    was handed to a queued item): the item is admitted in the store already and runs under these terms."""

    budget: BudgetSpec
    """Its own budget capped by the operator's ceilings (crewwork.models.limits.effective_budget)."""
    review_timeout_s: float | None = None


class WorkItemInput(BaseModel):
    """What the workflow starts with. The spec is already validated and resolved (base commit pinned)."""

    work_item_id: str
    tenant_id: str
    spec: WorkItemSpec
    repo_path: str | None = None
    base_commit: str | None = None
    mock: bool = False
    """The agent is a mock (the scripted agent): known at submission, so every state of the item says so, not only
    the results of attempts that ran."""
    # Carried over by continue-as-new in long repair loops.
    carry: LoopCarry | None = None
    admission: AdmissionTerms | None = None
    """Set when the item was admitted before its workflow started: its first run asks for no admission. Unset (a
    start from before admission at submission, a continued run, CREWWORK_ADMIT_AT_SUBMISSION=false): the workflow's
    own admit step decides, as before."""


class LoopCarry(BaseModel):
    """What a workflow run hands to the next one when it continues as new."""

    next_step: int = 1
    """The next step number: ranks keep rising across runs, so no write of an earlier run can outrank a later one."""
    next_attempt: int = 1
    diagnostics_ref: str | None = None
    review_comment: str | None = None
    started_at_s: float | None = None
    tokens_used: int = 0
    cost_usd: float = 0.0


class ArtifactRef(BaseModel):
    id: str
    name: str
    size: int
    sha256: str
    content_type: str = "text/plain"


class SandboxReport(BaseModel):
    """The sandbox result as evidence (the full logs are artifacts)."""

    backend: str
    isolated: bool
    exit_code: int | None
    duration_s: float
    timed_out: bool = False
    oom_killed: bool = False
    pids_limited: bool = False
    disk_limited: bool = False
    command_not_found: bool = False
    killed_by_signal: int | None = None
    peak_memory_bytes: int | None = None
    enforcement: str = ""
    workspace_disk: str = Field(
        default="", description="The workspace's disk cap: `loop-<N>m` (its own file system of N MiB) or `none`."
    )
    stdout_tail: str = ""
    stderr_tail: str = ""
    spec: dict[str, Any] | None = Field(
        default=None,
        description="What the run was given (crewwork.attestation.sandbox_spec): the runner (backend, image or "
        "interpreter), its limits, its network (none) and what was mounted where. Signed in evidence bundles.",
    )


class AgentOutcome(BaseModel):
    """What an agent run produced. `claims` are the agent's own words and are never evidence."""

    agent: str
    mock: bool
    selected_because: str | None = None
    output: dict[str, Any] | None = None
    diff_ref: ArtifactRef | None = None
    diff_stats: DiffStats | None = None
    claims: str | None = None
    transcript_ref: ArtifactRef | None = None
    sandbox: SandboxReport | None = None
    tokens_used: int = 0
    cost_usd: float = 0.0
    error: str | None = None
    model_transcript_ref: ArtifactRef | None = None
    """The model gateway's transcript of the attempt: every model call, request and answer (secrets masked)."""
    model_calls: int = 0
    """Model calls the gateway answered for this attempt (refused calls not counted)."""


class DiffStats(BaseModel):
    files_changed: int = 0
    insertions: int = 0
    deletions: int = 0
    files: list[str] = Field(
        default_factory=list,
        description="The files changed, at most 500 of them (each name at most 500 characters); `files_changed` "
        "counts them all.",
    )
    ignored: list[str] = Field(
        default_factory=list,
        description="`path: reason` of workspace entries the capture did not take (special files, hard links, "
        ".git entries); never part of the change.",
    )


class TestCaseResult(BaseModel):
    __test__ = False  # not a pytest class
    id: str
    outcome: Literal["passed", "failed", "error", "skipped"]
    message: str | None = None


class ResetPath(BaseModel):
    """One protected path put back before validation, and why."""

    path: str
    action: Literal["restored", "removed"]
    why: str


class EvidenceCut(BaseModel):
    """What a bound cut from the evidence grading reads, and whether what it cut could decide the verdict
    (crewwork.validation.bounded). A decisive cut makes the attempt `not_judged`: never a pass."""

    model_config = ConfigDict(frozen=True)

    what: str = Field(description="What was cut: `junit report`, `passing test cases`, `stdout`, ...")
    bound: str = Field(description="The bound's name: a setting (CREWWORK_...) or a constant (MAX_...).")
    limit: int = Field(description="The bound's value, in `unit`.")
    unit: Literal["bytes", "items", "levels"] = "items"
    seen: int | None = Field(default=None, description="How much there was, when known.")
    kept: int = Field(default=0, description="How much of it was kept.")
    decisive: bool = Field(description="What was dropped could decide the verdict (so it was not judged).")
    why: str = Field(default="", description="One sentence: why the cut matters, or why it cannot.")

    def describe(self) -> str:
        seen = f"{self.seen} {self.unit}" if self.seen is not None else f"more than {self.limit} {self.unit}"
        text = f"{self.what}: {seen}, {self.kept} kept ({self.bound} = {self.limit})"
        return f"{text}; {self.why}" if self.why else text


class ProbeResult(BaseModel):
    """One probe's result, as graded (crewwork.preview.verdict), with its evidence as artifacts."""

    id: str
    kind: str
    passed: bool
    summary: str = ""
    failed: str | None = None
    seen: str | None = None
    console_errors: list[str] = Field(default_factory=list)
    failed_requests: list[str] = Field(default_factory=list)
    transcript_ref: ArtifactRef | None = None
    screenshot_ref: ArtifactRef | None = None
    trace_ref: ArtifactRef | None = None


class PreviewOutcome(BaseModel):
    """The live preview of an attempt's change and its probes (docs/preview.md)."""

    passed: bool
    cause: str
    reason: str
    command: list[str] = Field(default_factory=list)
    detected: str | None = None
    backend: str | None = None
    ready_after_s: float | None = None
    probes: list[ProbeResult] = Field(default_factory=list)
    log_ref: ArtifactRef | None = None
    evidence_ref: ArtifactRef | None = Field(
        default=None, description="The whole PreviewEvidence as JSON: what grading read (re-grade from it)."
    )


class ExtraRun(BaseModel):
    """One more run of the validation command beside the change's own (validation.baseline): the baseline on the
    base commit, or a rerun of the change's tree looking for flaky tests."""

    label: str = Field(description="`baseline` or `rerun N`.")
    cause: str = Field(description="The run's own grading cause; only `passed` and `test_failure` are used.")
    usable: bool
    cached: bool = Field(default=False, description="The baseline came from the cache; it did not run now.")
    cached_from: str | None = Field(default=None, description="On a cache hit: the item and attempt that ran it.")
    log_ref: ArtifactRef | None = Field(default=None, description="The run's log (the cached run's, on a hit).")
    report_ref: ArtifactRef | None = None


class CheckResult(BaseModel):
    """One check's verdict on one attempt, with what it rests on."""

    name: str
    required: bool
    report: str = Field(description="`exit`, `junit` or `sarif`.")
    passed: bool
    cause: str = Field(description="The check's own cause (`passed`, `check_failed`, `test_failure`, `timeout` ...).")
    reason: str
    exit_code: int | None = None
    duration_s: float | None = None
    findings: list[str] = Field(
        default_factory=list,
        description="Failing test ids or `path:line: rule: message` of results (at most MAX_CHECK_FINDINGS).",
    )
    findings_total: int = Field(default=0, description="All failing tests or failing results, however many shown.")
    environment: str | None = Field(default=None, description="The check's own environment, when it has one.")
    pre_existing: list[str] = Field(
        default_factory=list,
        description="Findings that fail at the base commit too (validation.baseline): not the change's; they block "
        "only with `baseline: block`.",
    )
    baseline: str | None = Field(default=None, description="What the check's run on the base commit showed.")
    fingerprint: str | None = None
    log_ref: ArtifactRef | None = None
    report_ref: ArtifactRef | None = None


class ValidationOutcome(BaseModel):
    passed: bool
    reason: str
    cause: str  # "passed" | "test_failure" | "timeout" | "oom" | "pids" | "empty_diff" | "patch_failed" | ...
    exit_code: int | None = None
    tests: list[TestCaseResult] = Field(default_factory=list)
    tests_executed: int = 0
    sandbox: SandboxReport | None = None
    log_ref: ArtifactRef | None = None
    report_ref: ArtifactRef | None = None
    witness_ref: ArtifactRef | None = Field(
        default=None, description="What the outcome witness recorded (its streams, one JSON record a line)."
    )
    diagnostics: str | None = None
    fingerprint: str | None = None
    preview: PreviewOutcome | None = Field(
        default=None, description="The live preview and its probes, when the work item declares them."
    )
    protected_reset: list[ResetPath] = Field(
        default_factory=list,
        description="Protected paths restored to the base commit or removed before the run (at most "
        "MAX_PROTECTED_RESET_SHOWN; `protected_reset_total` counts them all).",
    )
    protected_reset_total: int | None = Field(
        default=None, description="How many protected paths were put back in all (None: as many as listed)."
    )
    cuts: list[EvidenceCut] = Field(
        default_factory=list,
        description="What bounds cut from the evidence this verdict rests on, decisive or not (a decisive cut is "
        "cause `not_judged`).",
    )
    doubts: list[str] = Field(
        default_factory=list,
        description="Why the report was not believed (cause `suspected_tampering`): what the outcome witness saw "
        "differently, or the change's code that reaches into the test runner.",
    )
    runner_reach: list[str] = Field(
        default_factory=list,
        description="`path:line: why: text` of lines the change adds that reach into the test runner (shown even "
        "when the submission allows runner code).",
    )
    unlisted_failing: list[str] = Field(
        default_factory=list,
        description="With fail_to_pass/pass_to_pass lists: failing tests the lists do not name (they do not decide).",
    )
    weakened: list[str] = Field(
        default_factory=list,
        description="`path:line: what: text` of each way the change weakens a check instead of satisfying it (a lint "
        "disable, a type-ignore, a skipped test, a removed assertion, a relaxed checker configuration); never "
        "decisive, shown for review.",
    )
    scan: ScanOutcome | None = Field(
        default=None,
        description="What the security scanners found that the change introduces (validation.scanners; None: none "
        "ran). docs/scanners.md.",
    )
    scan_ref: ArtifactRef | None = Field(
        default=None, description="The scanners' findings as one SARIF 2.1.0 log (baselineState new/unchanged)."
    )
    checks: list[CheckResult] = Field(
        default_factory=list,
        description="Each named check's verdict (validation.checks, docs/checks.md); empty when none is declared.",
    )
    pre_existing: list[str] = Field(
        default_factory=list,
        description="Failing after the change and at the base commit too (validation.baseline): not the change's "
        "fault; they block only with `baseline: block`.",
    )
    flaky: list[str] = Field(
        default_factory=list,
        description="`id: failed in ...; passed in ...` of each test whose outcome differed between runs of the "
        "change's tree: neither passes nor fails the attempt.",
    )
    fixed: list[str] = Field(
        default_factory=list, description="Failing at the base commit, passing after the change: evidence of the fix."
    )
    baseline: str | None = Field(
        default=None, description="What the baseline on the base commit was and whether it was used."
    )
    extra_runs: list[ExtraRun] = Field(
        default_factory=list, description="The baseline run and the reruns, with their logs (evidence)."
    )


class AttemptSummary(BaseModel):
    number: int
    agent: AgentOutcome | None = None
    validation: ValidationOutcome | None = None
    verdict: str = "pending"  # "passed" | "failed" | "error"
    reason: str = ""


class WorkItemStatus(BaseModel):
    """Live status, answered by the workflow query."""

    work_item_id: str
    state: WorkItemState
    attempt: int = 0
    max_attempts: int = 0
    detail: str = ""
    attempts: list[AttemptSummary] = Field(default_factory=list)
    delivery_branch: str | None = None
    landed_commit: str | None = None
    pull_request_url: str | None = None
    review_attempt: int | None = Field(
        default=None,
        description="While awaiting review: the attempt a decision is taken on (its change is what lands).",
    )
    reviews: list[ReviewRecord] = Field(
        default_factory=list, description="This run's latest review decisions (the store's events hold them all)."
    )


class WorkItemResult(BaseModel):
    work_item_id: str
    state: WorkItemState
    reason: str
    attempts: list[AttemptSummary] = Field(default_factory=list)
    output: dict[str, Any] | None = None
    delivery_branch: str | None = None
    landed_commit: str | None = None
    mock: bool = False
    pull_request_url: str | None = None
    review: ReviewRecord | None = Field(
        default=None, description="The decision that ended the review: the approval it landed on, or the rejection."
    )


WorkItemInput.model_rebuild()
AgentOutcome.model_rebuild()
