"""Replays over HTTP: re-run a recorded attempt with the model answered from its transcript (docs/gateway.md).

A replay runs on an agent pool (ReplayWorkflow: it needs the sandbox, the mirror and the agent CLIs; this process
loads none of them) and takes as long as the agent does, so `POST .../replay?attempt=N` starts it and answers 202 with
where to follow it; `GET .../replay?id=ID` answers `running`, then the report once it is done.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from crewwork.api.deps import PrincipalDep, ServiceDep, StoreDep
from crewwork.api.problems import PROBLEM_RESPONSES, ProblemError
from crewwork.api.work_items import owned

router = APIRouter(tags=["replay"], responses=PROBLEM_RESPONSES)


class ReplayView(BaseModel):
    id: str = Field(description="the replay's id (its workflow's id)")
    status: str = Field(description="running | completed | failed")
    report: dict[str, Any] | None = Field(
        default=None,
        description="once completed: recorded and replayed calls, provider_calls (0), same_questions, divergences, "
        "observations, same_diff, verdict, the replayed diff",
    )
    error: str | None = None


@router.post(
    "/v1/work-items/{work_item_id}/replay",
    status_code=202,
    response_model=ReplayView,
    summary="Replay attempt N on an agent pool, the model answered from its transcript (no model is called)",
)
async def start_replay(
    work_item_id: str,
    principal: PrincipalDep,
    store: StoreDep,
    service: ServiceDep,
    response: Response,
    attempt: Annotated[int, Query(ge=1, le=100_000)],
) -> ReplayView:
    from crewwork.api.service import WorkflowUnavailable
    from crewwork.steps.replay import ReplayInput
    from crewwork.workflows.replay import ReplayWorkflow, replay_workflow_id

    row = await owned(store, principal, work_item_id)
    if attempt < 1 or not any(a.number == attempt for a in await store.list_attempts(row.id)):
        raise ProblemError(404, "no_such_attempt", f"work item {row.id} has no recorded attempt {attempt}")
    rid = replay_workflow_id(row.id, attempt, secrets.token_hex(4))
    try:
        await service._client().start_workflow(
            ReplayWorkflow.run,
            ReplayInput(work_item_id=row.id, tenant_id=row.tenant_id, attempt=attempt),
            id=rid,
            task_queue=service.settings.task_queue("control"),
        )
    except WorkflowUnavailable as exc:
        raise ProblemError(503, "temporal_unavailable", str(exc)) from exc
    response.headers["Location"] = f"/v1/work-items/{row.id}/replay?id={rid}"
    return ReplayView(id=rid, status="running")


@router.get(
    "/v1/work-items/{work_item_id}/replay",
    response_model=ReplayView,
    summary="A replay's status, and its report once it is done",
)
async def get_replay(
    work_item_id: str,
    principal: PrincipalDep,
    store: StoreDep,
    service: ServiceDep,
    replay_id: Annotated[str, Query(alias="id", min_length=1, max_length=200)],
) -> ReplayView:
    from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
    from temporalio.service import RPCError

    from crewwork.api.service import WorkflowUnavailable
    from crewwork.steps.replay import ReplayOutcome

    row = await owned(store, principal, work_item_id)
    if not replay_id.startswith(f"replay-{row.id}-"):
        raise ProblemError(404, "no_such_replay", f"work item {row.id} has no replay {replay_id}")
    try:
        handle = service._client().get_workflow_handle(replay_id, result_type=ReplayOutcome)
        described = await handle.describe()
        if described.status == WorkflowExecutionStatus.RUNNING:
            return ReplayView(id=replay_id, status="running")
        outcome = await handle.result()
    except WorkflowUnavailable as exc:
        raise ProblemError(503, "temporal_unavailable", str(exc)) from exc
    except RPCError:
        raise ProblemError(404, "no_such_replay", f"work item {row.id} has no replay {replay_id}") from None
    except WorkflowFailureError as exc:
        return ReplayView(id=replay_id, status="failed", error=str(exc.cause or exc))
    if outcome.error is not None:
        return ReplayView(id=replay_id, status="failed", error=outcome.error)
    return ReplayView(id=replay_id, status="completed", report=outcome.report)
