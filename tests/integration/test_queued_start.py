"""A queued item has no workflow until its place comes (crewwork/starts.py), through the real API on a real Temporal
dev server and real PostgreSQL: the submission says `queued`, the item reads as queued (no live status, no error),
it can be cancelled (its workflow is started to record the cancellation, and its place in the queue goes to the
next), and the items behind it run in submission order."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.service import RPCError, RPCStatusCode

from crewwork.invariants import check_invariants
from crewwork.temporal.devserver import DevServer
from tests.conftest import ApiServer, make_settings, running_crew

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


def _task(delay_s: float) -> dict[str, object]:
    return {"kind": "task", "input": {}, "agent": {"name": "scripted", "config": {"output": {}, "delay_s": delay_s}}}


async def test_a_queued_item_waits_without_a_workflow_and_can_be_cancelled(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    settings = make_settings(tmp_path, temporal_server, pg_url, tenant_max_in_flight=1)
    async with running_crew(settings, pools=("control", "agent")) as crew:
        _kid, key = await crew.store.create_api_key("queue")
        async with ApiServer(settings) as api, api.client(key) as c:
            first = await c.post("/v1/work-items", json=_task(3.0))
            assert first.status_code == 202 and first.json()["state"] == "admitted", first.text
            holder = first.json()["id"]
            behind = []
            for _ in range(3):
                r = await c.post("/v1/work-items", json=_task(0.0))
                assert r.status_code == 202 and r.json()["state"] == "queued", r.text
                behind.append(r.json()["id"])
            doomed, second, third = behind
            row = await crew.store.get_work_item(doomed)
            assert row is not None
            with pytest.raises(RPCError) as err:
                await crew.client.get_workflow_handle(row.workflow_id).describe()
            assert err.value.status == RPCStatusCode.NOT_FOUND

            view = await c.get(f"/v1/work-items/{doomed}")
            assert view.status_code == 200 and view.json()["state"] == "queued", view.text
            assert view.json().get("live") is None
            review = await c.post(f"/v1/work-items/{doomed}/review", json={"action": "approve"})
            assert review.status_code == 409, review.text

            cancel = await c.post(f"/v1/work-items/{doomed}/cancel")
            assert cancel.status_code == 202, cancel.text
            cancelled = await crew.wait_state(doomed, "cancelled", timeout_s=30)
            assert cancelled.reason == "cancelled by request", cancelled.reason
            again = await c.post(f"/v1/work-items/{doomed}/cancel")
            assert again.status_code == 409, again.text

        for wid in (holder, second, third):
            assert (await crew.result(wid, timeout_s=60)).state == "succeeded"
        # The cancelled item's place in the queue went to the next: `second` was handed the holder's place.
        handed = [e for e in await crew.store.list_events(second) if e.data.get("state") == "admitted"]
        assert [e.data["writer"] for e in handed] == [f"hand_off from {holder}"], handed
        (await check_invariants(crew.store, [holder, *behind])).assert_ok()
