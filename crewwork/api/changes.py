"""Reviewing a change: the attempt's diff (a unified diff, or its files, hunks and numbered lines) and the decision on
it (approve, reject, request changes; with line comments). Every route is scoped to the caller's tenant, as the
work-items resource is (crewwork/api/work_items.py)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response

from crewwork.api.bodies import CheckedJsonRoute
from crewwork.api.deps import PrincipalDep, ServiceDep, StateDep, StoreDep
from crewwork.api.problems import PROBLEM_RESPONSES, ProblemError, refuse_unstorable_body
from crewwork.api.schemas import DiffView, ReviewResponse
from crewwork.api.service import ReviewRejected, WorkflowUnavailable
from crewwork.api.work_items import item_artifact, owned
from crewwork.models import ReviewDecision
from crewwork.models.diff import DiffLimits, DiffTooLarge, parse_unified_diff
from crewwork.models.review import missing_words

router = APIRouter(
    prefix="/v1/work-items", tags=["work items"], responses=PROBLEM_RESPONSES, route_class=CheckedJsonRoute
)


@router.get(
    "/{work_item_id}/diff",
    summary="The change: a unified diff (latest attempt with a diff, or `attempt=N`), or with `format=json` its files, "
    "hunks and numbered lines",
    response_class=Response,
    responses={
        200: {
            "content": {
                "text/x-diff": {"schema": {"type": "string"}},
                "application/json": {"schema": DiffView.model_json_schema(ref_template="#/components/schemas/{model}")},
            }
        }
    },
)
async def diff(
    request: Request,
    work_item_id: str,
    principal: PrincipalDep,
    store: StoreDep,
    state: StateDep,
    attempt: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    format: Annotated[Literal["text", "json"], Query(description="`json`: the parsed diff (DiffView)")] = "text",
) -> Response:
    row = await owned(store, principal, work_item_id)
    chosen = None
    for a in reversed(await store.list_attempts(row.id)):
        if attempt is not None and a.number != attempt:
            continue
        ref = (a.agent or {}).get("diff_ref") if isinstance(a.agent, dict) else None
        if isinstance(ref, dict) and ref.get("id"):
            chosen = (a.number, str(ref["id"]))
            break
    if chosen is None:
        raise ProblemError(
            404, "no_diff", f"work item {row.id} has no diff" + (f" for attempt {attempt}" if attempt else "")
        )
    art = await item_artifact(store, row, chosen[1], with_content=True)
    headers = {"X-Crewwork-Attempt": str(chosen[0]), "X-Content-Type-Options": "nosniff"}
    if format == "json":
        limits = DiffLimits(max_bytes=state.options.max_download_bytes)
        try:
            # A linear pass over at most max_download_bytes; off the event loop, so a large diff holds up no one.
            model = await asyncio.to_thread(parse_unified_diff, art.content_bytes.decode("utf-8", "replace"), limits)
        except DiffTooLarge as exc:
            raise ProblemError(413, "artifact_too_large", str(exc)) from exc
        body = DiffView(**model.model_dump(), attempt=chosen[0], sha256=art.sha256, base_commit=row.base_commit)
        return Response(body.model_dump_json(), media_type="application/json", headers=headers)
    return Response(art.content_bytes, media_type="text/x-diff; charset=utf-8", headers=headers)


@router.post(
    "/{work_item_id}/review",
    response_model=ReviewResponse,
    summary="Approve, reject or request changes (with line comments)",
    description="Send the `attempt` (and `diff_sha256`) you looked at (`under_review` of the item): a decision on "
    "another attempt than the one awaiting review is refused (409 `review_stale`). A rejection needs a reason and a "
    "request for changes a comment or line comments (422 naming `comment`). Who decided is the API key; a "
    "`reviewer` name is shown beside it where the operator allows names (CREWWORK_REVIEW_NAMES). The decision is "
    "recorded as the item's `review_decided` event and sent to webhooks as `work_item.reviewed`.",
    responses={409: {"description": "Not awaiting review (review_not_allowed), or a stale view (review_stale)"}},
)
async def review(
    request: Request,
    work_item_id: str,
    decision: ReviewDecision,
    principal: PrincipalDep,
    store: StoreDep,
    service: ServiceDep,
    state: StateDep,
) -> ReviewResponse:
    refuse_unstorable_body(decision)
    refusal = missing_words(decision)
    if refusal is not None:
        # The request itself is incomplete, whatever the item's state: a 422 naming the field, not the workflow's 409.
        message = f"comment: {refusal}"
        raise ProblemError(422, "invalid_request", message, errors=[{"field": "comment", "message": message}])
    if decision.reviewer is not None and not state.settings.review_names:
        message = (
            "reviewer: this deployment does not take reviewer names (CREWWORK_REVIEW_NAMES=false): the API key decides"
        )
        raise ProblemError(422, "invalid_request", message, errors=[{"field": "reviewer", "message": message}])
    row = await owned(store, principal, work_item_id)
    # Who decided, as the signed evidence names it: the caller's key, whatever the body says.
    decision = decision.model_copy(update={"api_key_id": principal.key_id})
    try:
        msg = await service.review(row, decision)
    except ReviewRejected as exc:
        code = "review_stale" if str(exc).startswith("stale review") else "review_not_allowed"
        raise ProblemError(409, code, str(exc)) from exc
    except WorkflowUnavailable as exc:
        raise ProblemError(503, "temporal_unavailable", str(exc)) from exc
    return ReviewResponse(id=row.id, message=msg)
