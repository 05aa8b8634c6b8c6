"""The shapes of the API's JSON answers, as TypedDicts (the values stay plain JSON: `json.dumps` prints what the API
sent). They mirror crewwork.api.schemas without importing it (that would import the server)."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

STATES = (
    "submitted",
    "admitted",
    "running",
    "validating",
    "awaiting_review",
    "landing",
    "succeeded",
    "failed",
    "rejected",
    "cancelled",
    "dead",
)
TERMINAL_STATES = frozenset({"succeeded", "failed", "rejected", "cancelled", "dead"})


class SubmitResponse(TypedDict):
    id: str
    workflow_id: str
    state: str
    created: bool
    links: dict[str, str]


class Attempt(TypedDict):
    number: int
    verdict: str
    reason: str
    cause: str | None
    fingerprint: str | None
    agent: dict[str, Any] | None
    validation: dict[str, Any] | None


class EvidenceBundle(TypedDict):
    """Whether the landed change carries a signed evidence bundle: `signed` (at `url`), `unsigned` (landed while no
    signing key was configured: nothing about it verifies offline), `not_landed`, or `missing`."""

    status: Literal["signed", "unsigned", "not_landed", "missing"]
    detail: str
    url: str | None


class WorkItem(TypedDict):
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
    pull_request_url: str | None
    mock: bool
    created_at: float
    updated_at: float
    result: dict[str, Any] | None
    spec: dict[str, Any]
    live: dict[str, Any] | None
    attempts: list[Attempt] | None
    evidence_bundle: EvidenceBundle | None
    """Given by `get` (one item), None in `list` pages."""
    links: dict[str, str]


class WorkItemPage(TypedDict):
    items: list[WorkItem]
    next_cursor: str | None


class Event(TypedDict):
    id: int
    type: str
    data: dict[str, Any]
    created_at: float


class Evidence(TypedDict):
    number: int
    verdict: str
    reason: str
    cause: str | None
    fingerprint: str | None
    created_at: float
    agent: dict[str, Any] | None
    validation: dict[str, Any] | None
    artifacts: dict[str, str]


class ReviewResponse(TypedDict):
    id: str
    message: str


class Artifact(TypedDict):
    id: str
    name: str
    content_type: str
    size: int
    sha256: str
    created_at: float
    url: str


class WebhookView(TypedDict):
    id: str
    url: str
    event_types: list[str]
    created_at: float


class WebhookCreated(WebhookView):
    secret: str


class SecretRotated(TypedDict):
    id: str
    secret: str
    previous_secret_valid_until: float | None


class DeliveryView(TypedDict):
    id: int
    work_item_id: str
    event_type: str
    status: str
    attempts: int
    last_error: str | None
    created_at: float
    delivered_at: float | None
    next_attempt_at: float
