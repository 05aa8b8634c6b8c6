"""The workflow's terminal decision is written even if a zombie takes a newer token just before it.

`finish` issues its token inside its own write transaction, so there is no window between issue and write for a zombie
to slip into; the zombie's own late write is then refused because the item is closed."""

from __future__ import annotations

from typing import Any

from crewwork.activities.control import ControlActivities
from crewwork.config import Settings
from crewwork.contracts import FinishInput
from crewwork.models import WorkItemResult, WorkItemSpec, WorkItemState
from crewwork.store.store import Store, work_item_fence_key


async def test_finish_wins_over_a_zombie_token_taken_between_issue_and_write(any_store: Store, tmp_path: Any) -> None:
    tid = await any_store.ensure_tenant("finish")
    row, _ = await any_store.create_work_item(
        tenant_id=tid, spec=WorkItemSpec.model_validate({"kind": "task", "input": {}}), base_commit=None, repo_path=None
    )
    key = work_item_fence_key(row.id)
    zombie_tokens: list[int] = []
    real_set_state = any_store.set_state

    async def racing_set_state(**kw: Any) -> Any:
        if not zombie_tokens:
            # A zombie activity attempt starts right now and takes a token just before finish writes.
            zombie_tokens.append(await any_store.issue_token(key))
        return await real_set_state(**kw)

    any_store.set_state = racing_set_state  # type: ignore[method-assign]
    try:
        control = ControlActivities(any_store, Settings(data_dir=tmp_path))
        result = WorkItemResult(work_item_id=row.id, state=WorkItemState.succeeded, reason="done")
        out = await control.finish(FinishInput(work_item_id=row.id, tenant_id=tid, result=result))
    finally:
        any_store.set_state = real_set_state  # type: ignore[method-assign]
    assert out.ok and out.token is not None and out.token > zombie_tokens[0]
    stored = await any_store.get_work_item(row.id)
    assert stored is not None and stored.state == "succeeded"
    types = [e.type for e in await any_store.list_events(row.id)]
    assert "stale_write_rejected" not in types, "finish's token is issued inside its write: it cannot be stale"
    assert types.count("state_changed") == 1, types

    # The zombie's own late write is refused: the item is closed.
    late = await any_store.set_state(
        work_item_id=row.id, tenant_id=tid, token=zombie_tokens[0], state=WorkItemState.running, writer="zombie"
    )
    assert late.stale
    again = await any_store.set_state(
        work_item_id=row.id,
        tenant_id=tid,
        token=await any_store.issue_token(key),
        state=WorkItemState.running,
        writer="late-starting zombie",
    )
    assert again.closed and (await any_store.get_work_item(row.id)).state == "succeeded"  # type: ignore[union-attr]
