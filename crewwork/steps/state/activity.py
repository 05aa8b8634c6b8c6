"""The state step's activity: one fenced state change (with an attempt's record when the input carries one); giving up
the item's place hands it on, in the same write."""

from __future__ import annotations

from crewwork.admission.handoff import HAND_OFF_CAP, tell_admitted
from crewwork.steps.attempt import AttemptWriter
from crewwork.steps.ports import Ports
from crewwork.steps.record.activity import attempt_record
from crewwork.steps.state import SetStateInput
from crewwork.steps.step import WriteOutcome


async def set_state(ports: Ports, inp: SetStateInput) -> WriteOutcome:
    w = AttemptWriter.of(ports.store, inp)
    # Awaiting review holds no place: it goes to the first queued item, in this write.
    res = await w.set_state(
        inp.state,
        inp.reason,
        event_data={"attempt": inp.attempt} if inp.attempt is not None else None,
        max_in_flight=ports.settings.tenant_max_in_flight,
        hand_off_cap=HAND_OFF_CAP,
        attempt=attempt_record(inp.record) if inp.record is not None else None,
    )
    await tell_admitted(ports.client, res.value, ports.store, ports.settings)
    return WriteOutcome(ok=res.ok, stale=res.stale)
