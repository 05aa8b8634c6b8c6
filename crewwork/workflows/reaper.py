"""RetentionWorkflow: one run of bounded storage, started by the Temporal Schedule `<prefix>-retention` that the
control pools keep (crewwork/temporal/schedules.py), or by hand (`crewwork retention run`).

    compact  the artifacts of items that ended into shared, compressed chunks   (batches until one comes back short)
    retain   the details of items past their tenant's retention period removed  (likewise)
    collect  the chunks no artifact names deleted, after a run that retained something (likewise)

Each batch is one activity on the control pool's queue (crewwork/steps/retain), each item or artifact in its own
transaction under its row lock (crewwork/store/retention.py), so a run can stop anywhere and the next goes on. At most
`max_batches` of each kind per run: a backlog is worked off over several runs, never by one endless run. Short-lived:
with versioned workers it is pinned, like every crewwork workflow (crewwork/temporal/deployment.py), and ends on the
build it started on minutes later; each run starts on the current build. (A versioning behavior named here would make
unversioned workers fail its every task: the behavior comes from the worker's deployment options instead.)

Deterministic code only."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from crewwork.steps.retain import RETENTION_PASS, RetentionPassInput, RetentionPassResult
    from crewwork.workflows.calls import execute


PassKind = Literal["compact", "retain", "collect"]


class RetentionRunInput(BaseModel):
    batch: int = 100
    max_batches: int = 50


class RetentionRunResult(BaseModel):
    compacted: int = 0
    compacted_bytes_in: int = 0
    compacted_bytes_stored: int = 0
    retained: int = 0
    retained_bytes: int = 0
    events_removed: int = 0
    chunks_deleted: int = 0


@workflow.defn(name="RetentionWorkflow")
class RetentionWorkflow:
    @workflow.run
    async def run(self, inp: RetentionRunInput) -> RetentionRunResult:
        out = RetentionRunResult()
        for res in await self._batches("compact", inp):
            out.compacted += res.handled
            out.compacted_bytes_in += res.bytes_in
            out.compacted_bytes_stored += res.bytes_stored
        for res in await self._batches("retain", inp):
            out.retained += res.handled
            out.retained_bytes += res.bytes_in
            out.events_removed += res.events_removed
        if out.retained:
            # Only retention unnames chunks; a run that removed nothing has nothing to collect (the collection reads
            # the chunk table's orphans).
            for res in await self._batches("collect", inp):
                out.chunks_deleted += res.handled
        return out

    async def _batches(self, kind: PassKind, inp: RetentionRunInput) -> list[RetentionPassResult]:
        done: list[RetentionPassResult] = []
        for _ in range(inp.max_batches):
            res = await execute(
                RETENTION_PASS, RetentionPassInput(kind=kind, batch=inp.batch), summary=f"retention: {kind}"
            )
            done.append(res)
            if res.examined < inp.batch:
                break
        return done
