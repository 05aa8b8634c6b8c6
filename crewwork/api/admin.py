"""Who am I, and the operators' view of the worker pools (Temporal task-queue descriptions)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from crewwork.api.bodies import CheckedJsonRoute
from crewwork.api.deps import AdminDep, PrincipalDep, StateDep
from crewwork.api.problems import PROBLEM_RESPONSES, ProblemError
from crewwork.models.pools import POOLS

router = APIRouter(prefix="/v1", tags=["admin"], responses=PROBLEM_RESPONSES, route_class=CheckedJsonRoute)


class MeView(BaseModel):
    tenant_id: str
    key_id: str
    scopes: list[str]
    admin: bool
    temporal_ui: str
    review_names: bool = Field(
        default=True, description="Whether review decisions may carry a reviewer name (CREWWORK_REVIEW_NAMES)."
    )


class PollerView(BaseModel):
    identity: str
    last_access_time: float | None
    rate_per_second: float


class QueueView(BaseModel):
    pool: str
    task_queue: str
    kind: str = Field(description="workflow or activity task queue")
    pollers: list[PollerView]
    backlog: int | None = Field(description="Approximate backlog (tasks waiting for a poller).")
    backlog_age_s: float | None
    add_rate: float | None
    dispatch_rate: float | None


class WorkersView(BaseModel):
    namespace: str
    queues: list[QueueView]


@router.get("/me", response_model=MeView, summary="The authenticated key: tenant and scopes")
async def me(principal: PrincipalDep, state: StateDep) -> MeView:
    settings = state.settings
    return MeView(
        tenant_id=principal.tenant_id,
        key_id=principal.key_id,
        scopes=sorted(principal.scopes),
        admin=principal.admin,
        temporal_ui=f"{settings.temporal_ui_url.rstrip('/')}/namespaces/{settings.temporal_namespace}/workflows",
        review_names=settings.review_names,
    )


@router.get("/admin/workers", response_model=WorkersView, summary="Worker pools: pollers and backlog (admin)")
async def workers(_admin: AdminDep, state: StateDep) -> WorkersView:
    from temporalio.api.enums.v1 import DescribeTaskQueueMode, TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
    from temporalio.service import RPCError

    service, settings = state.service, state.settings
    if service.client is None:
        raise ProblemError(503, "temporal_unavailable", "not connected to Temporal")
    out: list[QueueView] = []
    for pool in POOLS:
        name = settings.task_queue(pool)
        kinds = [("workflow", TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)] if pool == "control" else []
        kinds.append(("activity", TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY))
        for kind, tq_type in kinds:
            req = DescribeTaskQueueRequest(
                namespace=settings.temporal_namespace,
                task_queue=TaskQueue(name=name),
                task_queue_type=tq_type,
                report_stats=True,
                api_mode=DescribeTaskQueueMode.DESCRIBE_TASK_QUEUE_MODE_UNSPECIFIED,
            )
            try:
                resp = await service.client.workflow_service.describe_task_queue(req)
            except RPCError as exc:
                raise ProblemError(503, "temporal_unavailable", f"describe_task_queue failed: {exc.message}") from exc
            stats = resp.stats if resp.HasField("stats") else None
            out.append(
                QueueView(
                    pool=pool,
                    task_queue=name,
                    kind=kind,
                    pollers=[
                        PollerView(
                            identity=p.identity,
                            last_access_time=p.last_access_time.ToSeconds() if p.HasField("last_access_time") else None,
                            rate_per_second=p.rate_per_second,
                        )
                        for p in resp.pollers
                    ],
                    backlog=int(stats.approximate_backlog_count) if stats else None,
                    backlog_age_s=stats.approximate_backlog_age.ToTimedelta().total_seconds() if stats else None,
                    add_rate=stats.tasks_add_rate if stats else None,
                    dispatch_rate=stats.tasks_dispatch_rate if stats else None,
                )
            )
    return WorkersView(namespace=settings.temporal_namespace, queues=out)
