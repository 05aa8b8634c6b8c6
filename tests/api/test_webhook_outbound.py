"""Webhook URLs reach only addresses the operator allows: refused at registration (422) and again at delivery, and a
delivery connects to the address that was checked (a DNS answer that changes later cannot move it: rebinding).

Real API on PostgreSQL and Temporal, a real HTTP receiver on loopback; the DNS of the rebinding test is a resolver
function whose answers change, as an attacker's DNS server's do."""

from __future__ import annotations

import asyncio
import ipaddress
import time

import httpx
import pytest
from sqlalchemy import select

from crewwork.boundary.outbound import IPAddress, OutboundPolicy, OutboundRefused, parse_networks
from crewwork.store.outbox import OutboxStore, enqueue
from crewwork.store.tables import OutboxMessage
from crewwork.temporal.devserver import free_port
from crewwork.webhooks.deliver import OutboxDeliverer
from tests.api.conftest import Stack
from tests.api.test_api_webhooks import Receiver

# What an attacker names to reach the service's own network: every spelling must be refused with no allowlist.
INTERNAL_URLS = [
    "http://127.0.0.1:8080/v1/admin",
    "http://localhost:5432/",
    "http://[::1]/",
    "http://169.254.169.254/latest/meta-data/",  # cloud metadata
    "http://10.1.2.3/",
    "http://172.16.0.1/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",  # shared address space
    "http://0.0.0.0:8080/",
    "http://[::]/",
    "http://224.0.0.1/",
    "http://240.0.0.1/",
    "http://[fe80::1]/",
    "http://[fc00::1]/",
    "http://[::ffff:127.0.0.1]/",  # IPv4-mapped
    "http://[::ffff:7f00:1]/",
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of 169.254.169.254
    "http://[2002:7f00:1::]/",  # 6to4 of 127.0.0.1
    "http://2130706433/",  # 127.0.0.1 as one number: the system resolver accepts it
    "http://0x7f.1/",
    "http://127.1/",
    "https://192.0.2.10/",  # documentation range
]


@pytest.mark.parametrize("url", INTERNAL_URLS)
async def test_internal_addresses_are_refused_without_an_allowlist(url: str) -> None:
    with pytest.raises(OutboundRefused):
        await OutboundPolicy().check(url)


async def test_a_public_address_passes_and_the_allowlist_opens_only_its_networks() -> None:
    target = await OutboundPolicy().check("https://93.184.216.34:8443/hook?x=1")
    assert str(target.ip) == "93.184.216.34" and target.port == 8443
    policy = OutboundPolicy(parse_networks("127.0.0.0/8, ::1"))
    assert str((await policy.check("http://127.0.0.1:9/")).ip) == "127.0.0.1"
    assert str((await policy.check("http://[::ffff:127.0.0.1]:9/")).ip) == "::ffff:7f00:1"
    for still_refused in ("http://10.0.0.1/", "http://169.254.169.254/", "http://[fe80::1]/"):
        with pytest.raises(OutboundRefused):
            await policy.check(still_refused)
    with pytest.raises(ValueError, match="not an IP network"):
        parse_networks("127.0.0.0/8,localhost")


async def test_a_name_with_one_internal_address_among_public_ones_is_refused() -> None:
    async def mixed(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("10.0.0.7")]

    with pytest.raises(OutboundRefused, match=r"10\.0\.0\.7 is a private address"):
        await OutboundPolicy(resolver=mixed).check("http://hooks.example/x")


@pytest.mark.postgres
@pytest.mark.temporal
async def test_registration_refuses_internal_urls_with_422(stack: Stack) -> None:
    async with stack.client() as c:
        for url in [*INTERNAL_URLS, "http://no-such-host.invalid/hook"]:
            r = await c.post("/v1/webhooks", json={"url": url})
            assert r.status_code == 422, (url, r.status_code, r.text)
            assert r.json()["code"] == "url_not_allowed", r.text
        assert (await c.get("/v1/webhooks")).json() == []


@pytest.mark.postgres
@pytest.mark.temporal
async def test_delivery_checks_again_and_connects_to_the_checked_address(stack: Stack) -> None:
    stack.api.stop()  # only the deliverer of this test delivers
    receiver = Receiver(free_port())
    receiver.start()
    answers = {"hook.test": ["127.0.0.1"]}

    async def attacker_dns(host: str, port: int) -> list[IPAddress]:
        if host not in answers:
            raise OSError("NXDOMAIN")
        return [ipaddress.ip_address(a) for a in answers[host]]

    policy = OutboundPolicy(parse_networks("127.0.0.1/32"), resolver=attacker_dns)
    store = stack.crew.store
    tenant_id = await store.ensure_tenant(stack.alpha.name)
    outbox = OutboxStore(store)
    hook = await outbox.create_webhook(tenant_id, f"http://hook.test:{receiver.port}/hook", [])
    deliverer = OutboxDeliverer(outbox, outbound=policy)

    async def one_message(work_item_id: str) -> int:
        async with store.session() as s:
            await enqueue(
                s,
                tenant_id=tenant_id,
                work_item_id=work_item_id,
                event_type="work_item.state_changed",
                payload={"work_item_id": work_item_id, "state": "succeeded"},
                now=time.time() - 1,
            )
        async with httpx.AsyncClient(follow_redirects=False) as client:
            return await deliverer.deliver_once(client)

    try:
        # `hook.test` exists only in the attacker's DNS: the system resolver (what httpx would use if it resolved
        # the name itself) cannot find it, so the receiver is reached only through the checked, pinned address.
        # (`>= 1`: the deliverer claims every due row of the shared database, and another test's retry may fall due
        # in the same batch; what this test checks is its own hook's rows and its receiver.)
        assert await one_message("wi_pinned") >= 1
        assert len(receiver.received) == 1
        headers, _body = receiver.received[0]
        assert headers["host"] == f"hook.test:{receiver.port}"
        # Rebinding: the name now answers with an internal address. The delivery is checked again and refused.
        answers["hook.test"] = ["10.0.0.1"]
        assert await one_message("wi_rebound") >= 1
        await asyncio.sleep(0)
        assert len(receiver.received) == 1
        async with store.session() as s:
            rows = (await s.scalars(select(OutboxMessage).where(OutboxMessage.webhook_id == hook.id))).all()
        rebound = next(r for r in rows if r.work_item_id == "wi_rebound")
        assert rebound.status == "pending" and rebound.attempts == 1
        assert rebound.last_error and "10.0.0.1 is a private address" in rebound.last_error
    finally:
        receiver.stop()
