"""Signed evidence bundles over HTTP: download a work item's (or one attempt's) bundle, have one attempt's signed
on request, and the public keys bundles verify against (crewwork/attestation, docs/evidence.md).

The signing key is never here: a per-attempt bundle is signed by the control pool (EvidenceBundleWorkflow), and
the keys this process publishes are public keys only (CREWWORK_EVIDENCE_PUBLIC_KEYS, and `<signing key file>.pub`
when one lies next to the configured key file)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from crewwork.api.deps import PrincipalDep, ServiceDep, StateDep, StoreDep
from crewwork.api.problems import PROBLEM_RESPONSES, ProblemError
from crewwork.api.work_items import owned
from crewwork.attestation.keys import published_keys
from crewwork.attestation.publish import BUNDLE_ARTIFACT, attempt_artifact
from crewwork.store.store import Store
from crewwork.store.views import StoredWorkItem

router = APIRouter(tags=["evidence"], responses=PROBLEM_RESPONSES)
BUNDLE_TIMEOUT_S = 60.0
BUNDLE_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/json": {"schema": {"type": "object"}}}, "description": "the bundle"}
}


class KeyView(BaseModel):
    keyid: str = Field(description="securesystemslib's key id: sha256 of the key's canonical form")
    keytype: str
    scheme: str
    status: str = Field(description="active | retired (what it signed still verifies) | revoked (nothing does)")
    note: str
    public_key_pem: str


class KeysView(BaseModel):
    keys: list[KeyView]


@router.get(
    "/evidence/keys",
    response_model=KeysView,
    summary="The public keys evidence bundles are signed with (no API key needed): active, retired and revoked",
)
async def keys(state: StateDep) -> KeysView:
    found = published_keys(state.settings.evidence)
    return KeysView(keys=[KeyView(**k.document()) for k in found])


async def _bundle_artifact(store: Store, row: StoredWorkItem, attempt: int | None) -> bytes | None:
    name = attempt_artifact(attempt) if attempt is not None else BUNDLE_ARTIFACT
    found = [a for a in await store.list_artifacts(row.id) if a.name == name]
    if not found:
        return None
    return await store.artifact_content(found[-1].id)


def _bundle_response(data: bytes) -> Response:
    return Response(
        data,
        media_type="application/json",
        headers={"X-Content-Type-Options": "nosniff", "Content-Disposition": 'attachment; filename="bundle.json"'},
    )


@router.get(
    "/v1/work-items/{work_item_id}/evidence-bundle",
    response_class=Response,
    responses=BUNDLE_RESPONSE,
    summary="The signed evidence bundle of the landed change (or of attempt N, once signed on request)",
)
async def get_bundle(
    work_item_id: str,
    principal: PrincipalDep,
    store: StoreDep,
    attempt: Annotated[int | None, Query(ge=1, le=100_000)] = None,
) -> Response:
    row = await owned(store, principal, work_item_id)
    data = await _bundle_artifact(store, row, attempt)
    if data is not None:
        return _bundle_response(data)
    if attempt is not None:
        detail = (
            f"attempt {attempt} of {row.id} has no signed bundle yet: ask for one with "
            f"POST /v1/work-items/{row.id}/evidence-bundle?attempt={attempt}"
        )
    elif row.landed_commit is None:
        detail = f"work item {row.id} has not landed (it is {row.state}): a bundle is signed when its change lands"
    elif await store.has_event(row.id, "evidence_unsigned"):
        detail = f"work item {row.id} landed while no evidence signing key was configured: it has no bundle"
    else:
        detail = f"work item {row.id} has no evidence bundle"
    raise ProblemError(404, "no_evidence_bundle", detail)


@router.post(
    "/v1/work-items/{work_item_id}/evidence-bundle",
    response_class=Response,
    responses=BUNDLE_RESPONSE,
    summary="Sign attempt N's evidence now (by the control pool, which holds the key) and return the bundle",
)
async def sign_attempt(
    work_item_id: str,
    principal: PrincipalDep,
    store: StoreDep,
    service: ServiceDep,
    attempt: Annotated[int, Query(ge=1, le=100_000)],
) -> Response:
    import asyncio

    from temporalio.client import WorkflowFailureError
    from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
    from temporalio.exceptions import ApplicationError

    from crewwork.api.service import WorkflowUnavailable
    from crewwork.steps.bundle import AttemptBundleInput
    from crewwork.workflows.bundle import EvidenceBundleWorkflow, bundle_workflow_id

    row = await owned(store, principal, work_item_id)
    try:
        client = service._client()
        ref = await asyncio.wait_for(
            client.execute_workflow(
                EvidenceBundleWorkflow.run,
                AttemptBundleInput(work_item_id=row.id, tenant_id=row.tenant_id, attempt=attempt),
                id=bundle_workflow_id(row.id, attempt),
                task_queue=service.settings.task_queue("control"),
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            ),
            BUNDLE_TIMEOUT_S,
        )
    except WorkflowUnavailable as exc:
        raise ProblemError(503, "temporal_unavailable", str(exc)) from exc
    except TimeoutError:
        raise ProblemError(
            503, "evidence_unavailable", f"no control pool signed it within {BUNDLE_TIMEOUT_S:g} s"
        ) from None
    except WorkflowFailureError as exc:
        cause: BaseException | None = exc.cause
        while cause is not None and not isinstance(cause, ApplicationError):
            cause = getattr(cause, "cause", None)
        if isinstance(cause, ApplicationError) and cause.type == "NothingToSign":
            raise ProblemError(409, "nothing_to_sign", cause.message) from None
        if isinstance(cause, ApplicationError) and cause.type == "EvidenceUnavailable":
            raise ProblemError(503, "evidence_unavailable", cause.message) from None
        raise ProblemError(503, "evidence_unavailable", str(cause or exc)) from None
    data = await store.artifact_content(ref.id)
    if data is None:
        raise ProblemError(503, "evidence_unavailable", "the signed bundle is not in the store")
    return _bundle_response(data)
