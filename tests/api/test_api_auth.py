"""Authentication, tenancy, the admin scope and per-key rate limiting, on the real API over PostgreSQL."""

from __future__ import annotations

import httpx
import pytest

from crewwork.config import Settings
from crewwork.config.api import ApiOptions
from tests.api.conftest import LiveApi, Stack, task_item, wait_state

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


@pytest.fixture(scope="module")
def api_settings(api_settings: Settings) -> Settings:
    # The receivers here listen on loopback, which a webhook may reach only where the operator allows it.
    return api_settings.model_copy(update={"outbound_allow_networks": "127.0.0.0/8"})


async def test_missing_invalid_and_revoked_keys_are_401_with_a_problem(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.api.url, timeout=10) as anon:
        r = await anon.get("/v1/work-items")
        assert r.status_code == 401
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "unauthorized" and r.headers["www-authenticate"] == "Bearer"
        r = await anon.get("/v1/work-items", headers={"Authorization": "Bearer cw_not-a-real-key"})
        assert r.status_code == 401 and r.json()["code"] == "unauthorized"

    async with stack.client() as c:
        assert (await c.get("/v1/me")).status_code == 200
    assert await stack.crew.store.revoke_api_key(stack.alpha.key_id)
    async with stack.client() as c:
        r = await c.get("/v1/me")
        assert r.status_code == 401 and "revoked" in r.json()["detail"]


async def test_another_tenants_work_item_is_404_on_every_route(stack: Stack) -> None:
    async with stack.client(stack.alpha) as alpha, stack.client(stack.beta) as beta:
        r = await alpha.post("/v1/work-items", json=task_item({"answer": 1}))
        assert r.status_code == 202, r.text
        wid = r.json()["id"]
        await wait_state(alpha, wid, {"succeeded"})
        assert (await alpha.get(f"/v1/work-items/{wid}")).status_code == 200

        routes = [
            ("GET", f"/v1/work-items/{wid}"),
            ("GET", f"/v1/work-items/{wid}/attempts"),
            ("GET", f"/v1/work-items/{wid}/evidence"),
            ("GET", f"/v1/work-items/{wid}/diff"),
            ("GET", f"/v1/work-items/{wid}/artifacts"),
            ("GET", f"/v1/work-items/{wid}/artifacts/art_000000000000000000000000"),
            ("GET", f"/v1/work-items/{wid}/events"),
            ("GET", f"/v1/work-items/{wid}/events/stream"),
            ("POST", f"/v1/work-items/{wid}/review"),
            ("POST", f"/v1/work-items/{wid}/cancel"),
        ]
        for method, path in routes:
            body = {"action": "approve"} if path.endswith("/review") else None
            r = await beta.request(method, path, json=body)
            assert r.status_code == 404, (method, path, r.status_code, r.text)
            assert r.json()["code"] == "not_found"
            assert wid not in r.text or "no work item" in r.json()["detail"]

        listed = (await beta.get("/v1/work-items")).json()["items"]
        assert all(item["id"] != wid for item in listed)
        assert (await beta.get("/v1/work-items", params={"all_tenants": "true"})).status_code == 403


async def test_webhooks_are_tenant_scoped(stack: Stack) -> None:
    async with stack.client(stack.alpha) as alpha, stack.client(stack.beta) as beta:
        hook = (await alpha.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hook"})).json()
        for method, path in [
            ("GET", f"/v1/webhooks/{hook['id']}"),
            ("GET", f"/v1/webhooks/{hook['id']}/deliveries"),
            ("POST", f"/v1/webhooks/{hook['id']}/redeliver"),
            ("DELETE", f"/v1/webhooks/{hook['id']}"),
        ]:
            assert (await beta.request(method, path)).status_code == 404, path
        assert (await beta.get("/v1/webhooks")).json() == []
        assert (await alpha.delete(f"/v1/webhooks/{hook['id']}")).status_code == 204


async def test_admin_scope_sees_workers_and_all_tenants_others_get_403(stack: Stack) -> None:
    async with stack.client(stack.alpha) as alpha, stack.client(stack.admin) as admin:
        wid = (await alpha.post("/v1/work-items", json=task_item())).json()["id"]
        r = await alpha.get("/v1/admin/workers")
        assert r.status_code == 403 and r.json()["code"] == "forbidden"

        workers = (await admin.get("/v1/admin/workers")).json()
        pools = {(q["pool"], q["kind"]) for q in workers["queues"]}
        assert {("control", "workflow"), ("control", "activity"), ("agent", "activity")} <= pools
        control = next(q for q in workers["queues"] if q["pool"] == "control" and q["kind"] == "workflow")
        assert control["pollers"], "the in-process control pool polls its queue"

        everyone = (await admin.get("/v1/work-items", params={"all_tenants": "true", "limit": 200})).json()
        assert wid in {i["id"] for i in everyone["items"]}
        assert (await admin.get(f"/v1/work-items/{wid}")).status_code == 200


async def test_rate_limit_per_key_is_429_with_retry_after(stack: Stack) -> None:
    limited = LiveApi(stack.api.settings, ApiOptions(api_rate_per_s=0.5, api_rate_burst=3, webhook_delivery=False))
    limited.start()
    try:
        async with httpx.AsyncClient(base_url=limited.url, timeout=10) as c:
            codes = [(await c.get("/v1/me", headers=stack.alpha.headers)).status_code for _ in range(5)]
            assert codes[:3] == [200, 200, 200]
            assert codes[3:] == [429, 429]
            r = await c.get("/v1/me", headers=stack.alpha.headers)
            assert r.status_code == 429 and r.json()["code"] == "rate_limited"
            assert int(r.headers["retry-after"]) >= 1
            # The bucket is per key: another key is unaffected.
            assert (await c.get("/v1/me", headers=stack.beta.headers)).status_code == 200
    finally:
        limited.stop()
