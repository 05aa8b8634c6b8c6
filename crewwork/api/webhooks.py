"""The webhooks resource: register endpoints that receive signed notifications of state changes."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from crewwork.api.bodies import CheckedJsonRoute
from crewwork.api.deps import OutboxDep, PrincipalDep, StateDep
from crewwork.api.problems import PROBLEM_RESPONSES, ProblemError, refuse_unstorable_body
from crewwork.boundary.outbound import OutboundPolicy, OutboundRefused
from crewwork.store.outbox import Delivery, OutboxStore, WebhookRecord

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"], responses=PROBLEM_RESPONSES, route_class=CheckedJsonRoute)

EVENT_TYPES = ("work_item.state_changed", "work_item.reviewed")
DEFAULT_OVERLAP_S = 24 * 3600.0
"""How long the previous secret keeps signing after a rotation, unless the request says otherwise."""
MAX_OVERLAP_S = 7 * 24 * 3600.0
"""The longest overlap a rotation may ask for."""


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=8, max_length=2000, description="http(s) URL that receives POSTed JSON.")
    event_types: list[str] = Field(
        default_factory=list, max_length=len(EVENT_TYPES), description="Event types to deliver; empty: all."
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url must be an absolute http:// or https:// URL")
        if parts.username or parts.password:
            raise ValueError("url must not carry credentials")
        return v

    @field_validator("event_types")
    @classmethod
    def _known_types(cls, v: list[str]) -> list[str]:
        unknown = [t for t in v if t not in EVENT_TYPES]
        if unknown:
            raise ValueError(f"unknown event types {unknown}; known: {list(EVENT_TYPES)}")
        return v


class WebhookView(BaseModel):
    id: str
    url: str
    event_types: list[str]
    created_at: float


class WebhookCreated(WebhookView):
    secret: str = Field(
        description="Signs every delivery (Standard Webhooks: `whsec_` + base64 key). Shown only in this response."
    )


class RotateSecret(BaseModel):
    model_config = ConfigDict(extra="forbid")
    overlap_s: float = Field(
        default=DEFAULT_OVERLAP_S,
        ge=0,
        le=MAX_OVERLAP_S,
        description="Seconds the current secret keeps signing (as a second `webhook-signature`) after the rotation; "
        "0 drops it at once.",
    )


class SecretRotated(BaseModel):
    id: str
    secret: str = Field(description="The new secret. Shown only in this response.")
    previous_secret_valid_until: float | None = Field(
        description="Unix seconds until which deliveries are also signed with the previous secret (null: not at all)."
    )


class DeliveryView(BaseModel):
    id: int
    work_item_id: str
    event_type: str
    status: str = Field(description="pending | delivered | dead (dead-letter after the last retry)")
    attempts: int
    last_error: str | None
    created_at: float
    delivered_at: float | None
    next_attempt_at: float


def _view(h: WebhookRecord) -> WebhookView:
    return WebhookView(id=h.id, url=h.url, event_types=list(h.event_types), created_at=h.created_at)


def _delivery(m: Delivery) -> DeliveryView:
    return DeliveryView(
        id=m.id,
        work_item_id=m.work_item_id,
        event_type=m.event_type,
        status=m.status,
        attempts=m.attempts,
        last_error=m.last_error,
        created_at=m.created_at,
        delivered_at=m.delivered_at,
        next_attempt_at=m.next_attempt_at,
    )


async def _owned(outbox: OutboxStore, tenant_id: str, webhook_id: str) -> WebhookRecord:
    hook = await outbox.get_webhook(tenant_id, webhook_id)
    if hook is None:
        raise ProblemError(404, "not_found", f"no webhook {webhook_id}")
    return hook


@router.post("", status_code=201, response_model=WebhookCreated, summary="Register a webhook")
async def create(body: WebhookCreate, principal: PrincipalDep, outbox: OutboxDep, state: StateDep) -> WebhookCreated:
    refuse_unstorable_body(body)
    try:
        # Checked here and again before every delivery (a name can resolve elsewhere later): crewwork.boundary.outbound.
        await OutboundPolicy.from_settings(state.settings).check(body.url)
    except OutboundRefused as exc:
        raise ProblemError(422, "url_not_allowed", f"webhook url refused: {exc}") from None
    if len(await outbox.list_webhooks(principal.tenant_id)) >= 20:
        raise ProblemError(409, "too_many_webhooks", "a tenant may register at most 20 webhooks")
    hook = await outbox.create_webhook(principal.tenant_id, body.url, body.event_types)
    return WebhookCreated(**_view(hook).model_dump(), secret=hook.secret)


@router.post(
    "/{webhook_id}/rotate-secret",
    response_model=SecretRotated,
    summary="Rotate the signing secret (the old one keeps signing for an overlap window)",
    description="Returns the new secret once. Until `previous_secret_valid_until`, each delivery carries two "
    "space-separated signatures in `webhook-signature`, one per secret, so receivers can switch without losing a "
    "delivery; then the previous secret is dropped. Rotating again drops any previous secret at once.",
)
async def rotate_secret(
    webhook_id: str, principal: PrincipalDep, outbox: OutboxDep, body: RotateSecret | None = None
) -> SecretRotated:
    overlap = (body or RotateSecret()).overlap_s
    rotated = await outbox.rotate_secret(principal.tenant_id, webhook_id, overlap)
    if rotated is None:
        raise ProblemError(404, "not_found", f"no webhook {webhook_id}")
    return SecretRotated(id=webhook_id, secret=rotated.secret, previous_secret_valid_until=rotated.previous_valid_until)


@router.get("", response_model=list[WebhookView], summary="List the tenant's webhooks")
async def list_hooks(principal: PrincipalDep, outbox: OutboxDep) -> list[WebhookView]:
    return [_view(h) for h in await outbox.list_webhooks(principal.tenant_id)]


@router.get("/{webhook_id}", response_model=WebhookView, summary="Get a webhook")
async def get_hook(webhook_id: str, principal: PrincipalDep, outbox: OutboxDep) -> WebhookView:
    return _view(await _owned(outbox, principal.tenant_id, webhook_id))


@router.delete("/{webhook_id}", status_code=204, summary="Remove a webhook (pending deliveries stop)")
async def delete_hook(webhook_id: str, principal: PrincipalDep, outbox: OutboxDep) -> Response:
    if not await outbox.delete_webhook(principal.tenant_id, webhook_id):
        raise ProblemError(404, "not_found", f"no webhook {webhook_id}")
    return Response(status_code=204)


@router.get("/{webhook_id}/deliveries", response_model=list[DeliveryView], summary="Recent deliveries, newest first")
async def deliveries(
    webhook_id: str,
    principal: PrincipalDep,
    outbox: OutboxDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[DeliveryView]:
    await _owned(outbox, principal.tenant_id, webhook_id)
    return [_delivery(m) for m in await outbox.deliveries(principal.tenant_id, webhook_id, limit)]


class RedeliverResponse(BaseModel):
    requeued: int


@router.post("/{webhook_id}/redeliver", response_model=RedeliverResponse, summary="Retry dead-lettered deliveries")
async def redeliver(webhook_id: str, principal: PrincipalDep, outbox: OutboxDep) -> RedeliverResponse:
    await _owned(outbox, principal.tenant_id, webhook_id)
    return RedeliverResponse(requeued=await outbox.redeliver_dead(principal.tenant_id, webhook_id))
