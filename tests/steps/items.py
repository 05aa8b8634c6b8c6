"""Work items for the step and store tests: a task item, a state change at a rank, a finish at a step."""

from __future__ import annotations

from typing import Any

from crewwork.models import WorkItemResult, WorkItemSpec, WorkItemState
from crewwork.steps.finish import FinishInput
from crewwork.store.fencing import FencedWrite, StateChange
from crewwork.store.store import Rank, Store

TASK = {"kind": "task", "input": {}}


async def new_item(store: Store, tenant: str = "fencing", **spec: Any) -> tuple[str, str]:
    tid = await store.ensure_tenant(tenant)
    row, _ = await store.create_work_item(
        tenant_id=tid, spec=WorkItemSpec.model_validate({**TASK, **spec}), base_commit=None, repo_path=None
    )
    return tid, row.id


async def set_state_at(store: Store, wid: str, rank: Rank, state: WorkItemState, writer: str, **kw: Any) -> Any:
    tid = (await store.get_work_item(wid)).tenant_id  # type: ignore[union-attr]
    return await store.set_state(
        StateChange(FencedWrite(work_item_id=wid, tenant_id=tid, rank=rank, writer=writer), state=state, **kw)
    )


async def finish_task(control: Any, item: tuple[str, str], step: int) -> Any:
    tid, wid = item
    result = WorkItemResult(work_item_id=wid, state=WorkItemState.succeeded, reason="done")
    return await control.finish(FinishInput(work_item_id=wid, tenant_id=tid, step=step, result=result))
