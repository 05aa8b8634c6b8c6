"""Legal holds: a tenant keeps one of its work items whole, whatever the retention policy says (docs/operations.md,
"Retention and legal holds"). Setting and clearing a hold are recorded in the item's event log (`legal_hold_set`,
`legal_hold_cleared`, with the caller's API key id), which retention keeps too. Scoped like every work-item route:
another tenant's item is a 404."""

from __future__ import annotations

from fastapi import APIRouter

from crewwork.api.bodies import CheckedJsonRoute
from crewwork.api.deps import PrincipalDep, StoreDep
from crewwork.api.problems import PROBLEM_RESPONSES, ProblemError, refuse_unstorable_body
from crewwork.api.schemas import LegalHoldRequest, LegalHoldView
from crewwork.api.work_items import owned
from crewwork.store.engine import NotFound

router = APIRouter(
    prefix="/v1/work-items", tags=["work items"], responses=PROBLEM_RESPONSES, route_class=CheckedJsonRoute
)


@router.put(
    "/{work_item_id}/legal-hold",
    response_model=LegalHoldView,
    summary="Put a legal hold on a work item: retention keeps it whole until the hold is cleared",
    description="Idempotent; a second PUT replaces the reason (both are in the event log). On an item whose details "
    "retention already removed (`retained_at` set), the hold keeps what is left.",
)
async def set_hold(
    work_item_id: str, principal: PrincipalDep, store: StoreDep, body: LegalHoldRequest | None = None
) -> LegalHoldView:
    # Ownership first: another tenant's item is a 404 whatever the body says (tests/api/test_api_tenancy.py).
    row = await owned(store, principal, work_item_id)
    if body is None:
        message = "reason: a legal hold needs a reason, which its event keeps"
        raise ProblemError(422, "invalid_request", message, errors=[{"field": "reason", "message": message}])
    refuse_unstorable_body(body)
    try:
        hold, retained = await store.set_legal_hold(
            row.id, None if principal.admin else principal.tenant_id, reason=body.reason, actor=principal.key_id
        )
    except NotFound as exc:
        raise ProblemError(404, "not_found", str(exc)) from exc
    return LegalHoldView(id=row.id, legal_hold=hold, retained_at=retained)


@router.delete(
    "/{work_item_id}/legal-hold",
    response_model=LegalHoldView,
    summary="Clear a work item's legal hold: retention may then remove its details when they are due",
)
async def clear_hold(work_item_id: str, principal: PrincipalDep, store: StoreDep) -> LegalHoldView:
    row = await owned(store, principal, work_item_id)
    try:
        hold, retained = await store.set_legal_hold(
            row.id, None if principal.admin else principal.tenant_id, reason=None, actor=principal.key_id
        )
    except NotFound as exc:
        raise ProblemError(404, "not_found", str(exc)) from exc
    return LegalHoldView(id=row.id, legal_hold=hold, retained_at=retained)
