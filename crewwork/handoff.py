"""Handing a freed place on: a write that ends an item's hold on its tenant's in-flight place admits the tenant's
first queued items in the same transaction (`hand_off` in crewwork/store/fencing_python.py); this tells their workflows so.

Every writer that can free a place uses it: the state and finish steps, and the reconciler closing an item whose
workflow ended without saying so. It sits below both, beside the store."""

from __future__ import annotations

import contextlib
from typing import Any

from crewwork.store.fencing import HandedOff

HAND_OFF_CAP = 3
"""At most this many of the tenant's queued items are admitted by one item leaving its place (more than one only when
the in-flight limit was raised, or places were freed without a hand-off: an item ended some other way)."""


async def tell_admitted(client: Any, handed: list[HandedOff] | None) -> None:
    """Tell the workflows of the queued items a write admitted (`hand_off` in crewwork/store/fencing_python.py) that they may go on.
    Best effort: the admission is in the store already, and a queued item that misses the signal finds it there
    at its next admission poll (crewwork.workflows.policies.QUEUE_POLL)."""
    if not handed or client is None:
        return
    for item in handed:
        with contextlib.suppress(Exception):
            await client.get_workflow_handle(item.workflow_id).signal("admitted")
