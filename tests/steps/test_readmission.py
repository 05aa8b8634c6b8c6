"""The admission of an item that reviewers sent back (WorkItemWorkflow._readmit), through the control activities, on
SQLite and PostgreSQL: it waits behind the tenant's in-flight limit, and its admission, whichever way it comes,
carries its attempts' failure fingerprints (the same-cause breaker's memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crewwork.config import Settings
from crewwork.models import WorkItemResult, WorkItemSpec, WorkItemState
from crewwork.steps.admit import AdmitInput
from crewwork.steps.finish import FinishInput
from crewwork.steps.ports import Ports
from crewwork.steps.record import RecordInput
from crewwork.steps.registry import bound
from crewwork.steps.state import SetStateInput
from crewwork.store.store import Store

TASK = WorkItemSpec.model_validate({"kind": "task", "input": {}})


async def _item(store: Store, tid: str) -> str:
    row, _ = await store.create_work_item(tenant_id=tid, spec=TASK, base_commit=None, repo_path=None)
    return str(row.id)


async def _to_review_with_a_failed_attempt(control: Any, tid: str, wid: str) -> None:
    """`wid` (admitted) fails attempt 1, and attempt 2 goes to review."""
    rec = RecordInput(
        work_item_id=wid, tenant_id=tid, step=2, attempt=1, verdict="failed", reason="1 test failed", fingerprint="fp"
    )
    assert (await control.record_attempt(rec)).ok
    review = SetStateInput(work_item_id=wid, tenant_id=tid, step=3, state=WorkItemState.awaiting_review, attempt=2)
    assert (await control.set_state(review)).ok


def _queued(wid: str, tid: str, step: int) -> SetStateInput:
    return SetStateInput(
        work_item_id=wid, tenant_id=tid, step=step, state=WorkItemState.queued, reason="changes requested", attempt=2
    )


async def test_sent_back_item_waits_for_the_place_it_gave_up_and_gets_it_handed_with_fingerprints(
    any_store: Store, tmp_path: Path
) -> None:
    store = any_store
    control = bound(Ports.build(store, Settings(data_dir=tmp_path, tenant_max_in_flight=1)))
    tid = await store.ensure_tenant("readmission")
    sent_back, other = await _item(store, tid), await _item(store, tid)
    assert (await control.admit(AdmitInput(work_item_id=sent_back, tenant_id=tid, step=1, spec=TASK))).admitted
    assert not (await control.admit(AdmitInput(work_item_id=other, tenant_id=tid, step=1, spec=TASK))).admitted
    # Going to review hands the place to the queued item.
    await _to_review_with_a_failed_attempt(control, tid, sent_back)
    assert (await store.get_work_item(other)).state == "admitted"  # type: ignore[union-attr]

    assert (await control.set_state(_queued(sent_back, tid, 4))).ok
    waiting = await control.admit(AdmitInput(work_item_id=sent_back, tenant_id=tid, step=5, spec=TASK, resumed=True))
    assert not waiting.admitted and waiting.queued_position == 1
    assert (await store.get_work_item(sent_back)).state == "queued"  # type: ignore[union-attr]

    done = WorkItemResult(work_item_id=other, state=WorkItemState.succeeded, reason="done")
    assert (await control.finish(FinishInput(work_item_id=other, tenant_id=tid, step=2, result=done))).ok
    assert (await store.get_work_item(sent_back)).state == "admitted"  # type: ignore[union-attr]
    # The workflow asks once more (it does not take the signal's word): admitted, with its attempts' history.
    res = await control.admit(AdmitInput(work_item_id=sent_back, tenant_id=tid, step=6, spec=TASK, resumed=True))
    assert res.admitted and res.past_fingerprints == ["fp"], res


async def test_sent_back_item_with_a_free_place_is_admitted_at_once_with_fingerprints(
    any_store: Store, tmp_path: Path
) -> None:
    store = any_store
    control = bound(Ports.build(store, Settings(data_dir=tmp_path, tenant_max_in_flight=1)))
    tid = await store.ensure_tenant("readmission-free")
    wid = await _item(store, tid)
    assert (await control.admit(AdmitInput(work_item_id=wid, tenant_id=tid, step=1, spec=TASK))).admitted
    await _to_review_with_a_failed_attempt(control, tid, wid)
    assert (await control.set_state(_queued(wid, tid, 4))).ok
    res = await control.admit(AdmitInput(work_item_id=wid, tenant_id=tid, step=5, spec=TASK, resumed=True))
    assert res.admitted and res.past_fingerprints == ["fp"] and res.attempts_recorded == 1, res
    assert (await store.get_work_item(wid)).state == "admitted"  # type: ignore[union-attr]
    # A later item of the tenant finds the place taken.
    later = await _item(store, tid)
    assert not (await control.admit(AdmitInput(work_item_id=later, tenant_id=tid, step=1, spec=TASK))).admitted
