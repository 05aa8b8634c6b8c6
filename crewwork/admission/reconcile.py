"""The reconciler: close the store's record of a work item whose workflow ended without saying so.

A workflow records its own end (`finish`, a fenced write). One that is terminated (an operator in the Web UI, `temporal
workflow terminate`), that times out, or that fails outside its own handling never does: its item stays `running`
(or `queued`, `awaiting_review`, ...) in the store forever. It then holds one of its tenant's in-flight places (the
tenant's queue stalls once enough of them pile up), keeps its workspace lease until the lease expires, and its API
status and `crewwork wait` never end.

Every control-pool process runs `Reconciler.run`: each pass takes the next `batch` open items (not terminal, older
than `min_age_s`) in submission order, through the partial index `ix_work_items_open` (migration 0009), and asks
Temporal for the state of each item's workflow (its latest run: a run continued as new counts as its successor).
For a closed workflow it writes the end in one fenced write at `CLOSED_WORKFLOW`, a rank above any step a workflow
can schedule, so nothing a zombie attempt of that workflow writes later is accepted; the write hands the item's
place on to the tenant's queue as any ending write does. Then it releases the item's leases and removes its
worktrees on this host.

An open item whose workflow Temporal does not know, in a state before its workflow's first write (submitted, queued,
admitted), is one admitted before its workflow started (crewwork/admission/starts.py) whose start was lost or is due: the
reconciler admits it if it is not yet (first come, first served) and starts it admitted; one that stays queued is
left alone. Nothing is closed on a guess: any other workflow Temporal does not know (retention removed it, or the
pool points at another namespace) is left alone and logged, and so is every item whose workflow still runs.
Several control processes may reconcile at once: the fenced write is refused for an item already terminal.

Only an operator closes those: `crewwork reconcile --close-unknown` (`run_cycle(close_unknown=True)`) ends each open
item past its workflow's first write whose workflow Temporal does not know as `dead`, saying why, with the same fenced
write. That is the step after restoring crewwork's store without Temporal's history (docs/operations.md, "Backups"),
run once the operator has checked that the pools point at the right namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from crewwork.admission import starts
from crewwork.admission.handoff import HAND_OFF_CAP, tell_admitted
from crewwork.config import Settings
from crewwork.models import WorkItemResult, WorkItemState
from crewwork.store.fencing import FencedWrite, Rank, StateChange
from crewwork.store.open_items import OpenItem
from crewwork.store.store import Store
from crewwork.workspace.tree import remove_tree

log = logging.getLogger("crewwork.admission.reconcile")

CLOSED_WORKFLOW = Rank(step=10**12, attempt=0)
"""The rank of the reconciler's write: above any step number a workflow reaches (one per activity call, carried
across continue-as-new), so every later write of the closed workflow's attempts is refused."""

WRITER = "reconciler"
DESCRIBE_TIMEOUT = timedelta(seconds=10)
"""How long one describe may take: Temporal unreachable fails the pass (logged, tried again next interval) instead of
holding it."""


@dataclass
class Pass:
    """What one pass saw."""

    checked: int = 0
    running: int = 0
    closed: list[str] = field(default_factory=list)
    """Items this pass ended."""
    unknown: list[str] = field(default_factory=list)
    """Items whose workflow Temporal does not know (left alone)."""
    started: list[str] = field(default_factory=list)
    """Items admitted before their workflow started whose start this pass made (crewwork/admission/starts.py)."""
    queued: int = 0
    """Queued items with no workflow yet (crewwork/admission/starts.py) that stay queued: their tenant is at its limit."""
    errors: int = 0
    cycle_done: bool = False
    """This pass read the cycle's last open items: the next one starts over at the oldest."""


class Reconciler:
    def __init__(self, store: Store, client: Client, settings: Settings) -> None:
        self.store = store
        self.client = client
        self.settings = settings
        self._after: tuple[float, str] | None = None
        """Where the next pass of this cycle starts: the last item the previous one read (submission time, id)."""
        self._horizon: float | None = None
        """The cycle's end: it covers the items submitted up to this time (the database clock at its first pass,
        less the minimum age). Items submitted later wait for the next cycle, so a stream of new items cannot keep
        a cycle from reaching its end and starting over at the oldest."""

    async def run(self, stop: asyncio.Event) -> None:
        """Passes every `reconcile_interval_s` until `stop` is set. A failed pass is logged and the next one tries
        again (Temporal or the store may be down for a while)."""
        interval = self.settings.reconcile_interval_s
        # The first pass one interval after the start: a pool's start (or a fleet restarting at once) is not the
        # moment for it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        while not stop.is_set():
            try:
                res = await self.run_once()
                if res.closed:
                    log.warning(
                        "reconciler: closed %d item(s) whose workflow had ended: %s", len(res.closed), res.closed
                    )
            except Exception as exc:  # a pass never takes the pool down
                log.warning("reconciler: pass failed: %s: %s", type(exc).__name__, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def run_cycle(
        self, *, batch: int | None = None, min_age_s: float | None = None, close_unknown: bool = False
    ) -> Pass:
        """Passes until every open item submitted before now (less the minimum age) was looked at once: what
        `crewwork reconcile` runs. `close_unknown`: also end, as `dead`, the items past their workflow's first write
        whose workflow Temporal does not know (they are then in `closed`, not `unknown`)."""
        total = Pass()
        self._after = self._horizon = None
        while True:
            res = await self.run_once(batch=batch, min_age_s=min_age_s, close_unknown=close_unknown)
            total.checked += res.checked
            total.running += res.running
            total.closed += res.closed
            total.unknown += res.unknown
            total.started += res.started
            total.queued += res.queued
            total.errors += res.errors
            if res.cycle_done:
                return total

    async def run_once(
        self,
        *,
        batch: int | None = None,
        min_age_s: float | None = None,
        unstarted_after_s: float | None = None,
        close_unknown: bool = False,
    ) -> Pass:
        """One pass over the next `batch` open items of the current cycle (from where the previous pass stopped;
        after the cycle's last one the next pass starts a new cycle at the oldest). First, the items admitted more
        than `unstarted_after_s` (UNSTARTED_AFTER_S) ago that no workflow has written: a start lost after an
        admission is made within a pass or two, not after the minimum age."""
        batch = batch or self.settings.reconcile_batch
        min_age_s = self.settings.reconcile_min_age_s if min_age_s is None else min_age_s
        res = Pass()
        after = UNSTARTED_AFTER_S if unstarted_after_s is None else unstarted_after_s
        before = await self.store.db_now() - after
        for row in await self.store.admitted_unstarted(before, starts.ADMISSION.encode(), batch):
            try:
                await self._check(row, res, count_running=False)
            except Exception as exc:
                res.errors += 1
                log.warning("reconciler: %s: %s: %s", row.id, type(exc).__name__, exc)
        rows = await self._next_open(batch, min_age_s)
        if len(rows) < batch:
            self._after = self._horizon = None  # the end of the cycle: the next pass starts over
            res.cycle_done = True
        else:
            self._after = (rows[-1].created_at, rows[-1].id)
        for row in rows:
            res.checked += 1
            try:
                await self._check(row, res, close_unknown=close_unknown)
            except Exception as exc:
                res.errors += 1
                log.warning("reconciler: %s: %s: %s", row.id, type(exc).__name__, exc)
        return res

    async def _next_open(self, batch: int, min_age_s: float) -> list[OpenItem]:
        if self._horizon is None:
            self._horizon = await self.store.db_now() - min_age_s
        return await self.store.open_items(self._horizon, self._after, batch)

    async def _check(
        self, row: OpenItem, res: Pass, *, count_running: bool = True, close_unknown: bool = False
    ) -> None:
        handle = self.client.get_workflow_handle(row.workflow_id)
        try:
            desc = await handle.describe(rpc_timeout=DESCRIBE_TIMEOUT)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                if row.state in starts.UNSTARTED and await self._start_missing(row, res):
                    return
                if close_unknown:
                    reason = (
                        f"its workflow {row.workflow_id} is not in Temporal (closed by `crewwork reconcile "
                        "--close-unknown`: a store restored without Temporal's history, or history past retention)"
                    )
                    result = WorkItemResult(work_item_id=row.id, state=WorkItemState.dead, reason=reason)
                    if await self._close(
                        row, res, WorkItemState.dead, reason, result.model_copy(update={"mock": row.mock})
                    ):
                        log.warning("reconciler: %s was %s; %s", row.id, row.state, reason)
                    return
                res.unknown.append(row.id)
                log.info("reconciler: %s: Temporal has no workflow %s; left as %s", row.id, row.workflow_id, row.state)
                return
            raise
        status = desc.status
        if status in (None, WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW):
            res.running += int(count_running)
            return
        state, reason, returned = await self._ending(handle, desc.run_id, status)
        result = returned or WorkItemResult(work_item_id=row.id, state=state, reason=reason)
        # A mock agent's item stays labelled mock (known since submission), whatever the workflow got to return.
        result = result.model_copy(update={"mock": result.mock or row.mock})
        if await self._close(row, res, state, reason, result):
            log.warning("reconciler: %s was %s; its workflow %s: %s", row.id, row.state, status.name.lower(), reason)

    async def _close(self, row: OpenItem, res: Pass, state: WorkItemState, reason: str, result: WorkItemResult) -> bool:
        """The item's end, in one fenced write at CLOSED_WORKFLOW; then its place, leases and worktrees go. False when
        it had ended meanwhile (the workflow's own write, or another control process)."""
        fields: dict[str, Any] = {"result": result.model_dump(mode="json"), "mock": result.mock}
        if result.delivery_branch or result.landed_commit:
            fields.update(delivery_branch=result.delivery_branch, landed_commit=result.landed_commit)
        done = await self.store.set_state(
            StateChange(
                FencedWrite(row.id, row.tenant_id, CLOSED_WORKFLOW, WRITER),
                state,
                reason,
                fields=fields,
                max_in_flight=self.settings.tenant_max_in_flight,
                hand_off_cap=HAND_OFF_CAP,
            )
        )
        if not done.ok:
            return False
        res.closed.append(row.id)
        await tell_admitted(self.client, done.value, self.store, self.settings)
        await self.store.release_leases_held_by(row.id)
        await remove_tree(self.settings.resolved_worktree_dir() / row.id)
        return True

    async def _start_missing(self, row: OpenItem, res: Pass) -> bool:
        """An item admitted before its workflow started (crewwork/admission/starts.py) whose start was lost, or is due: start
        it. `admitted`: admitted already (the start after the hand-off or the submission's admission never came).
        `submitted`/`queued`: admit it now, first come, first served (the process died between the submission's
        insert and its admission; or a place is free that no write handed on: the operator raised the limit), and
        start it if admitted; still queued, it is left as it is. True when the item was dealt with."""
        stored = await self.store.get_work_item(row.id)
        if stored is None or stored.fence_rank > starts.ADMISSION.encode():
            # A workflow wrote it once (it ran, and Temporal no longer knows it): not an item whose start was lost.
            return False
        if row.state == WorkItemState.admitted.value:
            if await starts.start_admitted(self.client, self.settings, stored):
                res.started.append(row.id)
                log.warning("reconciler: %s: admitted with no workflow; started it", row.id)
            return True
        state = await starts.admit_and_start(self.store, self.client, self.settings, stored)
        if state == WorkItemState.queued.value:
            res.queued += 1
            return True
        if state == WorkItemState.admitted.value:
            res.started.append(row.id)
            log.warning("reconciler: %s: %s with no workflow; admitted and started it", row.id, row.state)
            return True
        return False

    async def _ending(
        self, handle: Any, run_id: str | None, status: WorkflowExecutionStatus
    ) -> tuple[WorkItemState, str, WorkItemResult | None]:
        """The item's end for a workflow that closed without writing it, and why (the closing event's reason or
        failure, when Temporal has one); with the result a completed workflow returned."""
        if status == WorkflowExecutionStatus.COMPLETED:
            # It returned a result, but its own last write never landed (a finish that failed for good).
            with contextlib.suppress(Exception):
                result = await handle.result(result_type=WorkItemResult, rpc_timeout=DESCRIBE_TIMEOUT)
                if WorkItemState(result.state).terminal:
                    return WorkItemState(result.state), result.reason or "completed", result
            return WorkItemState.dead, "its workflow completed without recording the item's end", None
        if status == WorkflowExecutionStatus.CANCELED:
            return WorkItemState.cancelled, "cancelled (its workflow was cancelled)", None
        detail = await self._closing_detail(handle.id, run_id)
        what = {
            WorkflowExecutionStatus.TERMINATED: "was terminated",
            WorkflowExecutionStatus.TIMED_OUT: "timed out",
            WorkflowExecutionStatus.FAILED: "failed",
        }.get(status, f"ended ({status.name.lower()})")
        return WorkItemState.dead, f"its workflow {what}" + (f": {detail}" if detail else ""), None

    async def _closing_detail(self, workflow_id: str, run_id: str | None) -> str:
        """The reason a terminated workflow was given, or the message of a failed one: the last history event,
        read alone (newest first), so a long history costs no more than a short one."""
        try:
            page = await self.client.workflow_service.get_workflow_execution_history_reverse(
                GetWorkflowExecutionHistoryReverseRequest(
                    namespace=self.client.namespace,
                    execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id or ""),
                    maximum_page_size=1,
                ),
                timeout=DESCRIBE_TIMEOUT,
            )
        except RPCError:
            return ""
        if not page.history.events:
            return ""
        e = page.history.events[0]
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
            text = e.workflow_execution_terminated_event_attributes.reason
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            text = e.workflow_execution_failed_event_attributes.failure.message
        else:
            return ""
        return " ".join(text.split())[:REASON_MAX_CHARS]


UNSTARTED_AFTER_S = 30.0
"""An item admitted this long ago that no workflow has written is checked by every pass (its workflow may never have
been started: the process died between the admission's write and the start). A code change waiting for its
workspace lease is one too, until it gets it: one describe per pass each."""

REASON_MAX_CHARS = 500
"""How much of a termination reason or failure message the item's reason keeps (an operator typed it, or it is an
exception's text)."""
