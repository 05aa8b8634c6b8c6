"""The Temporal Schedule of the retention workflow (crewwork/workflows/reaper.py), kept by every control pool.

At start, a control pool makes sure the schedule `<prefix>-retention` exists and says what the settings say (its
interval, its batch sizes), creating or updating it; several control pools starting at once converge (a create that
finds it there updates it). Runs never overlap (a run still going when the next is due makes that one skip), and a
run missed while no control pool polled is not caught up beyond one interval. `CREWWORK_RETENTION_INTERVAL_S=0`
deletes the schedule. The workflow's id is fixed per run time by Temporal (`<prefix>-retention-run-<time>`)."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

from temporalio.client import (
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.service import RPCError, RPCStatusCode

from crewwork.config import Settings
from crewwork.workflows.reaper import RetentionRunInput, RetentionRunResult, RetentionWorkflow

log = logging.getLogger("crewwork.workers")


def retention_schedule_id(settings: Settings) -> str:
    return f"{settings.task_queue_prefix}-retention"


def retention_schedule(settings: Settings) -> Schedule:
    r = settings.retention
    every = timedelta(seconds=r.interval_s)
    return Schedule(
        action=ScheduleActionStartWorkflow(
            RetentionWorkflow.run,
            RetentionRunInput(batch=r.batch, max_batches=r.max_batches),
            id=f"{retention_schedule_id(settings)}-run",
            task_queue=settings.task_queue("control"),
            execution_timeout=max(every, timedelta(hours=1)),
            static_summary="crewwork retention: compact artifacts, remove expired details, collect chunks",
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=every),
    )


async def run_retention_now(client: Any, settings: Settings) -> RetentionRunResult:
    """One run of the retention workflow, now (`crewwork retention run`), on the control queue."""
    res: RetentionRunResult = await client.execute_workflow(
        RetentionWorkflow.run,
        RetentionRunInput(batch=settings.retention.batch, max_batches=settings.retention.max_batches),
        id=f"{retention_schedule_id(settings)}-manual-{uuid.uuid4().hex[:8]}",
        task_queue=settings.task_queue("control"),
    )
    return res


async def ensure_retention_schedule(client: Any, settings: Settings) -> None:
    """Create, update or (interval 0) delete the retention schedule so that it says what `settings` say."""
    sid = retention_schedule_id(settings)
    handle = client.get_schedule_handle(sid)
    if settings.retention.interval_s <= 0:
        try:
            await handle.delete()
            log.info("retention schedule %s deleted (CREWWORK_RETENTION_INTERVAL_S=0)", sid)
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
        return
    wanted = retention_schedule(settings)
    try:
        await client.create_schedule(sid, wanted)
        log.info("retention schedule %s created: every %ss", sid, settings.retention.interval_s)
        return
    except ScheduleAlreadyRunningError:
        pass

    def _update(_: ScheduleUpdateInput) -> ScheduleUpdate:
        return ScheduleUpdate(schedule=wanted)

    await handle.update(_update)
