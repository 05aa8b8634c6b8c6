"""Inputs and outputs of activities: the only values that cross between workflow code and I/O code.

Kept small: large things (diffs, logs, transcripts) travel as `ArtifactRef`s, never inline, so Temporal payloads
and histories stay far below their limits however long a repair loop runs.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from crewwork.models import (
    AgentOutcome,
    ArtifactRef,
    DiffStats,
    EnvironmentSpec,
    PullRequestSpec,
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


class AdmitInput(ItemRef):
    spec: WorkItemSpec


class AdmitResult(BaseModel):
    admitted: bool
    reason: str = ""
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
    token: int | None = None


class WorkspaceLeaseInput(ItemRef):
    key: str
    ttl_s: float


class WorkspaceLeaseResult(BaseModel):
    token: int | None = None
    holder: str | None = None


class ReleaseInput(ItemRef):
    key: str
    token: int | None = None


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
    workspace_token: int | None = None
    pull_request: PullRequestSpec | None = None
    """Open a pull request for the landed branch (also when the repository's forge says `always`)."""
    ref: str | None = None
    """The work item's `repo.ref`: the pull request's base when it names a branch."""


class LandResult(BaseModel):
    branch: str
    commit: str
    created: bool
    patch_ref: ArtifactRef | None = None
    pull_request_url: str | None = None


class FinishInput(ItemRef):
    result: WorkItemResult
    record: RecordInput | None = None
    """The last attempt's record, written in the same transaction as the result (`task` items, patch lean-history)."""


class CleanupInput(ItemRef):
    repo_path: str | None = None
