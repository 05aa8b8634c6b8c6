"""The repair loop's carried state and the small pure helpers of WorkItemWorkflow. Workflow code: deterministic."""

from __future__ import annotations

from dataclasses import dataclass, field

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from crewwork.models import (
        AgentOutcome,
        AttemptSummary,
        LoopCarry,
        ReviewRecord,
        ValidationOutcome,
        WorkItemInput,
        WorkItemSpec,
    )
    from crewwork.models.limits import LoopState
    from crewwork.models.review import clean_line, trailer_name


@dataclass
class Workspace:
    key: str
    grant: int | None


@dataclass
class RepairLoop:
    """The repair loop's state: what carries over to the next attempt, and to the next run."""

    attempt: int
    started_at_s: float
    diagnostics: str | None = None
    review_comment: str | None = None
    tokens: int = 0
    cost: float = 0.0
    mock: bool = False
    fingerprints: list[str | None] = field(default_factory=list)

    def spent(self, outcome: AgentOutcome) -> None:
        self.mock = self.mock or outcome.mock
        self.tokens += outcome.tokens_used
        self.cost += outcome.cost_usd

    def failed(self, diagnostics: str) -> None:
        self.attempt += 1
        self.diagnostics = diagnostics
        self.review_comment = None

    def carry(self) -> LoopCarry:
        """What the next run starts from when this one continues as new."""
        return LoopCarry(
            next_attempt=self.attempt,
            diagnostics_ref=self.diagnostics,
            review_comment=self.review_comment,
            started_at_s=self.started_at_s,
            tokens_used=self.tokens,
            cost_usd=self.cost,
        )

    def changes_requested(self, comment: str | None) -> None:
        self.attempt += 1
        self.diagnostics = None
        self.review_comment = comment
        # A reviewer's "no" is not a same-cause failure: it breaks any run the breaker counts.
        self.fingerprints.append(None)

    def state(self, now_s: float) -> LoopState:
        return LoopState(
            attempts_made=self.attempt - 1,
            now_s=now_s,
            started_at_s=self.started_at_s,
            tokens_used=self.tokens,
            cost_usd=self.cost,
            fingerprints=tuple(self.fingerprints),
        )


def slim(summary: AttemptSummary) -> AttemptSummary:
    """The status query keeps summaries small: no test lists or diagnostics, a few of each check's findings."""
    s = summary.model_copy(deep=True)
    if s.validation is not None:
        s.validation.tests = s.validation.tests[:20]
        s.validation.diagnostics = None
        if s.validation.preview is not None:
            s.validation.preview.probes = s.validation.preview.probes[:20]
        for check in s.validation.checks:
            check.findings, check.pre_existing = check.findings[:5], check.pre_existing[:5]
    return s


SUBJECT_MAX_CHARS = 72
"""A landed commit's subject line: the instruction's first line, cut on a word boundary (with `…`) past this."""


def commit_message(inp: WorkItemInput, attempt: int, review: ReviewRecord | None = None) -> str:
    """The landed commit's message: the instruction's first line as its subject (never cut mid-word), what crewwork
    did, and trailers: the work item, and with an approval `Reviewed-by:` naming the reviewer as the console and the
    signed evidence do (one clean line: no reviewer text can add a trailer of its own)."""
    lines = (inp.spec.instruction or "").strip().splitlines()
    title = clean_line(lines[0] if lines else "", SUBJECT_MAX_CHARS) or "change"
    trailers = [f"Crewwork-Work-Item: {inp.work_item_id}", f"Crewwork-Attempt: {attempt}"]
    if review is not None and review.action == "approve":
        trailers.append(f"Reviewed-by: {trailer_name(review)}")
    return (
        f"{title}\n\ncrewwork work item {inp.work_item_id}, validated on attempt {attempt}.\n\n"
        + "\n".join(trailers)
        + "\n"
    )


def submission_fault(validation: ValidationOutcome, spec: WorkItemSpec, attempt: int) -> str | None:
    """Why no further attempt can succeed, when a failed validation says the submission itself is wrong, or None:

    - the test command is a program named without a path (looked up on the sandbox's PATH, which no change to the
      repository alters) that does not exist or is not executable there; a path (`./run_tests.sh`) is left to the
      repair loop, since the agent's change can create the file or make it executable;
    - a setup command does not exist or is not executable: setup runs on the base commit's content, which no
      attempt changes;
    - a required check's program, named without a path, does not exist or is not executable there.

    No change an agent makes can fix either, so the item ends with this reason (naming the command) instead of
    paying for more attempts."""
    if validation.passed:
        return None
    if validation.cause == "check_failed" and spec.validation is not None:
        declared = {c.name: c for c in spec.validation.checks}
        for check in validation.checks:
            program = declared[check.name].command[0] if check.name in declared else "/"
            if check.required and check.cause == "command_not_found" and "/" not in program:
                return (
                    f"check `{check.name}`: `{program[:200]}` does not exist or is not executable in the sandbox: "
                    f"the submission's problem, which no agent attempt can fix; stopped after attempt {attempt}"
                )
    sandbox = validation.sandbox
    if sandbox is None:
        return None
    # A setup command's missing program is the sandbox's command_not_found with 127 (126: not executable); 126/127
    # from a setup that ran a shell is the shell saying the same.
    setup_missing = validation.cause == "setup_failed" and sandbox.exit_code in (126, 127)
    if not (sandbox.command_not_found or setup_missing):
        return None
    said = next((ln.strip() for ln in (sandbox.stderr_tail or "").splitlines() if ln.strip()), "")
    said = f" ({said[:200]})" if said else ""
    after = f"the submission's problem, which no agent attempt can fix; stopped after attempt {attempt}"
    if validation.cause == "command_not_found" and spec.validation is not None:
        program = spec.validation.command[0]
        if "/" in program:
            return None
        return (
            f"validation.command[0] `{program[:200]}` does not exist or is not executable in the sandbox{said}: {after}"
        )
    if setup_missing:
        setup = [
            *(spec.environment.setup if spec.environment else []),
            *(spec.validation.setup if spec.validation else []),
        ]
        programs = ", ".join(f"`{argv[0][:100]}`" for argv in setup if argv)
        return (
            f"a setup command ({programs or 'environment.setup / validation.setup'}) does not exist or is not "
            f"executable in the sandbox{said}: {after}"
        )
    return None
