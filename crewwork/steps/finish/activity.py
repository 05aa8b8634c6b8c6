"""The finish step's activity: the workflow's terminal decision, fenced. Once the item is terminal every later write
is refused, zombies included; its place goes to the tenant's first queued items in the same write."""

from __future__ import annotations

from typing import Any

from crewwork.admission.handoff import HAND_OFF_CAP, tell_admitted
from crewwork.steps.attempt import AttemptWriter
from crewwork.steps.finish import FinishInput
from crewwork.steps.ports import Ports
from crewwork.steps.record.activity import attempt_record
from crewwork.steps.step import WriteOutcome


async def finish(ports: Ports, inp: FinishInput) -> WriteOutcome:
    """Write the workflow's terminal decision (with a `task` item's passing attempt record, in one transaction)."""
    w = AttemptWriter.of(ports.store, inp)
    r = inp.result
    fields: dict[str, Any] = {
        "result": r.model_dump(mode="json"),
        "delivery_branch": r.delivery_branch,
        "landed_commit": r.landed_commit,
        "mock": r.mock,
    }
    res = await w.set_state(
        r.state,
        r.reason,
        fields=fields,
        attempt=attempt_record(inp.record) if inp.record is not None else None,
        max_in_flight=ports.settings.tenant_max_in_flight,
        hand_off_cap=HAND_OFF_CAP,
    )
    await tell_admitted(ports.client, res.value, ports.store, ports.settings)
    # Already terminal (a retried finish whose first write landed): nothing left to do.
    return WriteOutcome(ok=res.ok or res.closed, stale=not (res.ok or res.closed))
