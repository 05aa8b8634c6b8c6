"""Request and response schemas of the HTTP API (separate from the store's views, crewwork/store/views.py).

Records the platform writes for its own use (event data, attempt records, results) pass through `PlatformRecord`,
which drops the fencing fields: the ranks and tokens that order writes (crewwork/store/fencing/rule.py) are internal to
the store and the workers, and no response, stream or console view carries them. This is the one place they are
stripped; every route and stream that shows such a record does it through these models.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from crewwork.models import ReviewRecord, WorkItemStatus
from crewwork.models.diff import DiffModel
from crewwork.store.views import StoredEvent

FENCING_FIELDS = frozenset({"rank", "token", "fence_rank", "state_rank", "result_rank", "presented", "current", "step"})
"""Internal fields of platform records: a write's rank (`rank`, a rejected write's `presented` and the item's
`current`), the workflow `step` it is derived from, lease `token`s, and the item's rank marks."""


def without_fencing(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {k: v for k, v in record.items() if k not in FENCING_FIELDS}


PlatformRecord = Annotated[dict[str, Any], AfterValidator(without_fencing)]


class SubmitResponse(BaseModel):
    """The 202 of a submission (200 for a replay of the same idempotency key); `Location` names the item."""

    id: str
    workflow_id: str
    state: str
    created: bool = Field(description="False when an earlier submission with the same idempotency key exists.")
    links: dict[str, str]


class AttemptView(BaseModel):
    number: int
    verdict: str
    reason: str
    cause: str | None
    fingerprint: str | None
    agent: PlatformRecord | None
    validation: PlatformRecord | None


class ReviewView(ReviewRecord):
    """A reviewer's decision as the item's `review_decided` event recorded it."""

    summary: str = Field(description="One line for people: who decided what on which attempt, when, and the comment.")


class UnderReview(BaseModel):
    """What a decision on an item awaiting review is about: send `attempt` (and `diff_sha256`) with it, so that a
    decision on a change you did not see is refused."""

    attempt: int
    diff_sha256: str | None = None
    base_commit: str | None = None


class DiffView(DiffModel):
    """An attempt's diff as files, hunks and numbered lines (crewwork/models/diff.py)."""

    attempt: int
    sha256: str = Field(description="The diff artifact's SHA-256: send it as a review's `diff_sha256`.")
    base_commit: str | None = None


class CheckSummary(BaseModel):
    """The latest attempt's checks at a glance (the triage queue's columns)."""

    attempt: int
    verdict: str
    cause: str | None = None
    tests_executed: int = 0
    tests_failed: int = 0
    probes_passed: int = 0
    probes_failed: int = 0
    files_changed: int = 0
    insertions: int = 0
    deletions: int = 0


class EvidenceBundleView(BaseModel):
    """Whether the landed change carries a signed evidence bundle (docs/evidence.md): said with the item, so that an
    unsigned landing is visible wherever the item's evidence is shown, not only at the bundle's own route."""

    status: Literal["signed", "unsigned", "not_landed", "missing"] = Field(
        description="signed: the landed change has a bundle (`url`); unsigned: it landed while no evidence signing key "
        "was configured, so nothing about it can be verified offline; not_landed: a bundle is signed when the change "
        "lands; missing: landed, with neither a bundle nor a record of landing unsigned"
    )
    detail: str
    url: str | None = None


class BuildView(BaseModel):
    """The worker deployment version of an item's workflow (docs/operations.md, "Deploying a new build")."""

    deployment: str
    build_id: str
    behavior: str = Field(description="`pinned`: the item runs to its end on this build; `auto_upgrade`: it moves.")
    override: str | None = Field(default=None, description="A versioning override an operator set, if any.")


class LegalHoldRequest(BaseModel):
    model_config = {"extra": "forbid"}

    reason: str = Field(min_length=1, max_length=500, description="Why the item is held (kept in its event log).")


class LegalHoldView(BaseModel):
    id: str
    legal_hold: dict[str, Any] | None
    retained_at: float | None = Field(
        description="Set when retention had already removed the item's details: a hold keeps what is left."
    )


class WorkItemView(BaseModel):
    id: str
    tenant_id: str
    kind: str
    state: str
    reason: str
    labels: dict[str, Any]
    repo: str | None
    base_commit: str | None
    workflow_id: str
    attempt_count: int
    delivery_branch: str | None
    landed_commit: str | None
    pull_request_url: str | None = None
    mock: bool
    created_at: float
    updated_at: float
    result: PlatformRecord | None
    spec: dict[str, Any]
    live: WorkItemStatus | None = None
    attempts: list[AttemptView] | None = None
    evidence_bundle: EvidenceBundleView | None = Field(
        default=None, description="The signed evidence bundle's status (one item's view; not in lists)."
    )
    links: dict[str, str] = Field(default_factory=dict)
    title: str = Field(default="", description="The instruction's first line (a task's: its agent), one clean line.")
    agent: str | None = None
    waiting_since: float | None = Field(
        default=None, description="Awaiting review: since when (the time of its last state change)."
    )
    checks: CheckSummary | None = Field(default=None, description="The latest attempt's checks (in lists).")
    under_review: UnderReview | None = Field(
        default=None, description="Awaiting review: the attempt (and diff) a decision is taken on."
    )
    reviews: list[ReviewView] | None = Field(
        default=None, description="Every review decision, oldest first (one item's view, not lists)."
    )
    legal_hold: dict[str, Any] | None = Field(
        default=None, description="The legal hold in force (reason, set_by, set_at): retention keeps the item whole."
    )
    retained_at: float | None = Field(
        default=None,
        description="When retention removed the item's details (events, attempt details, artifacts' bytes; the "
        "record, result and evidence bundles stay), or null.",
    )
    build: BuildView | None = Field(
        default=None,
        description="The worker build (Temporal worker deployment version) the item's workflow runs on, as Temporal "
        "reports it (one item's view only, null where workers are not versioned or Temporal did not answer).",
    )


class WorkItemPage(BaseModel):
    items: list[WorkItemView]
    next_cursor: str | None


class EventView(BaseModel):
    id: int
    type: str
    data: PlatformRecord
    created_at: float

    @classmethod
    def of(cls, ev: StoredEvent) -> EventView:
        return cls(id=ev.id, type=ev.type, data=ev.data, created_at=ev.created_at)


class StreamEventView(EventView):
    """One event as the `data` of a Server-Sent Event (tenant streams mix work items, so it names its own)."""

    work_item_id: str

    @classmethod
    def of(cls, ev: StoredEvent) -> StreamEventView:
        return cls(id=ev.id, work_item_id=ev.work_item_id, type=ev.type, data=ev.data, created_at=ev.created_at)


class ReviewResponse(BaseModel):
    id: str
    message: str


class ArtifactView(BaseModel):
    id: str
    name: str
    content_type: str
    size: int
    sha256: str
    created_at: float
    url: str
    removed_at: float | None = Field(
        default=None, description="When retention removed the bytes (name, size and sha256 stay); the URL is a 410."
    )


class EvidenceView(BaseModel):
    """One attempt's evidence: what the platform measured (validation) apart from what the agent said (agent)."""

    number: int
    verdict: str
    reason: str
    cause: str | None
    fingerprint: str | None
    created_at: float
    agent: PlatformRecord | None
    validation: PlatformRecord | None
    artifacts: dict[str, str] = Field(
        default_factory=dict, description="Role (diff, transcript, log, report, witness) -> download URL."
    )
