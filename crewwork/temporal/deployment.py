"""Temporal Worker Versioning for crewwork's pools: the deployment version a pool process declares, and what Temporal
says an execution runs on.

A pool process with CREWWORK_DEPLOYMENT_BUILD_ID set polls as version `NAME:BUILD_ID` of the worker deployment `NAME`
(`deployment_config`). Temporal then sends each workflow task and each activity task of a *pinned* execution
(WorkItemWorkflow) to workers of the version it started on, whichever newer versions poll the same task queues, and
starts new executions on the deployment's current version, which the operator sets (`temporal worker deployment
set-current-version`, docs/operations.md "Deploying a new build"). So an item runs to its end on the code it started
with; a version is retired when Temporal reports it drained. Unset: unversioned workers, as before (every item moves
to whatever code polls, and only `workflow.patched` keeps old histories replaying)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from temporalio.api.enums.v1 import VersioningBehavior as VersioningBehaviorProto
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.worker import WorkerDeploymentConfig

from crewwork.config import Settings


def deployment_config(settings: Settings) -> WorkerDeploymentConfig | None:
    """The version this process's workers declare, or None (unversioned) when no build id is set. A workflow type
    that says no versioning behavior of its own is pinned."""
    d = settings.deployment
    if d.build_id is None:
        return None
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(deployment_name=d.name, build_id=d.build_id),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


@dataclass(frozen=True)
class ExecutionBuild:
    deployment: str
    build_id: str
    behavior: str
    """`pinned`, `auto_upgrade` (or `unspecified`)."""
    override: str | None = None
    """An operator's versioning override, e.g. `pinned to crewwork:b1`."""


def _behavior(value: Any) -> str:
    name = VersioningBehaviorProto.Name(value) if value else "VERSIONING_BEHAVIOR_UNSPECIFIED"
    return name.removeprefix("VERSIONING_BEHAVIOR_").lower()


def execution_build(raw_description: Any) -> ExecutionBuild | None:
    """The version an execution runs on, from `DescribeWorkflowExecution` (`WorkflowExecutionDescription
    .raw_description`), or None when it runs on unversioned workers (or has not run a task yet)."""
    info = raw_description.workflow_execution_info
    if not info.HasField("versioning_info"):
        return None
    v = info.versioning_info
    version = v.deployment_version if v.HasField("deployment_version") else None
    if version is None or not version.build_id:
        return None
    override = None
    if v.HasField("versioning_override"):
        o = v.versioning_override
        if o.HasField("pinned") and o.pinned.HasField("version"):
            pv = o.pinned.version
            override = f"pinned to {pv.deployment_name}:{pv.build_id}"
        elif o.auto_upgrade:
            override = "auto_upgrade"
    return ExecutionBuild(version.deployment_name, version.build_id, _behavior(v.behavior), override)


@dataclass(frozen=True)
class VersionSummary:
    build_id: str
    status: str
    """`current`, `ramping`, `draining` (pinned executions still open), `drained`, `inactive`."""
    drainage: str
    """Temporal's drainage status of a version that is no longer current: `draining`, `drained` or empty."""


@dataclass(frozen=True)
class DeploymentState:
    name: str
    current: str | None
    """The current build (where new executions start); None: unversioned workers."""
    ramping: str | None
    ramping_percentage: float
    versions: list[VersionSummary]


def _enum_word(value: Any, prefix: str) -> str:
    return str(value).removeprefix(prefix).lower() if value else ""


async def describe_deployment(client: Any, name: str) -> DeploymentState | None:
    """The worker deployment `name` as Temporal knows it, or None when no versioned worker of it has polled yet."""
    from temporalio.api.enums.v1 import VersionDrainageStatus, WorkerDeploymentVersionStatus
    from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest
    from temporalio.service import RPCError, RPCStatusCode

    try:
        res = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    info = res.worker_deployment_info
    routing = info.routing_config
    versions = [
        VersionSummary(
            build_id=v.deployment_version.build_id,
            status=_enum_word(WorkerDeploymentVersionStatus.Name(v.status), "WORKER_DEPLOYMENT_VERSION_STATUS_"),
            drainage=_enum_word(VersionDrainageStatus.Name(v.drainage_status), "VERSION_DRAINAGE_STATUS_")
            if v.drainage_status
            else "",
        )
        for v in info.version_summaries
    ]
    current = routing.current_deployment_version.build_id or None
    ramping = routing.ramping_deployment_version.build_id or None
    return DeploymentState(name, current, ramping, routing.ramping_version_percentage, versions)


PROPAGATION_WAIT_S = 30.0
"""How long `set_current_build` waits for Temporal to apply a new current version on every task queue."""

STUCK_STATE_CHECK_S = 10.0
"""After this long with Temporal's update state still `IN_PROGRESS`, `set_current_build` also asks each task queue
of the version which version it routes new executions to (temporalio/temporal#11842: the state can stay
`IN_PROGRESS` for good after the routing has reached the queues)."""


async def _queues_route_to(client: Any, name: str, build_id: str) -> bool:
    """Whether every task queue the version `name:build_id` polls says `build_id` is its current version."""
    from temporalio.api.deployment.v1 import WorkerDeploymentVersion as VersionProto
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest, DescribeWorkerDeploymentVersionRequest

    res = await client.workflow_service.describe_worker_deployment_version(
        DescribeWorkerDeploymentVersionRequest(
            namespace=client.namespace, deployment_version=VersionProto(deployment_name=name, build_id=build_id)
        )
    )
    queues = res.worker_deployment_version_info.task_queue_infos
    if not queues:
        return False
    for q in queues:
        tq = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace, task_queue=TaskQueue(name=q.name), task_queue_type=q.type
            )
        )
        if tq.versioning_info.current_deployment_version.build_id != build_id:
            return False
    return True


async def set_current_build(
    client: Any, name: str, build_id: str | None, *, identity: str = "crewwork", wait_s: float = PROPAGATION_WAIT_S
) -> None:
    """Make `build_id` the deployment's current version (None: unversioned workers): new executions start there;
    pinned ones stay where they are. Refused by Temporal while no worker of that version has polled every task queue
    the current version has (so a half-started build cannot take new items).

    Temporal applies the change to the task queues' partitions after it answers; until it has, a new execution may
    still start on the previous version (seen in tests/deploy/test_worker_versioning.py: an item submitted right after
    a rollback started on the build rolled back from). So this returns only once Temporal says the routing update is
    complete, or every task queue of the version says it routes to it (Temporal's own state can stay `IN_PROGRESS`
    after that: STUCK_STATE_CHECK_S), or fails after `wait_s` (PROPAGATION_WAIT_S by default)."""
    import asyncio
    import time

    from temporalio.api.enums.v1 import RoutingConfigUpdateState
    from temporalio.api.workflowservice.v1 import (
        DescribeWorkerDeploymentRequest,
        SetWorkerDeploymentCurrentVersionRequest,
    )

    await client.workflow_service.set_worker_deployment_current_version(
        SetWorkerDeploymentCurrentVersionRequest(
            namespace=client.namespace, deployment_name=name, build_id=build_id or "", identity=identity
        )
    )
    started = time.monotonic()
    deadline = started + wait_s
    next_check = started
    while True:
        res = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
        )
        info = res.worker_deployment_info
        current = info.routing_config.current_deployment_version.build_id or None
        done = info.routing_config_update_state != RoutingConfigUpdateState.ROUTING_CONFIG_UPDATE_STATE_IN_PROGRESS
        if current == build_id and done:
            return
        now = time.monotonic()
        if build_id is not None and current == build_id and now - started > STUCK_STATE_CHECK_S and now >= next_check:
            next_check = now + 2.0
            if await _queues_route_to(client, name, build_id):
                return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"Temporal has not applied {name}:{build_id} as the current version on every task queue after "
                f"{wait_s:.0f}s (current {current}, update complete: {done})"
            )
        await asyncio.sleep(0.2)
