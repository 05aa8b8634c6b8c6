"""The work-items resource: submit, get, list, events, review, cancel."""

from __future__ import annotations

import base64
import json
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response

from crewwork.api.deps import PrincipalDep, ServiceDep, StoreDep
from crewwork.api.problems import ProblemError
from crewwork.api.schemas import (
    AttemptView,
    EventView,
    ReviewResponse,
    SubmitResponse,
    WorkItemPage,
    WorkItemView,
)
from crewwork.models import ReviewDecision, WorkItemSpec, WorkItemState
from crewwork.service import ReviewRejected, SubmissionRejected, WorkflowUnavailable
from crewwork.store.tables import WorkItem

router = APIRouter(prefix="/v1/work-items", tags=["work items"])

MAX_BODY_BYTES = 1024 * 1024


def _links(request: Request, row: WorkItem) -> dict[str, str]:
    ui = request.app.state.settings.temporal_ui_url.rstrip("/")
    ns = request.app.state.settings.temporal_namespace
    return {
        "self": f"/v1/work-items/{row.id}",
        "events": f"/v1/work-items/{row.id}/events",
        "temporal_ui": f"{ui}/namespaces/{ns}/workflows/{row.workflow_id}",
    }


def view(request: Request, row: WorkItem) -> WorkItemView:
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
        mock=row.mock,
        created_at=row.created_at,
        updated_at=row.updated_at,
        result=row.result,
        spec=row.spec,
        links=_links(request, row),
    )


async def _owned(store: StoreDep, principal: PrincipalDep, work_item_id: str) -> WorkItem:
    row = await store.get_work_item(work_item_id, principal.tenant_id)
    if row is None:
        # Another tenant's item is indistinguishable from a missing one.
        raise ProblemError(404, "not_found", f"no work item {work_item_id}")
    return row


@router.post(
    "",
    status_code=202,
    response_model=SubmitResponse,
    summary="Submit a work item",
    responses={200: {"model": SubmitResponse, "description": "Already submitted (same idempotency key)"}},
)
async def submit(
    request: Request,
    response: Response,
    spec: WorkItemSpec,
    principal: PrincipalDep,
    service: ServiceDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200)] = None,
) -> SubmitResponse:
    if idempotency_key and spec.idempotency_key is None:
        spec = spec.model_copy(update={"idempotency_key": idempotency_key})
    try:
        res = await service.submit(principal.tenant_id, spec)
    except SubmissionRejected as exc:
        raise ProblemError(
            422, "invalid_work_item", str(exc), errors=[{"field": exc.field or "", "message": str(exc)}]
        ) from exc
    except WorkflowUnavailable as exc:
        raise ProblemError(503, "temporal_unavailable", f"{exc}; retry with the same idempotency key") from exc
    if not res.created:
        response.status_code = 200
    return SubmitResponse(
        id=res.row.id,
        workflow_id=res.row.workflow_id,
        state=res.row.state,
        created=res.created,
        links=_links(request, res.row),
    )


def _cursor_encode(row: WorkItem) -> str:
    return base64.urlsafe_b64encode(json.dumps([row.created_at, row.id]).encode()).decode()


def _cursor_decode(cursor: str) -> tuple[float, str]:
    try:
        ts, wid = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return float(ts), str(wid)
    except Exception as exc:
        raise ProblemError(400, "invalid_cursor", "the cursor is not one this API returned") from exc


@router.get("", response_model=WorkItemPage, summary="List work items, newest first (keyset pagination)")
async def list_items(
    request: Request,
    principal: PrincipalDep,
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
    state: WorkItemState | None = None,
    kind: Annotated[str | None, Query(max_length=32)] = None,
) -> WorkItemPage:
    rows = await store.list_work_items(
        principal.tenant_id,
        limit=limit + 1,
        before=_cursor_decode(cursor) if cursor else None,
        state=state.value if state else None,
        kind=kind,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return WorkItemPage(
        items=[view(request, r) for r in rows],
        next_cursor=_cursor_encode(rows[-1]) if more and rows else None,
    )


@router.get("/{work_item_id}", response_model=WorkItemView, summary="Get a work item with its attempts")
async def get_item(
    request: Request,
    work_item_id: str,
    principal: PrincipalDep,
    store: StoreDep,
    service: ServiceDep,
    live: bool = True,
) -> WorkItemView:
    row = await _owned(store, principal, work_item_id)
    v = view(request, row)
    v.attempts = [
        AttemptView(
            number=a.number,
            verdict=a.verdict,
            reason=a.reason,
            cause=a.cause,
            fingerprint=a.fingerprint,
            token=a.token,
            agent=a.agent,
            validation=a.validation,
        )
        for a in await store.list_attempts(row.id)
    ]
    if live and not WorkItemState(row.state).terminal:
        v.live = await service.live_status(row)
    return v


@router.get("/{work_item_id}/events", response_model=list[EventView], summary="The work item's event log")
async def events(
    work_item_id: str,
    principal: PrincipalDep,
    store: StoreDep,
    after: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
) -> list[EventView]:
    row = await _owned(store, principal, work_item_id)
    return [
        EventView(id=e.id, type=e.type, data=e.data, token=e.token, created_at=e.created_at)
        for e in await store.list_events(row.id, after_id=after, limit=limit)
    ]


@router.get("/{work_item_id}/artifacts/{artifact_id}", summary="Download an artifact")
async def artifact(work_item_id: str, artifact_id: str, principal: PrincipalDep, store: StoreDep) -> Response:
    row = await _owned(store, principal, work_item_id)
    from sqlalchemy import select

    from crewwork.store.tables import Artifact

    async with store.session() as s:
        found = (
            await s.execute(
                select(Artifact.content, Artifact.content_type, Artifact.name).where(
                    Artifact.id == artifact_id, Artifact.work_item_id == row.id
                )
            )
        ).first()
    if found is None:
        raise ProblemError(404, "not_found", f"no artifact {artifact_id} on {work_item_id}")
    content, ctype, name = found
    return Response(bytes(content), media_type=ctype, headers={"Content-Disposition": f'inline; filename="{name}"'})


@router.post("/{work_item_id}/review", response_model=ReviewResponse, summary="Approve, reject or request changes")
async def review(
    work_item_id: str, decision: ReviewDecision, principal: PrincipalDep, store: StoreDep, service: ServiceDep
) -> ReviewResponse:
    row = await _owned(store, principal, work_item_id)
    try:
        msg = await service.review(row, decision)
    except ReviewRejected as exc:
        raise ProblemError(409, "review_not_allowed", str(exc)) from exc
    return ReviewResponse(id=row.id, message=msg)


@router.post("/{work_item_id}/cancel", status_code=202, response_model=ReviewResponse, summary="Cancel")
async def cancel(work_item_id: str, principal: PrincipalDep, store: StoreDep, service: ServiceDep) -> ReviewResponse:
    row = await _owned(store, principal, work_item_id)
    if WorkItemState(row.state).terminal:
        raise ProblemError(409, "already_finished", f"work item {row.id} is already {row.state}")
    try:
        await service.cancel(row)
    except WorkflowUnavailable as exc:
        raise ProblemError(503, "temporal_unavailable", str(exc)) from exc
    return ReviewResponse(id=row.id, message="cancellation requested")
