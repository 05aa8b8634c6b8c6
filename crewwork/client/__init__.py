"""A small typed client for the crewwork API, sync (`Client`) and async (`AsyncClient`).

It needs only httpx (and httpx-sse for the event stream): it imports neither Temporal's SDK nor SQLAlchemy, so a
script, a CI bot or a webhook receiver can use it without the server's dependencies being loaded.

    from crewwork.client import Client

    with Client("http://127.0.0.1:8080", api_key) as c:
        item = c.submit({"kind": "task", "input": {}, "agent": {"name": "scripted", "config": {}}})
        done = c.wait(item["id"])          # follows GET /v1/work-items/{id}/events/stream
        print(done["state"])

Webhook receivers: `verify_webhook(secret, headers, body)` returns the delivery's JSON or raises
`WebhookVerificationError` (Standard Webhooks, see crewwork.client.webhooks).
"""

from crewwork.client._async import AsyncClient
from crewwork.client._calls import ApiError, ApiUnreachable, ReviewAction, WaitTimeout
from crewwork.client._sync import Client
from crewwork.client.types import STATES, TERMINAL_STATES
from crewwork.client.webhooks import WebhookVerificationError
from crewwork.client.webhooks import verify as verify_webhook

__all__ = [
    "STATES",
    "TERMINAL_STATES",
    "ApiError",
    "ApiUnreachable",
    "AsyncClient",
    "Client",
    "ReviewAction",
    "WaitTimeout",
    "WebhookVerificationError",
    "verify_webhook",
]
