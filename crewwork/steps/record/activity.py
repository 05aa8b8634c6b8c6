"""The record step's activity: an attempt's record, fenced; the answer is the item's recorded fingerprints."""

from __future__ import annotations

from crewwork.steps.attempt import AttemptWriter
from crewwork.steps.ports import Ports
from crewwork.steps.record import RecordInput, RecordResult
from crewwork.store.store import AttemptRecord


def attempt_record(inp: RecordInput) -> AttemptRecord:
    return AttemptRecord(
        number=inp.attempt,
        verdict=inp.verdict,
        reason=inp.reason,
        cause=inp.cause,
        fingerprint=inp.fingerprint,
        agent=inp.agent.model_dump(mode="json") if inp.agent else None,
        validation=inp.validation.model_dump(mode="json") if inp.validation else None,
    )


async def record_attempt(ports: Ports, inp: RecordInput) -> RecordResult:
    store = ports.store
    w = AttemptWriter.of(store, inp)
    res = await w.record_attempt(attempt_record(inp))
    # Rejected: report the recorded history as it stands.
    fingerprints = res.value if res.value is not None else await store.fingerprints(inp.work_item_id)
    return RecordResult(ok=res.ok, stale=res.stale, fingerprints=fingerprints)
