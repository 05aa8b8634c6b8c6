"""Request and response schemas of the HTTP API (separate from the store's views, crewwork/store/views.py).

Records the platform writes for its own use (event data, attempt records, results) pass through `PlatformRecord`,
which drops the fencing fields: the ranks and tokens that order writes (crewwork/store/fencing.py) are internal to
the store and the workers, and no response, stream or console view carries them. This is the one place they are
stripped; every route and stream that shows such a record does it through these models.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field

from crewwork.models import WorkItemStatus
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
    links: dict[str, str] = Field(default_factory=dict)


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
        default_factory=dict, description="Role (diff, transcript, log, report) -> download URL."
    )
