"""Starting a work item's workflow, admitted (CREWWORK_ADMIT_AT_SUBMISSION, on by default).

Admission is decided before the workflow starts, by the same fenced write the workflow's admit step makes
(`Store.admit`: first come, first served under the tenant's in-flight limit), at rank `ADMISSION` — above the
submission's insert, below every step a workflow schedules, so anything the workflow writes outranks it:

- at submission (crewwork/api/service.py): admitted -> the workflow starts with the terms in its input and asks for no
  admission; queued -> **no workflow yet**. On PostgreSQL the admission is made by the submission's own call
  (`crewwork_submit`, migration 0016: the insert, then this same fenced write, one round trip and one commit);
  elsewhere by `admit_and_start` after the insert. A queued item then costs Temporal nothing while it waits: before, its
  workflow started, asked, upserted `queued`, started a fallback timer, and took a signal and another workflow
  task when a place was handed to it (bench/trace.py: ~11 ms of CPU per queued item, 20% of the throughput at 8
  slots with one tenant at its limit);
- when a freed place is handed to a queued item (the ending item's write admits it: `hand_off`,
  crewwork/store/fencing/reference.py): `tell_admitted` (crewwork/admission/handoff.py) starts its workflow
  admitted, or signals a workflow already running (one started before this, or an item reviewers sent back,
  waiting for a place inside its workflow);
- by the reconciler (crewwork/admission/reconcile.py), for an open item whose workflow Temporal does not know: the start
  above was lost (the process died between the write and the start) or is due (a queued item whose place was freed
  without a hand-off: the operator raised the limit).

Every start is idempotent: the workflow id is the item's, and a second start of it is refused by Temporal
(REJECT_DUPLICATE: a closed workflow is never started again) and ignored here.

The price, written down in docs/performance.md: a queued item is in the API, the console and the store, not in the
Temporal Web UI, until its place comes. Cancelling it starts its workflow (which finds itself queued) and cancels it,
so a cancellation is recorded by the workflow as every other is.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol, TypeVar

from temporalio.client import Client
from temporalio.common import Priority, SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from crewwork.config import Settings
from crewwork.models import AdmissionTerms, WorkItemInput, WorkItemKind, WorkItemSpec, WorkItemState
from crewwork.models.limits import effective_budget
from crewwork.models.search import SA_KIND, SA_REPO, SA_STATE, SA_TENANT
from crewwork.observability.metrics import WORKFLOW_STARTS
from crewwork.store.fencing import FencedWrite, Rank
from crewwork.store.store import Store
from crewwork.store.views import StoredWorkItem

log = logging.getLogger("crewwork.admission.starts")
R = TypeVar("R")

ADMISSION = Rank(0, 1)
"""The rank of an admission made before the workflow starts: above the submission (0, 0), below the workflow's
first step (1, 1). A second such admission (an idempotent resubmission, the reconciler) presents the same rank,
which the fence accepts; once the workflow has written, it is refused as stale."""

WORKFLOW = "WorkItemWorkflow"
"""Started by name: this module sits below the workflow package (crewwork/workflows/work_item.py defines it)."""


class Startable(Protocol):
    """What a start reads of the item's row (a `StoredWorkItem`, or the hand-off's lean `StartRow`)."""

    @property
    def id(self) -> str: ...
    @property
    def tenant_id(self) -> str: ...
    @property
    def workflow_id(self) -> str: ...
    @property
    def spec(self) -> dict[str, Any]: ...
    @property
    def repo_url(self) -> str | None: ...
    @property
    def base_commit(self) -> str | None: ...
    @property
    def mock(self) -> bool: ...


WAITING = frozenset({WorkItemState.submitted.value, WorkItemState.queued.value})
UNSTARTED = WAITING | {WorkItemState.admitted.value}
"""The states of an item whose workflow may not have been started yet (queued, or admitted with its start on the
way): Temporal not knowing its workflow is no error for these."""
SUMMARY_MAX_CHARS = 200
"""Temporal's UI shows the summary as one line; it accepts up to 400 bytes."""


def terms(spec: WorkItemSpec, settings: Settings) -> AdmissionTerms:
    """What an admitted item runs under: its budget capped by the operator's ceilings, and its review deadline
    capped by the ceiling (what the admit step decides too: crewwork/steps/admit/activity.py)."""
    review = spec.review.timeout_s
    ceiling = settings.max_review_timeout_s_ceiling
    return AdmissionTerms(
        budget=effective_budget(spec.budget, settings.operator_ceilings()),
        review_timeout_s=min(review, ceiling) if review is not None else ceiling,
    )


def workflow_summary(row: Startable, spec: WorkItemSpec) -> tuple[str, str]:
    """The workflow's summary and details in Temporal's Web UI, so a run reads without opening its payloads: the
    kind and the instruction's first line (or the agent, for a task), then kind, repository, agent and tenant."""
    first = (spec.instruction or "").strip().splitlines()[0].strip() if (spec.instruction or "").strip() else ""
    what = first or f"{spec.agent.name} agent"
    summary = f"{spec.kind.value}: {what}"
    if len(summary) > SUMMARY_MAX_CHARS:
        summary = summary[: SUMMARY_MAX_CHARS - 1] + "…"
    lines = [
        f"**work item** `{row.id}`",
        f"**kind** {spec.kind.value}",
        f"**tenant** `{row.tenant_id}`",
        f"**agent** {spec.agent.name}",
    ]
    if row.repo_url:
        ref = spec.repo.ref if spec.repo is not None else ""
        lines.append(f"**repository** `{row.repo_url}` @ `{ref}` ({(row.base_commit or '')[:12]})")
    if first:
        lines.append(f"**instruction** {first[:500]}")
    return summary, "\n\n".join(lines)


async def start(
    client: Client,
    settings: Settings,
    row: Startable,
    *,
    spec: WorkItemSpec | None = None,
    admission: AdmissionTerms | None = None,
) -> bool:
    """Start the item's workflow (`admission`: admitted already, with these terms; None: it runs its own admission).
    False when Temporal has a workflow with this id already (running, or closed: never started again)."""
    spec = spec or WorkItemSpec.model_validate(row.spec)
    inp = WorkItemInput(
        work_item_id=row.id,
        tenant_id=row.tenant_id,
        spec=spec,
        repo_path=row.repo_url,
        base_commit=row.base_commit,
        mock=row.mock,
        admission=admission,
    )
    # The state it starts in, so its first workflow task need not upsert it: an admitted task runs at once.
    state = "submitted"
    if admission is not None:
        state = WorkItemState.running.value if spec.kind == WorkItemKind.task else WorkItemState.admitted.value
    pairs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(SA_STATE, state),
        SearchAttributePair(SA_KIND, spec.kind.value),
        SearchAttributePair(SA_TENANT, row.tenant_id),
    ]
    if row.repo_url:
        pairs.append(SearchAttributePair(SA_REPO, row.repo_url[-250:]))
    summary, details = workflow_summary(row, spec)
    try:
        handle = await client.start_workflow(
            WORKFLOW,
            inp,
            id=row.workflow_id,
            task_queue=settings.task_queue("control"),
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=TypedSearchAttributes(pairs) if settings.search_attributes else None,
            static_summary=summary,
            static_details=details,
            # Task-queue fairness by tenant (a key is at most 64 bytes; tenant ids are short), when asked for.
            priority=Priority(fairness_key=row.tenant_id[:64]) if settings.fairness_keys else Priority.default,
            # Only a process that runs a control worker on this client gets the first workflow task back (a control
            # pool's hand-off, reconciler or state step): no matching, no poll (docs/performance.md, "Eager
            # workflow start"). The SDK asks for it only when such a worker has a free slot; else a plain start.
            request_eager_start=settings.eager_start,
        )
    except WorkflowAlreadyStartedError:
        WORKFLOW_STARTS.labels(how="duplicate").inc()
        return False
    # The SDK marks the handle when the reply carried the first workflow task (the attribute its own tests read;
    # were it renamed, every start would count as plain, and tests/integration/test_queued_start.py would say so).
    WORKFLOW_STARTS.labels(how="eager" if getattr(handle, "__temporal_eagerly_started", False) else "plain").inc()
    return True


async def start_admitted(
    client: Client, settings: Settings, row: Startable, *, spec: WorkItemSpec | None = None
) -> bool:
    """`start` for an item admitted already (by the submission's request, a hand-off or the reconciler), under the
    terms `terms` gives it."""
    spec = spec or WorkItemSpec.model_validate(row.spec)
    return await start(client, settings, row, spec=spec, admission=terms(spec, settings))


async def admit_and_start(
    store: Store, client: Client, settings: Settings, row: StoredWorkItem, *, spec: WorkItemSpec | None = None
) -> str:
    """Admit a submitted (or queued) item and start its workflow admitted; leave it queued, with no workflow, while
    its tenant is at its limit. For an item the workflow has written already (it runs), or one that ended, nothing
    is written and nothing started. Returns the item's state afterwards as this call knows it."""
    res = await store.admit(
        FencedWrite(row.id, row.tenant_id, ADMISSION, "admission"), settings.tenant_max_in_flight, _no_fingerprints
    )
    if res.missing:
        raise LookupError(f"work item {row.id} is not in the store")
    if res.closed or not res.ok or res.value is None:
        # Ended, or its workflow has written (it started; a stale admission changes nothing).
        return res.state or row.state
    if not res.value.admitted:
        return WorkItemState.queued.value
    await start_admitted(client, settings, row, spec=spec)
    return WorkItemState.admitted.value if res.state in WAITING else (res.state or row.state)


async def _no_fingerprints(_s: Any, _work_item_id: str) -> list[str | None]:
    # An admission before the workflow starts is a fresh item's: the breaker's memory is empty (a resumed run asks
    # in its own admit step).
    return []


async def workflow_result(client: Client, workflow_id: str, result_type: type[R], *, poll_s: float = 0.2) -> R:
    """The result of an item's workflow, waiting first for it to be started (a queued item's starts when its place
    comes). Bound it with `asyncio.wait_for`."""
    handle = client.get_workflow_handle(workflow_id, result_type=result_type)
    while True:
        try:
            return await handle.result()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
        await asyncio.sleep(poll_s)
