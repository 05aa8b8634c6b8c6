"""The work-items resource: submit, get, list, attempts, evidence, diff, artifacts, events (JSON or SSE), review,
cancel. Every query is scoped to the caller's tenant: another tenant's work item is a 404, never a 403."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import math
import re
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from crewwork.api.appstate import api_state
from crewwork.api.bodies import CheckedJsonRoute
from crewwork.api.deps import PrincipalDep, ServiceDep, StateDep, StoreDep
from crewwork.api.problems import PROBLEM_RESPONSES, ProblemError
from crewwork.api.reviews import checks_of, reviews_of, title_of, under_review
from crewwork.api.schemas import (
    ArtifactView,
    AttemptView,
    BuildView,
    EventView,
    EvidenceBundleView,
    EvidenceView,
    ReviewResponse,
    SubmitResponse,
    WorkItemPage,
    WorkItemView,
)
from crewwork.api.service import SubmissionRejected, WorkflowUnavailable, WorkItemService
from crewwork.api.streams import SSE_HEADERS, SSE_RESPONSE, event_stream, resume_point
from crewwork.attestation.publish import BUNDLE_ARTIFACT
from crewwork.boundary import jsonvalues
from crewwork.models import WorkItemKind, WorkItemSpec, WorkItemState
from crewwork.repos.tenancy import RepositoryNotFound
from crewwork.store.store import Principal, Store
from crewwork.store.views import StoredArtifact, StoredAttempt, StoredWorkItem
from crewwork.store.work_items import IdempotencyConflict, QueueFull

router = APIRouter(
    prefix="/v1/work-items", tags=["work items"], responses=PROBLEM_RESPONSES, route_class=CheckedJsonRoute
)

ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
_CURSOR_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
LABEL_RE = re.compile(r"^([^=]{1,63})=(.{0,256})$", re.S)
# Artifact types served inline as what they are; anything else is a download (never rendered on the API's origin).
LIVE_QUERY_TIMEOUT_S = 2.0
INLINE_TYPES = {"text/plain", "text/x-diff", "text/x-patch", "application/json", "application/xml", "text/xml"}


def item_url(work_item_id: str) -> str:
    return f"/v1/work-items/{work_item_id}"


def _links(request: Request, row: StoredWorkItem) -> dict[str, str]:
    settings = api_state(request.app).settings
    ui = settings.temporal_ui_url.rstrip("/")
    ns = settings.temporal_namespace
    return {
        "self": item_url(row.id),
        "events": f"/v1/work-items/{row.id}/events",
        "events_stream": f"/v1/work-items/{row.id}/events/stream",
        "evidence": f"/v1/work-items/{row.id}/evidence",
        "diff": f"/v1/work-items/{row.id}/diff",
        "console": f"/console#/items/{row.id}",
        "temporal_ui": f"{ui}/namespaces/{ns}/workflows/{row.workflow_id}",
    }


def view(request: Request, row: StoredWorkItem) -> WorkItemView:
    return WorkItemView(
        id=row.id,
        tenant_id=row.tenant_id,
        kind=row.kind,
        state=row.state,
        reason=row.reason,
        labels=row.labels,
        repo=row.repo_url,
        base_commit=row.base_commit,
        workflow_id=row.workflow_id,
        attempt_count=row.attempt_count,
        delivery_branch=row.delivery_branch,
        landed_commit=row.landed_commit,
        pull_request_url=(row.result or {}).get("pull_request_url"),
        mock=row.mock,
        created_at=row.created_at,
        updated_at=row.updated_at,
        result=row.result,
        spec=row.spec,
        links=_links(request, row),
        title=title_of(row.spec),
        agent=(row.spec.get("agent") or {}).get("name"),
        waiting_since=row.updated_at if row.state == WorkItemState.awaiting_review.value else None,
        legal_hold=row.legal_hold,
        retained_at=row.retained_at,
    )


async def owned(store: Store, principal: Principal, work_item_id: str) -> StoredWorkItem:
    """The work item if the caller may see it (its tenant's, or any for an admin key), else a 404."""
    if not re.match(ID_PATTERN, work_item_id):
        raise ProblemError(404, "not_found", "no such work item")
    row = await store.get_work_item(work_item_id, None if principal.admin else principal.tenant_id)
    if row is None:
        # Another tenant's item is indistinguishable from a missing one.
        raise ProblemError(404, "not_found", f"no work item {work_item_id}")
    return row


async def submit_spec(
    request: Request,
    response: Response,
    spec: WorkItemSpec,
    principal: Principal,
    service: WorkItemService,
    idempotency_key: str | None,
) -> SubmitResponse:
    if idempotency_key and spec.idempotency_key is None:
        spec = spec.model_copy(update={"idempotency_key": idempotency_key})

    try:
        res = await service.submit(principal.tenant_id, spec)
    except RepositoryNotFound as exc:
        # Another tenant's repository is indistinguishable from a missing one.
        raise ProblemError(404, "not_found", str(exc)) from exc
    except SubmissionRejected as exc:
        raise ProblemError(422, exc.code, str(exc), errors=[{"field": exc.field or "", "message": str(exc)}]) from exc
    except IdempotencyConflict as exc:
        raise ProblemError(
            409,
            "idempotency_conflict",
            str(exc),
            errors=[{"field": "idempotency_key", "message": "already used with a different submission"}],
            headers={"Location": item_url(exc.existing.id)},
        ) from exc
    except QueueFull as exc:
        # No Retry-After: when places free up depends on the tenant's own items, not on a clock this API keeps.
        raise ProblemError(429, "queue_full", str(exc)) from exc
    except WorkflowUnavailable as exc:
        raise ProblemError(503, "temporal_unavailable", f"{exc}; retry with the same idempotency key") from exc
    if not res.created:
        response.status_code = 200
    response.headers["Location"] = item_url(res.row.id)
    return SubmitResponse(
        id=res.row.id,
        workflow_id=res.row.workflow_id,
        state=res.row.state,
        created=res.created,
        links=_links(request, res.row),
    )


@router.post(
    "",
    status_code=202,
    response_model=SubmitResponse,
    summary="Submit a work item",
    description="Validated field by field before anything is stored. Send an `Idempotency-Key` header (or the "
    "`idempotency_key` field) to make retries safe: the same key with the same submission returns the same work "
    "item with status 200; with a different submission it is a 409 `idempotency_conflict`. `Location` names the "
    "work item.",
    responses={
        200: {"model": SubmitResponse, "description": "Already submitted (same idempotency key and submission)"},
        409: {"description": "The idempotency key was used with a different submission (idempotency_conflict)"},
        429: {
            "description": "The tenant already has CREWWORK_TENANT_MAX_QUEUED items waiting for a place (queue_full; "
            "nothing stored), or the key's rate limit (rate_limited, with Retry-After)"
        },
    },
)
async def submit(
    request: Request,
    response: Response,
    spec: WorkItemSpec,
    principal: PrincipalDep,
    service: ServiceDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200)] = None,
) -> SubmitResponse:
    return await submit_spec(request, response, spec, principal, service, idempotency_key)


def _cursor_encode(row: StoredWorkItem) -> str:
    return base64.urlsafe_b64encode(json.dumps([row.created_at, row.id]).encode()).decode()


def _cursor_decode(cursor: str) -> tuple[float, str]:
    try:
        ts, wid = jsonvalues.loads(base64.urlsafe_b64decode(cursor.encode()))
        # Only what _cursor_encode writes: a finite time and an item id (a NUL or a lone surrogate in the id, hidden
        # by base64 from every other check, reached the database as a server error).
        if not isinstance(wid, str) or isinstance(ts, bool) or not _CURSOR_ID.fullmatch(wid):
            raise ValueError("bad cursor")
        if not math.isfinite(float(ts)):
            raise ValueError("bad cursor")
        return float(ts), wid
    except Exception as exc:
        raise ProblemError(400, "invalid_cursor", "the cursor is not one this API returned") from exc


def _parse_labels(labels: list[str]) -> dict[str, str]:
    out = {}
    for item in labels:
        m = LABEL_RE.match(item)
        if not m:
            raise ProblemError(
                400,
                "invalid_label_filter",
                f"label filter {item[:80]!r} must look like key=value",
                errors=[{"field": "label", "message": "expected key=value"}],
            )
        out[m.group(1)] = m.group(2)
    return out


def _finite(name: str, v: float | None) -> float | None:
    if v is not None and (v != v or v in (float("inf"), float("-inf"))):
        raise ProblemError(400, "invalid_request", f"{name} must be a finite number")
    return v


@router.get("", response_model=WorkItemPage, summary="List work items, newest first (keyset pagination)")
async def list_items(
    request: Request,
    principal: PrincipalDep,
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=500, description="`next_cursor` of the previous page")] = None,
    state: Annotated[WorkItemState | None, Query()] = None,
    kind: Annotated[WorkItemKind | None, Query()] = None,
    label: Annotated[
        list[str] | None, Query(max_length=16, description="key=value; repeat to require several labels")
    ] = None,
    created_after: Annotated[float | None, Query(allow_inf_nan=False, description="Unix seconds (inclusive)")] = None,
    created_before: Annotated[float | None, Query(allow_inf_nan=False, description="Unix seconds (exclusive)")] = None,
    q: Annotated[
        str | None,
        Query(min_length=1, max_length=100, description="Search: id prefix, repository text or instruction text"),
    ] = None,
    repo: Annotated[
        str | None, Query(min_length=1, max_length=500, description="Text in the repository's URL or path")
    ] = None,
    agent: Annotated[
        str | None, Query(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:-]+$", description="The agent's name")
    ] = None,
    all_tenants: Annotated[bool, Query(description="Admin only: list every tenant's work items.")] = False,
) -> WorkItemPage:
    if all_tenants and not principal.admin:
        raise ProblemError(403, "forbidden", "all_tenants needs an API key with the `admin` scope")
    _finite("created_after", created_after)
    _finite("created_before", created_before)
    rows = await store.list_work_items(
        None if all_tenants else principal.tenant_id,
        limit=limit + 1,
        before=_cursor_decode(cursor) if cursor else None,
        state=state.value if state else None,
        kind=kind.value if kind else None,
        created_after=created_after,
        created_before=created_before,
        labels=_parse_labels(label or []),
        search=q,
        repo=repo,
        agent=agent,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    latest = await store.latest_attempts([r.id for r in rows])
    items = []
    for r in rows:
        v = view(request, r)
        v.checks = checks_of(latest.get(r.id))
        items.append(v)
    page = WorkItemPage(
        items=items,
        next_cursor=_cursor_encode(rows[-1]) if more and rows else None,
    )
    # Already a validated model: serialize once (FastAPI would validate and serialize it again).
    return Response(page.model_dump_json(), media_type="application/json")  # type: ignore[return-value]


def _attempt_view(a: StoredAttempt) -> AttemptView:
    return AttemptView(
        number=a.number,
        verdict=a.verdict,
        reason=a.reason,
        cause=a.cause,
        fingerprint=a.fingerprint,
        agent=a.agent,
        validation=a.validation,
    )


@router.get("/{work_item_id}", response_model=WorkItemView, summary="Get a work item with its attempts")
async def get_item(
    request: Request,
    work_item_id: str,
    principal: PrincipalDep,
    store: StoreDep,
    service: ServiceDep,
    live: Annotated[bool, Query(description="Also ask the running workflow for its live status")] = True,
) -> WorkItemView:
    row = await owned(store, principal, work_item_id)
    v = view(request, row)
    attempts = await store.list_attempts(row.id)
    v.attempts = [_attempt_view(a) for a in attempts]
    v.checks = checks_of(attempts[-1] if attempts else None)
    v.reviews = await reviews_of(store, row.id)
    v.evidence_bundle = await evidence_bundle(store, row)
    if live and not WorkItemState(row.state).terminal:
        # Best effort: a busy or unreachable worker must not hold up the store's answer.
        with contextlib.suppress(TimeoutError):
            v.live = await asyncio.wait_for(service.live_status(row), LIVE_QUERY_TIMEOUT_S)
    if row.state == WorkItemState.awaiting_review.value:
        v.under_review = under_review(row, attempts, v.live.review_attempt if v.live else None)
    if live:
        # The build it runs on, from Temporal (the server answers, not a worker); best effort likewise.
        with contextlib.suppress(TimeoutError):
            found = await asyncio.wait_for(service.build_of(row), LIVE_QUERY_TIMEOUT_S)
            if found is not None:
                v.build = BuildView(**dataclasses.asdict(found))
    return v


async def evidence_bundle(store: Store, row: StoredWorkItem) -> EvidenceBundleView:
    """Whether `row`'s landed change is signed: its bundle artifact, or the `evidence_unsigned` event the landing
    wrote when no signing key was configured."""
    if row.landed_commit is None:
        return EvidenceBundleView(
            status="not_landed", detail=f"not landed ({row.state}): a bundle is signed when the change lands"
        )
    if any(a.name == BUNDLE_ARTIFACT for a in await store.list_artifacts(row.id)):
        return EvidenceBundleView(
            status="signed",
            detail="signed evidence bundle; verify it offline with `crewwork verify`",
            url=f"/v1/work-items/{row.id}/evidence-bundle",
        )
    if await store.has_event(row.id, "evidence_unsigned"):
        return EvidenceBundleView(
            status="unsigned",
            detail="UNSIGNED: landed while no evidence signing key was configured; there is no bundle, and nothing "
            "about this change can be verified offline",
        )
    return EvidenceBundleView(status="missing", detail="landed, but no evidence bundle is stored")


@router.get("/{work_item_id}/attempts", response_model=list[AttemptView], summary="The attempts, in order")
async def attempts(work_item_id: str, principal: PrincipalDep, store: StoreDep) -> list[AttemptView]:
    row = await owned(store, principal, work_item_id)
    return [_attempt_view(a) for a in await store.list_attempts(row.id)]


_REF_ROLES = (
    ("agent", "diff_ref", "diff"),
    ("agent", "transcript_ref", "transcript"),
    ("validation", "log_ref", "log"),
    ("validation", "report_ref", "report"),
    ("validation", "witness_ref", "witness"),
    ("validation", "scan_ref", "scan"),
)


def _refs(row_id: str, a: StoredAttempt) -> dict[str, str]:
    out = {}
    for side, key, role in _REF_ROLES:
        doc = getattr(a, side) or {}
        ref = doc.get(key) if isinstance(doc, dict) else None
        if isinstance(ref, dict) and ref.get("id"):
            out[role] = f"/v1/work-items/{row_id}/artifacts/{ref['id']}"
    return out


@router.get(
    "/{work_item_id}/evidence",
    response_model=list[EvidenceView],
    summary="Evidence per attempt: measured validation, the agent's outcome, and artifact links",
)
async def evidence(work_item_id: str, principal: PrincipalDep, store: StoreDep) -> list[EvidenceView]:
    row = await owned(store, principal, work_item_id)
    return [
        EvidenceView(
            number=a.number,
            verdict=a.verdict,
            reason=a.reason,
            cause=a.cause,
            fingerprint=a.fingerprint,
            created_at=a.created_at,
            agent=a.agent,
            validation=a.validation,
            artifacts=_refs(row.id, a),
        )
        for a in await store.list_attempts(row.id)
    ]


async def item_artifact(store: Store, row: StoredWorkItem, artifact_id: str, *, with_content: bool) -> StoredArtifact:
    if not re.match(ID_PATTERN, artifact_id):
        raise ProblemError(404, "not_found", "no such artifact")
    art = await store.work_item_artifact(row.id, artifact_id, with_content=with_content)
    if art is None:
        raise ProblemError(404, "not_found", f"no artifact {artifact_id} on {row.id}")
    if with_content and art.removed_at is not None:
        raise ProblemError(
            410,
            "artifact_removed",
            f"artifact {artifact_id} of {row.id} was removed by retention; its name, size and sha256 are kept "
            "(GET /v1/work-items/{id}/artifacts)",
        )
    return art


@router.get("/{work_item_id}/artifacts", response_model=list[ArtifactView], summary="The work item's artifacts")
async def artifacts(work_item_id: str, principal: PrincipalDep, store: StoreDep) -> list[ArtifactView]:
    row = await owned(store, principal, work_item_id)
    return [
        ArtifactView(
            id=a.id,
            name=a.name,
            content_type=a.content_type,
            size=a.size,
            sha256=a.sha256,
            created_at=a.created_at,
            url=f"/v1/work-items/{row.id}/artifacts/{a.id}",
            removed_at=a.removed_at,
        )
        for a in await store.list_artifacts(row.id)
    ]


@router.get(
    "/{work_item_id}/artifacts/{artifact_id}",
    summary="Download an artifact (text types inline, anything else as an attachment)",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
)
async def artifact(
    request: Request,
    work_item_id: str,
    artifact_id: str,
    principal: PrincipalDep,
    store: StoreDep,
    state: StateDep,
    download: Annotated[bool, Query(description="Force Content-Disposition: attachment")] = False,
) -> Response:
    row = await owned(store, principal, work_item_id)
    meta = await item_artifact(store, row, artifact_id, with_content=False)
    limit = state.options.max_download_bytes
    if meta.size > limit:
        raise ProblemError(413, "artifact_too_large", f"artifact is {meta.size} bytes; this API serves at most {limit}")
    art = await item_artifact(store, row, artifact_id, with_content=True)
    ctype = (art.content_type or "application/octet-stream").split(";")[0].strip().lower()
    inline = ctype in INLINE_TYPES and not download
    safe_name = re.sub(r"[^A-Za-z0-9._-]", "_", art.name)[:120] or "artifact"
    media = (
        f"{ctype}; charset=utf-8"
        if inline and (ctype.startswith("text/") or ctype.endswith("json"))
        else (ctype if inline else "application/octet-stream")
    )
    return Response(
        art.content_bytes,
        media_type=media,
        headers={
            "Content-Disposition": f'{"inline" if inline else "attachment"}; filename="{safe_name}"',
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; sandbox",
            "ETag": f'"{art.sha256}"',
        },
    )


@router.get(
    "/{work_item_id}/events",
    response_model=list[EventView],
    summary="The work item's event log (JSON), or a live stream with `Accept: text/event-stream`",
    responses=SSE_RESPONSE,
)
async def events(
    request: Request,
    work_item_id: str,
    principal: PrincipalDep,
    store: StoreDep,
    after: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    accept: Annotated[str | None, Header(max_length=1000)] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
) -> Any:
    row = await owned(store, principal, work_item_id)
    if accept and "text/event-stream" in accept:
        return _stream(request, store, row, resume_point(last_event_id, after))
    return [EventView.of(e) for e in await store.list_events(row.id, after_id=after, limit=limit)]


def _stream(request: Request, store: Store, row: StoredWorkItem, after: int) -> StreamingResponse:
    state = api_state(request.app)
    return StreamingResponse(
        event_stream(
            request,
            store,
            state.horizon,
            after=after,
            work_item_id=row.id,
            keepalive_s=state.options.sse_keepalive_s,
        ),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


@router.get(
    "/{work_item_id}/events/stream",
    summary="Live events of one work item (Server-Sent Events, resumable with Last-Event-ID)",
    response_class=StreamingResponse,
    responses=SSE_RESPONSE,
)
async def events_stream(
    request: Request,
    work_item_id: str,
    principal: PrincipalDep,
    store: StoreDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
    after: Annotated[int | None, Query(ge=0, le=2**62, description="Resume after this event id.")] = None,
) -> StreamingResponse:
    row = await owned(store, principal, work_item_id)
    return _stream(request, store, row, resume_point(last_event_id, after))


@router.post("/{work_item_id}/cancel", status_code=202, response_model=ReviewResponse, summary="Cancel")
async def cancel(work_item_id: str, principal: PrincipalDep, store: StoreDep, service: ServiceDep) -> ReviewResponse:
    row = await owned(store, principal, work_item_id)
    if WorkItemState(row.state).terminal:
        raise ProblemError(409, "already_finished", f"work item {row.id} is already {row.state}")
    try:
        await service.cancel(row)
    except WorkflowUnavailable as exc:
        raise ProblemError(503, "temporal_unavailable", str(exc)) from exc
    return ReviewResponse(id=row.id, message="cancellation requested")
