"""Standard Webhooks: every delivery verifies with the reference library (`standardwebhooks` from PyPI, which
knows nothing of crewwork), secrets rotate through the API with an overlap window, and the deprecated header still
verifies for one release."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import standardwebhooks
from sqlalchemy import update

from crewwork.client.webhooks import secret_key
from crewwork.config import Settings
from crewwork.store.tables import Webhook
from crewwork.temporal.devserver import free_port
from crewwork.webhooks.signing import SIGNATURE_HEADER, sign_standard, verify, verify_standard
from tests.api.conftest import Stack, task_item, wait_state
from tests.api.test_api_webhooks import Receiver

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


@pytest.fixture(scope="module")
def api_settings(api_settings: Settings) -> Settings:
    # The receivers here listen on loopback, which a webhook may reach only where the operator allows it.
    return api_settings.model_copy(update={"outbound_allow_networks": "127.0.0.0/8"})


def reference_verifies(secret: str, headers: dict[str, str], body: bytes) -> bool:
    try:
        standardwebhooks.Webhook(secret).verify(body, headers)
        return True
    except standardwebhooks.WebhookVerificationError:
        return False


async def deliveries_of(receiver: Receiver, wid: str, state: str, timeout_s: float = 60) -> list[Any]:
    """The deliveries that announce `wid` reaching `state` (waits until one arrives)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = [(h, b) for h, b in list(receiver.received) if json.loads(b).get("work_item_id") == wid]
        if any(json.loads(b)["state"] == state for _h, b in got):
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"no delivery of {wid} reaching {state}")


async def test_deliveries_verify_with_the_reference_library_and_rotation_keeps_both_secrets_valid(
    stack: Stack,
) -> None:
    receiver = Receiver(free_port())
    receiver.start()
    try:
        async with stack.client() as c:
            hook = (await c.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{receiver.port}/hook"})).json()
            old = hook["secret"]
            assert old.startswith("whsec_") and len(base64.b64decode(old[6:], validate=True)) == 32

            wid = (await c.post("/v1/work-items", json=task_item())).json()["id"]
            await wait_state(c, wid, {"succeeded"})
            first = await deliveries_of(receiver, wid, "succeeded")
            for headers, body in first:
                assert reference_verifies(old, headers, body)
                assert not reference_verifies("whsec_" + base64.b64encode(b"x" * 32).decode(), headers, body)
                assert len(headers["webhook-signature"].split(" ")) == 1
                # The deprecated header still verifies with the same secret, for one release.
                assert verify(old, headers[SIGNATURE_HEADER.lower()], body)
                assert headers["webhook-id"] == str(json.loads(body)["delivery_id"])

            # Rotate with an overlap: the new secret is returned once, both secrets sign meanwhile.
            r = await c.post(f"/v1/webhooks/{hook['id']}/rotate-secret", json={"overlap_s": 3600})
            assert r.status_code == 200, r.text
            rotated = r.json()
            new = rotated["secret"]
            assert new != old and new.startswith("whsec_")
            assert rotated["previous_secret_valid_until"] > time.time() + 3000
            assert "secret" not in (await c.get(f"/v1/webhooks/{hook['id']}")).json()

            wid2 = (await c.post("/v1/work-items", json=task_item())).json()["id"]
            await wait_state(c, wid2, {"succeeded"})
            during = await deliveries_of(receiver, wid2, "succeeded")
            for headers, body in during:
                assert len(headers["webhook-signature"].split(" ")) == 2
                assert reference_verifies(new, headers, body), "receivers that switched already verify"
                assert reference_verifies(old, headers, body), "receivers that did not switch yet still verify"

            # The overlap ends: the previous secret is dropped (here: its window moved into the past).
            async with stack.crew.store.session() as s:
                await s.execute(
                    update(Webhook).where(Webhook.id == hook["id"]).values(previous_secret_expires_at=time.time() - 1)
                )
            wid3 = (await c.post("/v1/work-items", json=task_item())).json()["id"]
            await wait_state(c, wid3, {"succeeded"})
            after = await deliveries_of(receiver, wid3, "succeeded")
            for headers, body in after:
                assert len(headers["webhook-signature"].split(" ")) == 1
                assert reference_verifies(new, headers, body)
                assert not reference_verifies(old, headers, body)

            # Rotating with no overlap drops the current secret at once.
            newest = (await c.post(f"/v1/webhooks/{hook['id']}/rotate-secret", json={"overlap_s": 0})).json()
            assert newest["previous_secret_valid_until"] is None
            bad = await c.post(f"/v1/webhooks/{hook['id']}/rotate-secret", json={"overlap_s": 8 * 86400})
            assert bad.status_code == 422 and "overlap_s" in bad.text
            missing = await c.post("/v1/webhooks/wh_nope/rotate-secret")
            assert missing.status_code == 404
        async with stack.client(stack.beta) as other:
            foreign = await other.post(f"/v1/webhooks/{hook['id']}/rotate-secret")
            assert foreign.status_code == 404, "another tenant's webhook cannot be rotated"
    finally:
        receiver.stop()


def test_our_verifier_agrees_with_the_reference_library() -> None:
    secret = "whsec_" + base64.b64encode(bytes(range(32))).decode()
    body = b'{"a":1}'
    now = int(time.time())
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(now)}
    headers["webhook-signature"] = sign_standard([secret], "msg_1", now, body)
    ref = standardwebhooks.Webhook(secret)
    assert ref.sign("msg_1", datetime.fromtimestamp(now, tz=UTC), body.decode()) == headers["webhook-signature"]
    assert reference_verifies(secret, headers, body) and verify_standard(secret, headers, body)
    assert not verify_standard(secret, {**headers, "webhook-id": "msg_2"}, body)
    assert not verify_standard(secret, headers, body + b" ")
    assert not verify_standard(secret, {**headers, "webhook-timestamp": str(now - 3600)}, body)


def test_a_secret_issued_before_standard_signing_keys_the_same_32_bytes() -> None:
    """Secrets of webhooks registered before this release were URL-safe base64; their key is the same 32 random
    bytes, and the reference library verifies with the standard-base64 spelling of that key."""
    raw = bytes([251, 255, 190] * 10 + [1, 2])  # bytes whose base64 has '+' and '/' (URL-safe: '-' and '_')
    legacy = "whsec_" + base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert "-" in legacy or "_" in legacy
    assert secret_key(legacy) == raw
    now = int(time.time())
    body = b"{}"
    headers = {"webhook-id": "1", "webhook-timestamp": str(now)}
    headers["webhook-signature"] = sign_standard([legacy], "1", now, body)
    assert reference_verifies("whsec_" + base64.b64encode(raw).decode(), headers, body)
