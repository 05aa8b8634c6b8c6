"""Request and response schemas of the HTTP API (separate from the store's tables)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from crewwork.models import WorkItemStatus


class SubmitResponse(BaseModel):
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
    agent: dict[str, Any] | None
    validation: dict[str, Any] | None


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
    mock: bool
    created_at: float
    updated_at: float
    result: dict[str, Any] | None
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
    data: dict[str, Any]
    created_at: float


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
    agent: dict[str, Any] | None
    validation: dict[str, Any] | None
    artifacts: dict[str, str] = Field(
        default_factory=dict, description="Role (diff, transcript, log, report) -> download URL."
    )
