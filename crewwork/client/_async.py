"""The async client (`AsyncClient`); its calls are described in crewwork.client._calls."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import httpx
from httpx_sse import SSEError, aconnect_sse

from crewwork.client._calls import (
    DEFAULT_TIMEOUT_S,
    DEFAULT_URL,
    RECONNECT_S,
    STREAM_READ_TIMEOUT_S,
    ApiError,
    ApiUnreachable,
    ReviewAction,
    WaitTimeout,
    _Call,
    _Calls,
    _check,
    _headers,
    _reached,
    _stream_headers,
    _until,
)
from crewwork.client.types import (
    Artifact,
    DeliveryView,
    Event,
    Evidence,
    ReviewResponse,
    SecretRotated,
    SubmitResponse,
    WebhookCreated,
    WebhookView,
    WorkItem,
    WorkItemPage,
)

T = TypeVar("T")


class AsyncClient:
    """The crewwork API, async. Use as `async with AsyncClient(url, key) as c: ...`.

    Errors: `ApiError` (the API's problem: `.status`, `.code`, `.detail`, `.errors`), `ApiUnreachable` (no answer),
    `WaitTimeout` (`wait` ran out of time)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=_headers(api_key), timeout=timeout_s, transport=transport
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: _Call[T]) -> T:
        try:
            r = await self._http.request(
                call.method, call.path, params=call.params, json=call.json, headers=call.headers
            )
        except httpx.TransportError as exc:
            raise ApiUnreachable(self.base_url, exc) from exc
        _check(r, call)
        return call.parse(r)

    # work items
    async def submit(self, spec: Any, *, idempotency_key: str | None = None) -> SubmitResponse:
        return await self._send(_Calls.submit(spec, idempotency_key))

    async def hotfix(self, body: Mapping[str, Any]) -> SubmitResponse:
        return await self._send(_Calls.hotfix(body))

    async def get(self, work_item_id: str, *, live: bool = True) -> WorkItem:
        return await self._send(_Calls.get(work_item_id, live))

    async def list(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        labels: Mapping[str, str] | None = None,
        q: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> WorkItemPage:
        return await self._send(_Calls.list(state, kind, labels, q, limit, cursor))

    async def events(self, work_item_id: str, *, after: int = 0, limit: int = 500) -> builtins.list[Event]:
        return await self._send(_Calls.events(work_item_id, after, limit))

    async def evidence(self, work_item_id: str) -> builtins.list[Evidence]:
        return await self._send(_Calls.evidence(work_item_id))

    async def review(
        self,
        work_item_id: str,
        action: ReviewAction,
        *,
        comment: str | None = None,
        reviewer: str | None = None,
        attempt: int | None = None,
        line_comments: builtins.list[dict[str, Any]] | None = None,
    ) -> ReviewResponse:
        """`attempt`: the attempt you looked at (refused if another one awaits review); `line_comments`:
        `{path, line, side, body}` each."""
        return await self._send(_Calls.review(work_item_id, action, comment, reviewer, attempt, line_comments))

    async def cancel(self, work_item_id: str) -> ReviewResponse:
        return await self._send(_Calls.cancel(work_item_id))

    async def legal_hold(self, work_item_id: str, reason: str | None) -> dict[str, Any]:
        """Set (`reason`) or clear (None) the item's legal hold: retention keeps a held item whole."""
        return await self._send(_Calls.legal_hold(work_item_id, reason))

    async def artifacts(self, work_item_id: str) -> builtins.list[Artifact]:
        return await self._send(_Calls.artifacts(work_item_id))

    async def artifact(self, work_item_id: str, artifact_id: str) -> bytes:
        return await self._send(_Calls.artifact(work_item_id, artifact_id))

    async def diff(self, work_item_id: str, *, attempt: int | None = None) -> str:
        return await self._send(_Calls.diff(work_item_id, attempt))

    async def evidence_bundle(self, work_item_id: str, *, attempt: int | None = None) -> bytes:
        """The signed evidence bundle of the landed change (or of attempt N, once signed)."""
        return await self._send(_Calls.evidence_bundle(work_item_id, attempt))

    async def sign_evidence_bundle(self, work_item_id: str, attempt: int) -> bytes:
        """Have attempt N's evidence signed now (by the control pool) and return the bundle."""
        return await self._send(_Calls.sign_evidence_bundle(work_item_id, attempt))

    async def evidence_keys(self) -> dict[str, Any]:
        """The deployment's published evidence keys (active, retired, revoked): a keys document."""
        return await self._send(_Calls.evidence_keys())

    # webhooks
    # repositories
    async def create_repository(self, body: Mapping[str, Any], *, tenant: str | None = None) -> dict[str, Any]:
        """Register a repository (`url`, optional `default_ref`, `credential` name, `protect_paths`,
        `environment`, `checks`); `tenant` acts for another tenant (admin keys)."""
        return await self._send(_Calls.create_repository(body, tenant))

    async def repositories(
        self, *, tenant: str | None = None, all_tenants: bool = False
    ) -> builtins.list[dict[str, Any]]:
        return await self._send(_Calls.repositories(tenant, all_tenants))

    async def flaky_tests(self, repository_id: str) -> builtins.list[dict[str, Any]]:
        """The repository's flaky tests, most recently seen first."""
        return await self._send(_Calls.flaky_tests(repository_id))

    async def delete_repository(self, repository_id: str) -> None:
        await self._send(_Calls.delete_repository(repository_id))

    async def create_webhook(self, url: str, event_types: Sequence[str] = ()) -> WebhookCreated:
        return await self._send(_Calls.create_webhook(url, event_types))

    async def webhooks(self) -> builtins.list[WebhookView]:
        return await self._send(_Calls.webhooks())

    async def webhook(self, webhook_id: str) -> WebhookView:
        return await self._send(_Calls.webhook(webhook_id))

    async def delete_webhook(self, webhook_id: str) -> None:
        await self._send(_Calls.delete_webhook(webhook_id))

    async def rotate_webhook_secret(self, webhook_id: str, *, overlap_s: float | None = None) -> SecretRotated:
        return await self._send(_Calls.rotate_webhook_secret(webhook_id, overlap_s))

    async def webhook_deliveries(self, webhook_id: str, *, limit: int = 100) -> builtins.list[DeliveryView]:
        return await self._send(_Calls.webhook_deliveries(webhook_id, limit))

    async def redeliver(self, webhook_id: str) -> dict[str, int]:
        return await self._send(_Calls.redeliver(webhook_id))

    async def health(self) -> dict[str, Any]:
        return await self._send(_Calls.health())

    # following
    async def stream_events(self, work_item_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        """The work item's events as they happen (SSE), from after event id `after` (0: from the start). Reconnects
        when the stream drops and resumes after the last event seen, so nothing is lost or repeated."""
        import asyncio
        import json

        last = after
        failures = 0
        path = f"/v1/work-items/{work_item_id}/events/stream"
        while True:
            headers = _stream_headers(last)
            try:
                timeout = httpx.Timeout(DEFAULT_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
                async with aconnect_sse(self._http, "GET", path, headers=headers, timeout=timeout) as es:
                    if es.response.status_code >= 400:
                        await es.response.aread()
                        raise ApiError.from_response(es.response)
                    async for sse in es.aiter_sse():
                        if not sse.data:
                            continue
                        event = cast(Event, json.loads(sse.data))
                        last = int(event["id"])
                        failures = 0
                        yield event
            except httpx.ReadTimeout:
                continue  # silent for too long: reopen, resuming after the last event
            except (httpx.TransportError, SSEError) as exc:
                if failures >= len(RECONNECT_S):
                    raise ApiUnreachable(self.base_url, exc) from exc
                await asyncio.sleep(RECONNECT_S[failures])
                failures += 1

    async def wait(
        self,
        work_item_id: str,
        *,
        until: Sequence[str] | None = None,
        timeout_s: float | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> WorkItem:
        """Follow the event stream until the work item is in one of `until` (default: a terminal state) and return
        it (as `get(live=False)` does). `on_event` sees every event on the way. Raises WaitTimeout."""
        import asyncio

        wanted = _until(until)
        item = await self.get(work_item_id, live=False)
        if _reached(item, wanted):
            return item

        async def follow() -> WorkItem:
            async for ev in self.stream_events(work_item_id):
                if on_event is not None:
                    on_event(ev)
                if ev["type"] == "state_changed" and (ev.get("data") or {}).get("state") in wanted:
                    current = await self.get(work_item_id, live=False)
                    if _reached(current, wanted):
                        return current
            raise AssertionError("unreachable: the event stream does not end")

        try:
            return await asyncio.wait_for(follow(), timeout_s)
        except TimeoutError:
            state = (await self.get(work_item_id, live=False))["state"]
            raise WaitTimeout(work_item_id, state, timeout_s or 0) from None
