"""The evidence grading looks at: what the validation activity gathered itself around one run (crewwork.steps.validate)
and nothing the agent says. A frozen, serialisable value, so an attempt can be re-graded from it at any time
(crewwork.validation.grading)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from crewwork.models import EvidenceCut, SandboxReport
from crewwork.models.preview import PreviewSpec
from crewwork.models.scan import ScanOutcome
from crewwork.preview.records import PreviewEvidence
from crewwork.validation.baseline import BaselineEvidence

MAX_TAIL_CHARS = 64 * 1024
"""Characters of the test command's stdout and stderr the evidence keeps (their tails)."""


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
    stdout_cut: EvidenceCut | None = Field(
        default=None,
        description="How `stdout_tail` was cut from what the command wrote (None: it is all of it). Whether the cut "
        "decides is the terminal parser's to say (a summary line or a listed test not in the tail).",
    )
    cuts: list[EvidenceCut] = Field(
        default_factory=list,
        description="What bounds cut while the evidence was gathered (a report over the host's size bound is a "
        "decisive cut).",
    )
    stderr_tail: str = Field(default="", description="Bounded tail of the test command's stderr.")
    fail_to_pass: list[str] = Field(default_factory=list, description="Test ids that must pass after the change.")
    pass_to_pass: list[str] = Field(default_factory=list, description="Test ids that must keep passing.")
    witness_expected: bool = Field(
        default=False, description="The command runs pytest, so the outcome witness must have recorded the run."
    )
    witness_streams: dict[str, bytes] | None = Field(
        default=None,
        description="The outcome witness's streams (file name -> bytes) as the run left them; None: not gathered.",
    )
    witness_refused: list[str] = Field(
        default_factory=list, description="Why the host refused to read a witness stream (a link, a FIFO ...)."
    )
    report_path: str | None = Field(
        default=None,
        description="Where the run was told to write its report (validation.junit_path): the witness compares the "
        "sessions that wrote it.",
    )
    changed_paths: list[str] = Field(
        default_factory=list,
        description="Paths the change touched that reach the run (protected ones were put back): a skip raised from "
        "one of them that is not a test is a doubt.",
    )
    runner_reach: list[str] = Field(
        default_factory=list,
        description="`path:line: why: text` of each line the change adds that reaches into the test runner "
        "(crewwork.validation.reach), at most MAX_FINDINGS.",
    )
    runner_reach_total: int = Field(default=0, description="How many such lines there were in all.")
    weakened: list[str] = Field(
        default_factory=list,
        description="`path:line: what: text` of each way the change weakens a check instead of satisfying it "
        "(crewwork.validation.weakening): shown, never decisive.",
    )
    runner_code_allowed: bool = Field(
        default=False,
        description="The submission allows runner code (validation.protect.runner_code: allow): findings are "
        "shown, not doubted.",
    )
    scan: ScanOutcome | None = Field(
        default=None,
        description="What the security scanners found that the change introduces, each finding marked blocking or "
        "not by the policy (crewwork.validation.scanners); None: no scanner ran.",
    )
    scan_required: bool = Field(
        default=False, description="validation.scanners.required: a scanner that gave no evidence fails the attempt."
    )
    preview_spec: PreviewSpec | None = Field(
        default=None, description="The declared preview and probes; None: the tests alone decide."
    )
    preview: PreviewEvidence | None = Field(
        default=None, description="What the preview showed; None with a declared preview is missing evidence."
    )
    baseline: BaselineEvidence | None = Field(
        default=None,
        description="The same command on the base commit, and reruns of the change's tree (validation.baseline); "
        "None: not asked for, or the change's run had no failing test.",
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
