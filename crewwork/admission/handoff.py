"""Handing a freed place on: a write that ends an item's hold on its tenant's in-flight place admits the tenant's
first queued items in the same transaction (`hand_off` in crewwork/store/fencing/reference.py); this starts their
workflows admitted, or tells those already running (crewwork/admission/starts.py).

Every writer that can free a place uses it: the state and finish steps, and the reconciler closing an item whose
workflow ended without saying so. It sits below both, beside the store."""

from __future__ import annotations

import logging
from typing import Any

from temporalio.service import RPCError, RPCStatusCode

from crewwork.admission import starts
from crewwork.config import Settings
from crewwork.store.fencing import HandedOff
from crewwork.store.store import Store

log = logging.getLogger("crewwork.admission.handoff")

HAND_OFF_CAP = 3
"""At most this many of the tenant's queued items are admitted by one item leaving its place (more than one only when
the in-flight limit was raised, or places were freed without a hand-off: an item ended some other way)."""


async def tell_admitted(client: Any, handed: list[HandedOff] | None, store: Store, settings: Settings) -> None:
    """Start the workflows of the queued items a write admitted, admitted; a workflow already running (one that waits
    for its place inside: an item reviewers sent back, or one started before admission moved to the submission) gets
    the `admitted` signal instead. Best effort: the admission is in the store already; a start that fails here is
    made by the reconciler (crewwork/admission/reconcile.py), and a workflow that waits inside finds its admission at its next
    poll (crewwork.workflows.policies.QUEUE_POLL).

    A plain start, then a signal only when Temporal has the workflow already, rather than signal-with-start: nearly
    every handed item has no workflow yet, and signal-with-start writes a signal event into each new history that its
    first workflow task then has to handle (bench/trace.py: 0.93 signals per item at 8 slots)."""
    if not handed or client is None:
        return
    for item in handed:
        try:
            row = await store.start_row(item.work_item_id)
            if row is None:
                continue
            if not await starts.start_admitted(client, settings, row):
                await _signal_running(client, row.workflow_id)
        except Exception as exc:
            log.warning("hand-off: could not start or tell %s: %s: %s", item.work_item_id, type(exc).__name__, exc)


async def _signal_running(client: Any, workflow_id: str) -> None:
    """Tell a running workflow it has its place; one that has closed meanwhile has nothing to be told."""
    try:
        await client.get_workflow_handle(workflow_id).signal("admitted")
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
