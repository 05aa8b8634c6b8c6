"""Inputs and outputs of activities: the only values that cross between workflow code and I/O code.

Kept small: large things (diffs, logs, transcripts) travel as `ArtifactRef`s, never inline, so Temporal payloads
and histories stay far below their limits however long a repair loop runs.

Every input carries the workflow's `step` number: with Temporal's attempt number it is the rank every write of the
activity attempt is fenced by (crewwork/store/fencing.py).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from crewwork.models import (
    AgentOutcome,
    ArtifactRef,
    BudgetSpec,
    DiffStats,
    EnvironmentSpec,
    PullRequestSpec,
    ReviewDecision,
    SandboxSpec,
    ValidationOutcome,
    ValidationSpec,
    WorkItemResult,
    WorkItemSpec,
    WorkItemState,
)


class ItemRef(BaseModel):
    work_item_id: str
    tenant_id: str
    step: int
    """The workflow's number for this activity call: writes rank by (step, Temporal attempt)."""


class AdmitInput(ItemRef):
    spec: WorkItemSpec
    resumed: bool = False
    """The item has attempts already (a continued run, or reviewers sent it back): an admission out of `queued`
    reads their failure fingerprints too, for the breaker."""


class AdmitResult(BaseModel):
    admitted: bool
    reason: str = ""
    queued_position: int | None = None
    """Set when the tenant's in-flight limit is reached: the item's place in the tenant's queue (1 is next)."""
    budget: BudgetSpec | None = None
    """The budget the item runs under: its own, capped by the operator's ceilings (which also fill what it left
    unset). Decided once, at admission, so the workflow's limits are in its history."""
    review_timeout_s: float | None = None
    """The review deadline the item runs under (its own, capped by the operator's ceiling)."""
    # Persisted history, so that a restarted or continued-as-new workflow resumes counting from the store.
    past_fingerprints: list[str | None] = Field(default_factory=list)
    attempts_recorded: int = 0


class SetStateInput(ItemRef):
    state: WorkItemState
    reason: str = ""
    attempt: int | None = None


class WriteOutcome(BaseModel):
    ok: bool
    stale: bool = False


class WorkspaceLeaseInput(ItemRef):
    key: str
    ttl_s: float


class WorkspaceLeaseResult(BaseModel):
    grant: int | None = None
    holder: str | None = None


class ReleaseInput(ItemRef):
    key: str
    grant: int | None = None
    ttl_s: float | None = None
    """For a renewal: the new lifetime (the operator's default when None)."""


class AgentStepInput(ItemRef):
    attempt: int
    spec: WorkItemSpec
    repo_path: str | None = None
    base_commit: str | None = None
    diagnostics: str | None = None
    review_comment: str | None = None


class ValidateInput(ItemRef):
    attempt: int
    repo_path: str
    base_commit: str
    validation: ValidationSpec
    sandbox: SandboxSpec
    diff_ref: ArtifactRef | None = None
    diff_stats: DiffStats | None = None
    review_comment: str | None = None
    environment: EnvironmentSpec | None = None
    """The repository's environment (resolved at submission): setup, interpreter, setup network and secrets."""


class RecordInput(ItemRef):
    attempt: int
    verdict: str
    reason: str
    cause: str | None = None
    fingerprint: str | None = None
    agent: AgentOutcome | None = None
    validation: ValidationOutcome | None = None


class RecordResult(BaseModel):
    ok: bool
    stale: bool = False
    fingerprints: list[str | None] = Field(default_factory=list)


class LandInput(ItemRef):
    repo_path: str
    base_commit: str
    diff_ref: ArtifactRef
    message: str
    workspace_key: str | None = None
    workspace_grant: int | None = None
    pull_request: PullRequestSpec | None = None
    """Open a pull request for the landed branch (also when the repository's forge says `always`)."""
    ref: str | None = None
    """The work item's `repo.ref`: the pull request's base when it names a branch."""
    attempt: int | None = None
    """The attempt whose change lands (its evidence is signed); None in histories from before evidence bundles."""
    review: ReviewDecision | None = None
    """The reviewer's decision that let it land (None: no review was required), for the signed review statement."""
    review_decided_at: float | None = None
    """When the decision reached the workflow (workflow time, epoch seconds)."""


class LandResult(BaseModel):
    branch: str
    commit: str
    created: bool
    patch_ref: ArtifactRef | None = None
    pull_request_url: str | None = None


class FinishInput(ItemRef):
    result: WorkItemResult
    record: RecordInput | None = None
    """The last attempt's record, written in the same transaction as the result (a `task` item's passing attempt)."""


class CleanupInput(ItemRef):
    repo_path: str | None = None


class AttemptBundleInput(BaseModel):
    """Sign one attempt's evidence on request (EvidenceBundleWorkflow -> sign_attempt_bundle)."""

    work_item_id: str
    tenant_id: str
    attempt: int
