"""The admit step's activity against the real store (SQLite and PostgreSQL): admission moves only a waiting item,
operator ceilings apply, and the tenant's in-flight limit queues later items first come, first served."""

from __future__ import annotations

from typing import Any

import pytest

from crewwork.config import Settings
from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.steps.admit import AdmitInput
from crewwork.steps.ports import Ports
from crewwork.steps.registry import bound
from crewwork.store.store import Rank, Store
from tests.steps.items import TASK, new_item, set_state_at


async def test_admission_moves_only_a_waiting_item_and_reports_a_closed_or_missing_one(
    any_store: Store, tmp_path: Any
) -> None:
    tid, wid = await new_item(any_store, tenant="admission")
    control = bound(Ports.build(any_store, Settings(data_dir=tmp_path)))
    spec = WorkItemSpec.model_validate(TASK)
    first = await control.admit(AdmitInput(work_item_id=wid, tenant_id=tid, step=1, spec=spec))
    assert first.admitted and first.past_fingerprints == [] and first.budget is not None
    assert first.review_timeout_s == Settings(data_dir=tmp_path).max_review_timeout_s_ceiling
    await set_state_at(any_store, wid, Rank(2, 1), WorkItemState.running, "r")
    again = await control.admit(AdmitInput(work_item_id=wid, tenant_id=tid, step=3, spec=spec))  # continued run
    assert again.admitted and (await any_store.get_work_item(wid)).state == "running"  # type: ignore[union-attr]
    await set_state_at(any_store, wid, Rank(4, 1), WorkItemState.failed, "f")
    closed = await control.admit(AdmitInput(work_item_id=wid, tenant_id=tid, step=5, spec=spec))
    assert not closed.admitted and closed.reason == "already failed"
    from temporalio.exceptions import ApplicationError

    with pytest.raises(ApplicationError) as err:
        await control.admit(AdmitInput(work_item_id="wi_nope", tenant_id=tid, step=1, spec=spec))
    assert err.value.type == "BadInput"
    admitted = [e for e in await any_store.list_events(wid) if e.data.get("state") == "admitted"]
    assert len(admitted) == 1


async def test_operator_ceilings_apply_where_the_submission_set_none(any_store: Store, tmp_path: Any) -> None:
    tid, wid = await new_item(any_store, tenant="ceilings")
    settings = Settings(data_dir=tmp_path, max_tokens_ceiling=1234, max_wall_clock_s_ceiling=99.0)
    control = bound(Ports.build(any_store, settings))
    res = await control.admit(
        AdmitInput(work_item_id=wid, tenant_id=tid, step=1, spec=WorkItemSpec.model_validate(TASK))
    )
    assert res.budget is not None and (res.budget.max_tokens, res.budget.max_wall_clock_s) == (1234, 99.0)
    tid2, wid2 = await new_item(any_store, tenant="ceilings", budget={"max_tokens": 10**6})
    over = await control.admit(
        AdmitInput(
            work_item_id=wid2,
            tenant_id=tid2,
            step=1,
            spec=WorkItemSpec.model_validate({**TASK, "budget": {"max_tokens": 10**6}}),
        )
    )
    assert not over.admitted and "max_tokens" in over.reason


async def test_the_tenant_in_flight_limit_queues_later_items_first_come_first_served(
    any_store: Store, tmp_path: Any
) -> None:
    control = bound(Ports.build(any_store, Settings(data_dir=tmp_path, tenant_max_in_flight=2)))
    spec = WorkItemSpec.model_validate(TASK)
    items = [await new_item(any_store, tenant="flood") for _ in range(4)]
    other = await new_item(any_store, tenant="quiet")

    async def admit(item: tuple[str, str], step: int) -> Any:
        return await control.admit(AdmitInput(work_item_id=item[1], tenant_id=item[0], step=step, spec=spec))

    got = [await admit(i, 1) for i in items]
    assert [g.admitted for g in got] == [True, True, False, False]
    assert [g.queued_position for g in got[2:]] == [1, 2]
    assert [(await any_store.get_work_item(i[1])).state for i in items[2:]] == ["queued", "queued"]  # type: ignore[union-attr]
    assert (await admit(other, 1)).admitted, "another tenant's item is not held back by this tenant's limit"
    # The fourth cannot jump the third when a place frees: first come, first served.
    await set_state_at(any_store, items[0][1], Rank(2, 1), WorkItemState.succeeded, "finish#1")
    assert not (await admit(items[3], 2)).admitted
    assert (await admit(items[2], 2)).admitted
    queued = [e for e in await any_store.list_events(items[3][1]) if e.data.get("state") == "queued"]
    assert len(queued) == 1, "waiting again does not write again"
