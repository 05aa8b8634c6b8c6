"""A queued item has no workflow until its place comes (crewwork/admission/starts.py), through the real API on a real Temporal
dev server and real PostgreSQL: the submission says `queued`, the item reads as queued (no live status, no error),
it can be cancelled (its workflow is started to record the cancellation, and its place in the queue goes to the
next), and the items behind it run in submission order."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.service import RPCError, RPCStatusCode

from crewwork.temporal.devserver import DevServer
from tests.conftest import ApiServer, make_settings, running_crew
from tests.invariants import check_invariants

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


async def test_a_repeated_submission_starts_what_a_broken_first_request_left_and_writes_nothing_else(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    """The same idempotency key and submission again: an item the first request stored but never admitted (it died
    after the insert) is admitted and started; one admitted but never started is started; one that runs or waits
    in the queue is left alone, with no write (an admission at (0, 1) would only be refused as stale)."""
    settings = make_settings(tmp_path, temporal_server, pg_url, tenant_max_in_flight=1)
    async with running_crew(settings, pools=("control", "agent")) as crew:
        from crewwork.api.service import submission_hash
        from crewwork.models import WorkItemSpec

        async def stored_only(key: str, delay_s: float) -> tuple[str, WorkItemSpec]:
            # What a first request that died right after its insert leaves: the row, no admission, no workflow.
            spec = (await crew.service.policy(crew.tenant_id)).with_defaults(
                WorkItemSpec.model_validate({**_task(delay_s), "idempotency_key": key})
            )
            row, created = await crew.store.create_work_item(
                tenant_id=crew.tenant_id,
                spec=spec,
                base_commit=None,
                repo_path=None,
                submission_hash=submission_hash(spec),
            )
            assert created
            return row.id, spec

        running_id, spec = await stored_only("first", 3.0)
        again = await crew.service.submit(crew.tenant_id, spec)
        assert (again.row.id, again.created, again.row.state) == (running_id, False, "admitted")
        await crew.wait_state(running_id, "running")
        # It runs now: a third request writes nothing.
        before = len(await crew.store.list_events(running_id))
        third = await crew.service.submit(crew.tenant_id, spec)
        assert (third.row.id, third.created) == (running_id, False)
        events = await crew.store.list_events(running_id)
        assert not [e for e in events if e.type.endswith("_rejected")], [e.type for e in events]
        assert len(events) >= before

        # Behind it, a stored-only item is admitted by the repeat... into the queue (the tenant is at its limit).
        queued_id, queued_spec = await stored_only("second", 0.0)
        rep = await crew.service.submit(crew.tenant_id, queued_spec)
        assert (rep.row.id, rep.row.state) == (queued_id, "queued")
        rep2 = await crew.service.submit(crew.tenant_id, queued_spec)
        assert rep2.row.state == "queued"
        for wid in (running_id, queued_id):
            assert (await crew.result(wid, timeout_s=60)).state == "succeeded"
        for wid in (running_id, queued_id):
            events = await crew.store.list_events(wid)
            assert not [e for e in events if e.type.endswith("_rejected")], [e.type for e in events]
        (await check_invariants(crew.store, [running_id, queued_id])).assert_ok()


async def test_fairness_keys_put_the_tenant_on_the_workflow(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    """CREWWORK_FAIRNESS_KEYS: the workflow starts with Temporal's fairness key set to its tenant (its activities
    inherit it: Temporal's rule, not asserted here); off (the default), no key."""
    for fair in (True, False):
        settings = make_settings(tmp_path / str(fair), temporal_server, pg_url, fairness_keys=fair)
        async with running_crew(settings, pools=("control", "agent")) as crew:
            wid = await crew.submit(_task(0.0))
            assert (await crew.result(wid)).state == "succeeded"
            row = await crew.store.get_work_item(wid)
            assert row is not None
            handle = crew.client.get_workflow_handle(row.workflow_id)
            info = (await handle.describe()).raw_description.workflow_execution_info
            assert info.priority.fairness_key == (crew.tenant_id if fair else ""), info.priority


def _starts(how: str) -> float:
    from crewwork.observability.metrics import REGISTRY

    return REGISTRY.get_sample_value("crewwork_workflow_starts_total", {"how": how}) or 0.0


async def test_a_control_pool_starts_the_items_it_hands_a_place_to_eagerly(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    """CREWWORK_EAGER_START (on by default): the control pool that frees a place starts the queued item's workflow
    with Temporal's eager start, so the first workflow task comes back to it in the start's reply; off, every start
    is a plain one. Counted by crewwork_workflow_starts_total{how}; the items run as usual either way."""
    for eager in (True, False):
        settings = make_settings(
            tmp_path / str(eager), temporal_server, pg_url, tenant_max_in_flight=1, eager_start=eager
        )
        async with running_crew(settings, pools=("control", "agent")) as crew:
            first = await crew.submit(_task(1.0))
            before = {how: _starts(how) for how in ("eager", "plain")}
            behind = [await crew.submit(_task(0.0)) for _ in range(2)]
            for wid in behind:
                assert (await crew.store.get_work_item(wid)).state == "queued"  # type: ignore[union-attr]
            for wid in (first, *behind):
                assert (await crew.result(wid, timeout_s=60)).state == "succeeded"
            handed = [
                e for wid in behind for e in await crew.store.list_events(wid) if e.data.get("state") == "admitted"
            ]
            assert [e.data["writer"] for e in handed] == [f"hand_off from {first}", f"hand_off from {behind[0]}"]
            started = {how: _starts(how) - n for how, n in before.items()}
            # The two hand-offs' starts, made by the control pool, whose worker serves the control queue.
            assert started == ({"eager": 2, "plain": 0} if eager else {"eager": 0, "plain": 2}), started
            (await check_invariants(crew.store, [first, *behind])).assert_ok()


async def test_a_tenant_whose_queue_is_full_is_refused_with_429_and_nothing_is_stored(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    """CREWWORK_TENANT_MAX_QUEUED through the real API: with one place and two waiting, the next submission is a 429
    `queue_full` problem, stores nothing and starts nothing; a repeat of a waiting item's key still answers 200; another
    tenant is not held up; once the queue moves, the tenant may submit again, and everything it had runs."""
    settings = make_settings(tmp_path, temporal_server, pg_url, tenant_max_in_flight=1, tenant_max_queued=2)
    async with running_crew(settings, pools=("control", "agent")) as crew:
        _kid, key = await crew.store.create_api_key("queue-full")
        _okid, other_key = await crew.store.create_api_key("queue-full-other")
        async with ApiServer(settings) as api, api.client(key) as c, api.client(other_key) as other:
            holder = await c.post("/v1/work-items", json=_task(2.0))
            assert holder.status_code == 202 and holder.json()["state"] == "admitted", holder.text
            waiting = []
            for n in range(2):
                r = await c.post("/v1/work-items", json=_task(0.0), headers={"Idempotency-Key": f"wait-{n}"})
                assert r.status_code == 202 and r.json()["state"] == "queued", r.text
                waiting.append(r.json()["id"])
            listed = [i["id"] for i in (await c.get("/v1/work-items")).json()["items"]]

            full = await c.post("/v1/work-items", json=_task(0.0))
            assert full.status_code == 429, full.text
            assert full.headers["content-type"].startswith("application/problem+json")
            assert full.json()["code"] == "queue_full" and "2 or more work items waiting" in full.json()["detail"], (
                full.text
            )
            after = [i["id"] for i in (await c.get("/v1/work-items")).json()["items"]]
            assert after == listed and len(listed) == 3, "a refused submission was stored"
            repeat = await c.post("/v1/work-items", json=_task(0.0), headers={"Idempotency-Key": "wait-0"})
            assert repeat.status_code == 200 and repeat.json()["id"] == waiting[0], repeat.text
            elsewhere = await other.post("/v1/work-items", json=_task(0.0))
            assert elsewhere.status_code == 202, elsewhere.text

            # The holder ends, its place goes to the first waiting item: room for one more.
            await crew.wait_state(holder.json()["id"], "succeeded", timeout_s=60)
            await crew.wait_state(waiting[0], "succeeded", timeout_s=60)
            later = await c.post("/v1/work-items", json=_task(0.0))
            assert later.status_code == 202, later.text
            ids = [holder.json()["id"], *waiting, later.json()["id"]]
        for wid in ids:
            assert (await crew.result(wid, timeout_s=60)).state == "succeeded"
        (await check_invariants(crew.store, ids)).assert_ok()
