"""Forge intake over HTTP (docs/forge.md): a registered repository's subscription to its forge's events, and the
webhook endpoint the forge delivers them to.

`PUT /v1/repositories/{id}/forge` subscribes (the tenant's key; the repository must be on a forge the operator
configured, CREWWORK_FORGES). `POST /forge/{dialect}/{subscription id}` is where the forge delivers: no API key, the
subscription's secret signs each delivery. It does no forge call and starts no workflow: it authenticates the
delivery, parses it, and records it and its trigger in one transaction (crewwork/store/forge.py), then answers 202;
the intake (crewwork/api/forge_intake.py) does the rest. What it answers:

| the delivery | answer |
|---|---|
| unknown subscription, or another dialect's path | 404 `not_found` |
| `Content-Length` over CREWWORK_FORGE_WEBHOOK_MAX_BYTES | 413 `payload_too_large`, before the body is read |
| no `X-Hub-Signature-256`, or one that is not the secret's over the body | 401 `signature_missing` / `signature_invalid` (charged to the address like a wrong API key) |
| no `X-GitHub-Delivery` or `X-GitHub-Event` | 400 `delivery_missing` / `event_missing` |
| a content type other than `application/json` | 415 `unsupported_media_type` |
| malformed JSON, or JSON the store would not keep | 400 `invalid_json` / 422 |
| JSON that is not the event's shape, or about another repository | 422 `invalid_payload` / `repository_mismatch` |
| anything else | 202 and the outcome: `queued`, `duplicate_delivery`, `duplicate_trigger`, `ignored` (with the reason) |
"""

from __future__ import annotations

import json
import re

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from crewwork.admission.policy import PolicyViolation
from crewwork.agents.catalogue import agent_check
from crewwork.api.bodies import CheckedJsonRoute
from crewwork.api.deps import PrincipalDep, StateDep
from crewwork.api.forge_subscriptions import ForgeSubscribe
from crewwork.api.problems import PROBLEM_RESPONSES, ProblemError, refuse_unstorable_body
from crewwork.api.repositories import ID_PATTERN
from crewwork.boundary import jsonvalues
from crewwork.boundary.urls import parse_repo_url
from crewwork.forge.intake import Ignored, WebhookRefused
from crewwork.forge.kinds import webhook_dialect
from crewwork.models import RepoSpec, ReviewSpec, WorkItemKind, WorkItemSpec
from crewwork.models.errors import AgentConfigError
from crewwork.repos.registration import RepoPolicyError, RepositoryChecks
from crewwork.store.forge import ForgeStore, Subscription

router = APIRouter(
    prefix="/v1/repositories", tags=["forge intake"], responses=PROBLEM_RESPONSES, route_class=CheckedJsonRoute
)
webhook_router = APIRouter(prefix="/forge", tags=["forge intake"], responses=PROBLEM_RESPONSES)

_SUBSCRIPTION_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class SubscriptionView(BaseModel):
    id: str
    repository_id: str
    dialect: str
    webhook_path: str = Field(description="Where the forge delivers: append it to the API's public base URL.")
    events: list[str] = Field(description="The events to tick in the forge's webhook settings.")
    settings: ForgeSubscribe
    created_at: float


class SubscriptionCreated(SubscriptionView):
    secret: str | None = Field(
        description="The webhook secret to paste into the forge's webhook settings. Shown only when the "
        "subscription is made and when the secret is rotated; null when an existing subscription is updated."
    )


class TriggerView(BaseModel):
    id: int
    trigger_key: str
    kind: str
    actor: str
    status: str = Field(
        description="pending | submitted | refused | failed; a review or a closed pull request: applied | ignored "
        "(last_error says why) | refused (an untrusted reviewer) | failed"
    )
    attempts: int
    work_item_id: str | None
    last_error: str | None
    created_at: float
    done_at: float | None


class TriggerPage(BaseModel):
    items: list[TriggerView]


def _view(sub: Subscription, secret: str | None = None) -> SubscriptionCreated:
    return SubscriptionCreated(
        id=sub.id,
        repository_id=sub.repository_id,
        dialect=sub.dialect,
        webhook_path=f"/forge/{sub.dialect}/{sub.id}",
        events=["issues", "issue_comment", "pull_request", "pull_request_review"],
        settings=ForgeSubscribe.model_validate(sub.settings),
        created_at=sub.created_at,
        secret=secret,
    )


async def _owned_repository(state: StateDep, principal: PrincipalDep, repository_id: str) -> tuple[str, str]:
    """The (tenant id, URL) of the caller's repository; 404 for anyone else's, exactly like a missing one."""
    if not ID_PATTERN.match(repository_id):
        raise ProblemError(404, "not_found", "no such repository")
    row = await state.store.get_repository(repository_id, principal.tenant_id)
    if row is None:
        raise ProblemError(404, "not_found", f"no repository {repository_id}")
    return principal.tenant_id, row.url


def _forges(state: StateDep) -> ForgeStore:
    return ForgeStore(state.store)


@router.put(
    "/{repository_id}/forge",
    response_model=SubscriptionCreated,
    summary="Subscribe a repository to its forge's events (issues labelled, bot commands in comments)",
    description="The repository must lie on a forge the operator configured (CREWWORK_FORGES) whose credential "
    "the tenant may use; else 422 `no_forge`. The answer carries the webhook secret once, when the subscription "
    "is made (201); a later PUT updates the settings and keeps the secret (200, `secret` null).",
    responses={201: {"model": SubscriptionCreated, "description": "Subscribed; the secret is in this answer only"}},
)
async def subscribe(
    repository_id: str, body: ForgeSubscribe, response: Response, principal: PrincipalDep, state: StateDep
) -> SubscriptionCreated:
    refuse_unstorable_body(body)
    tenant_id, url = await _owned_repository(state, principal, repository_id)
    checks = RepositoryChecks(state.settings)
    try:
        forge = checks.intake_forge(checks.locate(url), await state.store.tenant_ref(tenant_id))
    except RepoPolicyError as exc:
        raise ProblemError(422, "no_forge", str(exc)) from exc
    await _check_runnable(state, tenant_id, repository_id, body)
    forges = _forges(state)
    before = await forges.subscription_of(tenant_id, repository_id)
    sub = await forges.subscribe(
        tenant_id=tenant_id,
        repository_id=repository_id,
        dialect=forge.kind,
        settings=body.model_dump(mode="json"),
    )
    response.status_code = 200 if before is not None else 201
    return _view(sub, None if before is not None else sub.secret)


async def _check_runnable(state: StateDep, tenant_id: str, repository_id: str, body: ForgeSubscribe) -> None:
    """What a triggered item would run (agent, validation, budget, review) passes the agent's own check and the
    operator's policy now, not only when the first trigger arrives: 422 naming the field otherwise."""
    spec = WorkItemSpec(
        kind=WorkItemKind.code_change,
        repo=RepoSpec(id=repository_id),
        instruction="(the issue)",
        validation=body.validation,
        agent=body.agent,
        budget=body.budget,
        review=ReviewSpec(required=body.review_required),
    )
    try:
        agent_check(spec.agent.name, plugins=state.settings.agent_plugins).validate_config(spec.kind, spec.agent.config)
        (await state.service.policy(tenant_id)).check(spec)
    except AgentConfigError as exc:
        raise ProblemError(
            422, "invalid_subscription", str(exc), errors=[{"field": "agent", "message": str(exc)}]
        ) from exc
    except PolicyViolation as exc:
        raise ProblemError(
            422, "policy_violation", str(exc), errors=[{"field": exc.field, "message": str(exc)}]
        ) from exc


@router.get("/{repository_id}/forge", response_model=SubscriptionView, summary="A repository's forge subscription")
async def get_subscription(repository_id: str, principal: PrincipalDep, state: StateDep) -> SubscriptionView:
    tenant_id, _url = await _owned_repository(state, principal, repository_id)
    sub = await _forges(state).subscription_of(tenant_id, repository_id)
    if sub is None:
        raise ProblemError(404, "not_found", f"repository {repository_id} is not subscribed to its forge")
    return SubscriptionView.model_validate(_view(sub).model_dump(exclude={"secret"}))


@router.post(
    "/{repository_id}/forge/rotate-secret",
    response_model=SubscriptionCreated,
    summary="A new webhook secret (the old one stops verifying at once: set the new one on the forge)",
)
async def rotate(repository_id: str, principal: PrincipalDep, state: StateDep) -> SubscriptionCreated:
    tenant_id, _url = await _owned_repository(state, principal, repository_id)
    sub = await _forges(state).rotate_forge_secret(tenant_id, repository_id)
    if sub is None:
        raise ProblemError(404, "not_found", f"repository {repository_id} is not subscribed to its forge")
    return _view(sub, sub.secret)


@router.delete(
    "/{repository_id}/forge", status_code=204, response_class=Response, summary="Unsubscribe from the forge's events"
)
async def unsubscribe(repository_id: str, principal: PrincipalDep, state: StateDep) -> Response:
    tenant_id, _url = await _owned_repository(state, principal, repository_id)
    if not await _forges(state).unsubscribe(tenant_id, repository_id):
        raise ProblemError(404, "not_found", f"repository {repository_id} is not subscribed to its forge")
    return Response(status_code=204)


@router.get("/{repository_id}/forge/triggers", response_model=TriggerPage, summary="The subscription's latest triggers")
async def triggers(repository_id: str, principal: PrincipalDep, state: StateDep) -> TriggerPage:
    tenant_id, _url = await _owned_repository(state, principal, repository_id)
    forges = _forges(state)
    sub = await forges.subscription_of(tenant_id, repository_id)
    if sub is None:
        raise ProblemError(404, "not_found", f"repository {repository_id} is not subscribed to its forge")
    rows = await forges.triggers(tenant_id, sub.id)
    return TriggerPage(items=[TriggerView.model_validate(r, from_attributes=True) for r in rows])


class WebhookAnswer(BaseModel):
    delivery: str
    outcome: str = Field(description="queued | duplicate_delivery | duplicate_trigger | ignored")
    reason: str | None = None


async def _bounded_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is None or not declared.isdigit():
        raise ProblemError(411, "length_required", "a webhook delivery needs a Content-Length")
    if int(declared) > limit:
        raise ProblemError(413, "payload_too_large", f"a webhook delivery is at most {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProblemError(413, "payload_too_large", f"a webhook delivery is at most {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@webhook_router.post(
    "/{dialect}/{subscription_id}",
    status_code=202,
    response_model=WebhookAnswer,
    summary="Where the forge delivers a subscription's events (authenticated by the subscription's secret)",
)
async def deliver(
    dialect: str,
    subscription_id: str,
    request: Request,
    state: StateDep,
) -> WebhookAnswer:
    if not _SUBSCRIPTION_ID.match(subscription_id) or webhook_dialect(dialect) is None:
        raise ProblemError(404, "not_found", "no such forge subscription")
    reader = webhook_dialect(dialect)
    assert reader is not None
    body = await _bounded_body(request, state.options.forge_webhook_max_bytes)
    forges = _forges(state)
    sub = await forges.subscription(subscription_id)
    if sub is None or sub.dialect != dialect:
        raise ProblemError(404, "not_found", "no such forge subscription")
    headers = {k.lower(): v for k, v in request.headers.items()}
    try:
        delivery = reader.verify(headers, body, sub.secret)
    except WebhookRefused as exc:
        if exc.status == 401:
            await state.rate_limits.charge_auth_failure(request.client.host if request.client else "unknown")
        raise ProblemError(exc.status, exc.code, str(exc)) from None
    mime = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if mime != "application/json":
        raise ProblemError(
            415,
            "unsupported_media_type",
            "deliveries must be application/json (the forge webhook's content type setting)",
        )
    try:
        payload = jsonvalues.loads(body)
    except json.JSONDecodeError as exc:
        raise ProblemError(400, "invalid_json", f"the body is not JSON: {exc.msg} at {exc.pos}") from None
    except jsonvalues.JsonRefused as exc:
        raise ProblemError(422, exc.code, str(exc)) from None
    settings = ForgeSubscribe.model_validate(sub.settings)
    owner, name = _owner_and_name(sub)
    try:
        found = reader.trigger(delivery, payload, settings.rules(), f"{owner}/{name}")
    except WebhookRefused as exc:
        raise ProblemError(exc.status, exc.code, str(exc)) from None
    if isinstance(found, Ignored):
        accepted = await forges.accept(sub, delivery.id, delivery.event, None, None)
        reason: str | None = found.reason
    else:
        accepted = await forges.accept(sub, delivery.id, delivery.event, found.key, found.to_json())
        reason = None
        if accepted.outcome == "queued" and state.forge_intake is not None:
            state.forge_intake.wake()
    return WebhookAnswer(delivery=delivery.id, outcome=accepted.outcome, reason=reason)


def _owner_and_name(sub: Subscription) -> tuple[str, str]:
    found = parse_repo_url(sub.repository_url).owner_and_name
    if found is None:  # checked when it subscribed
        raise ProblemError(404, "not_found", "no such forge subscription")
    return found
