"""The HTTP client: each call is described once (`_Calls`) and sent by a sync (`Client`) or async (`AsyncClient`)
wrapper around httpx. Responses are the API's JSON, typed with TypedDicts (crewwork.client.types): what a script
prints with `--json` is exactly what the API returned."""

from __future__ import annotations

import builtins
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, cast

import httpx
from httpx_sse import SSEError, aconnect_sse, connect_sse

from crewwork.client.types import (
    TERMINAL_STATES,
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
DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S = 30.0
RECONNECT_S = (0.2, 0.5, 1.0, 2.0, 5.0)
"""Delays between reconnects of an event stream that dropped (the stream resumes after the last event seen)."""
STREAM_READ_TIMEOUT_S = 60.0
"""Silence after which a stream is taken for dead and reopened (the API sends a keepalive every 15 s by default)."""

ReviewAction = Literal["approve", "reject", "request_changes"]


class ApiError(Exception):
    """The API answered with an error (an `application/problem+json` body: status, code, detail, errors)."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        title: str = "",
        errors: list[dict[str, Any]] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{title or code} ({status}, {code}): {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.title = title
        self.errors = errors or []
        self.retry_after_s = retry_after_s

    @classmethod
    def from_response(cls, r: httpx.Response) -> ApiError:
        retry = r.headers.get("retry-after")
        retry_s = float(retry) if retry and retry.replace(".", "", 1).isdigit() else None
        try:
            p = r.json()
            if not isinstance(p, dict):
                raise ValueError
            return cls(
                r.status_code,
                str(p.get("code") or "http_error"),
                str(p.get("detail") or ""),
                str(p.get("title") or ""),
                p.get("errors"),
                retry_s,
            )
        except ValueError:
            return cls(r.status_code, "http_error", r.text[:500], f"HTTP {r.status_code}", None, retry_s)


class ApiUnreachable(ApiError):
    """No answer from the API (connection refused, DNS, timeout)."""

    def __init__(self, url: str, cause: Exception) -> None:
        super().__init__(0, "unreachable", f"cannot reach the API at {url}: {type(cause).__name__}: {cause}")
        self.url = url


class WaitTimeout(TimeoutError):
    """`wait` gave up before the work item reached the states waited for."""

    def __init__(self, work_item_id: str, state: str, timeout_s: float) -> None:
        super().__init__(f"{work_item_id} is still {state} after {timeout_s:g} s")
        self.work_item_id = work_item_id
        self.state = state


@dataclass
class _Call(Generic[T]):
    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    parse: Callable[[httpx.Response], T] = field(default=lambda r: r.json())


def _body(spec: Any) -> Any:
    """A submission as JSON: a dict, or any pydantic model (crewwork.models.WorkItemSpec) dumped as JSON."""
    dump = getattr(spec, "model_dump", None)
    return dump(mode="json", exclude_none=True) if callable(dump) else dict(spec)


def _tenant(tenant: str | None) -> dict[str, Any]:
    return {"tenant": tenant} if tenant else {}


def _none(_r: httpx.Response) -> None:
    return None


class _Calls:
    """Every API call the clients make, described once."""

    @staticmethod
    def submit(spec: Any, idempotency_key: str | None) -> _Call[SubmitResponse]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return _Call("POST", "/v1/work-items", json=_body(spec), headers=headers)

    @staticmethod
    def hotfix(body: Mapping[str, Any]) -> _Call[SubmitResponse]:
        return _Call("POST", "/v1/hotfix", json=dict(body))

    @staticmethod
    def get(work_item_id: str, live: bool) -> _Call[WorkItem]:
        return _Call("GET", f"/v1/work-items/{work_item_id}", params={"live": str(live).lower()})

    @staticmethod
    def list(
        state: str | None,
        kind: str | None,
        labels: Mapping[str, str] | None,
        q: str | None,
        limit: int,
        cursor: str | None,
    ) -> _Call[WorkItemPage]:
        params: dict[str, Any] = {"limit": limit}
        for k, v in (("state", state), ("kind", kind), ("q", q), ("cursor", cursor)):
            if v:
                params[k] = v
        if labels:
            params["label"] = [f"{k}={v}" for k, v in labels.items()]
        return _Call("GET", "/v1/work-items", params=params)

    @staticmethod
    def events(work_item_id: str, after: int, limit: int) -> _Call[builtins.list[Event]]:
        return _Call("GET", f"/v1/work-items/{work_item_id}/events", params={"after": after, "limit": limit})

    @staticmethod
    def evidence(work_item_id: str) -> _Call[builtins.list[Evidence]]:
        return _Call("GET", f"/v1/work-items/{work_item_id}/evidence")

    @staticmethod
    def review(
        work_item_id: str, action: ReviewAction, comment: str | None, reviewer: str | None
    ) -> _Call[ReviewResponse]:
        body: dict[str, Any] = {"action": action}
        if comment is not None:
            body["comment"] = comment
        if reviewer is not None:
            body["reviewer"] = reviewer
        return _Call("POST", f"/v1/work-items/{work_item_id}/review", json=body)

    @staticmethod
    def cancel(work_item_id: str) -> _Call[ReviewResponse]:
        return _Call("POST", f"/v1/work-items/{work_item_id}/cancel")

    @staticmethod
    def artifacts(work_item_id: str) -> _Call[builtins.list[Artifact]]:
        return _Call("GET", f"/v1/work-items/{work_item_id}/artifacts")

    @staticmethod
    def artifact(work_item_id: str, artifact_id: str) -> _Call[bytes]:
        return _Call(
            "GET", f"/v1/work-items/{work_item_id}/artifacts/{artifact_id}", params={"download": "true"}, parse=_bytes
        )

    @staticmethod
    def diff(work_item_id: str, attempt: int | None) -> _Call[str]:
        params = {"attempt": attempt} if attempt is not None else None
        return _Call("GET", f"/v1/work-items/{work_item_id}/diff", params=params, parse=lambda r: r.text)

    @staticmethod
    def create_repository(body: Mapping[str, Any], tenant: str | None) -> _Call[dict[str, Any]]:
        return _Call("POST", "/v1/repositories", json=dict(body), params=_tenant(tenant))

    @staticmethod
    def repositories(tenant: str | None, all_tenants: bool) -> _Call[builtins.list[dict[str, Any]]]:
        params = {**_tenant(tenant), **({"all_tenants": "true"} if all_tenants else {})}
        return _Call("GET", "/v1/repositories", params=params, parse=lambda r: r.json()["items"])

    @staticmethod
    def delete_repository(repository_id: str) -> _Call[None]:
        return _Call("DELETE", f"/v1/repositories/{repository_id}", parse=_none)

    @staticmethod
    def create_webhook(url: str, event_types: Sequence[str]) -> _Call[WebhookCreated]:
        return _Call("POST", "/v1/webhooks", json={"url": url, "event_types": list(event_types)})

    @staticmethod
    def webhooks() -> _Call[builtins.list[WebhookView]]:
        return _Call("GET", "/v1/webhooks")

    @staticmethod
    def webhook(webhook_id: str) -> _Call[WebhookView]:
        return _Call("GET", f"/v1/webhooks/{webhook_id}")

    @staticmethod
    def delete_webhook(webhook_id: str) -> _Call[None]:
        return _Call("DELETE", f"/v1/webhooks/{webhook_id}", parse=_none)

    @staticmethod
    def rotate_webhook_secret(webhook_id: str, overlap_s: float | None) -> _Call[SecretRotated]:
        body = {"overlap_s": overlap_s} if overlap_s is not None else {}
        return _Call("POST", f"/v1/webhooks/{webhook_id}/rotate-secret", json=body)

    @staticmethod
    def webhook_deliveries(webhook_id: str, limit: int) -> _Call[builtins.list[DeliveryView]]:
        return _Call("GET", f"/v1/webhooks/{webhook_id}/deliveries", params={"limit": limit})

    @staticmethod
    def redeliver(webhook_id: str) -> _Call[dict[str, int]]:
        return _Call("POST", f"/v1/webhooks/{webhook_id}/redeliver")

    @staticmethod
    def health() -> _Call[dict[str, Any]]:
        # 503 with a body is an answer (not ready), not an error.
        return _Call("GET", "/healthz")


def _bytes(r: httpx.Response) -> bytes:
    return r.content


def _headers(api_key: str | None) -> dict[str, str]:
    h = {"User-Agent": "crewwork-client/1", "Accept": "application/json"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def _check(r: httpx.Response, call: _Call[Any]) -> None:
    if r.status_code >= 400 and not (call.path == "/healthz" and r.status_code == 503):
        raise ApiError.from_response(r)


def _stream_headers(after: int | None) -> dict[str, str]:
    headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
    if after:
        headers["Last-Event-ID"] = str(after)  # resume exactly after the last event seen
    return headers


def _reached(item: WorkItem, until: frozenset[str]) -> bool:
    """In a state waited for, or in a terminal state (it will never reach another)."""
    return item["state"] in until or item["state"] in TERMINAL_STATES


def _until(until: Sequence[str] | None) -> frozenset[str]:
    return frozenset(until) if until else TERMINAL_STATES


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
        self, work_item_id: str, action: ReviewAction, *, comment: str | None = None, reviewer: str | None = None
    ) -> ReviewResponse:
        return await self._send(_Calls.review(work_item_id, action, comment, reviewer))

    async def cancel(self, work_item_id: str) -> ReviewResponse:
        return await self._send(_Calls.cancel(work_item_id))

    async def artifacts(self, work_item_id: str) -> builtins.list[Artifact]:
        return await self._send(_Calls.artifacts(work_item_id))

    async def artifact(self, work_item_id: str, artifact_id: str) -> bytes:
        return await self._send(_Calls.artifact(work_item_id, artifact_id))

    async def diff(self, work_item_id: str, *, attempt: int | None = None) -> str:
        return await self._send(_Calls.diff(work_item_id, attempt))

    # webhooks
    # repositories
    async def create_repository(self, body: Mapping[str, Any], *, tenant: str | None = None) -> dict[str, Any]:
        """Register a repository (`url`, optional `default_ref`, `credential` name, `protect_paths`,
        `environment`); `tenant` acts for another tenant (admin keys)."""
        return await self._send(_Calls.create_repository(body, tenant))

    async def repositories(
        self, *, tenant: str | None = None, all_tenants: bool = False
    ) -> builtins.list[dict[str, Any]]:
        return await self._send(_Calls.repositories(tenant, all_tenants))

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


class Client:
    """The crewwork API, synchronous (the same calls as `AsyncClient`). Use as `with Client(url, key) as c: ...`."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, headers=_headers(api_key), timeout=timeout_s, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: _Call[T]) -> T:
        try:
            r = self._http.request(call.method, call.path, params=call.params, json=call.json, headers=call.headers)
        except httpx.TransportError as exc:
            raise ApiUnreachable(self.base_url, exc) from exc
        _check(r, call)
        return call.parse(r)

    def submit(self, spec: Any, *, idempotency_key: str | None = None) -> SubmitResponse:
        return self._send(_Calls.submit(spec, idempotency_key))

    def hotfix(self, body: Mapping[str, Any]) -> SubmitResponse:
        return self._send(_Calls.hotfix(body))

    def get(self, work_item_id: str, *, live: bool = True) -> WorkItem:
        return self._send(_Calls.get(work_item_id, live))

    def list(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        labels: Mapping[str, str] | None = None,
        q: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> WorkItemPage:
        return self._send(_Calls.list(state, kind, labels, q, limit, cursor))

    def events(self, work_item_id: str, *, after: int = 0, limit: int = 500) -> builtins.list[Event]:
        return self._send(_Calls.events(work_item_id, after, limit))

    def evidence(self, work_item_id: str) -> builtins.list[Evidence]:
        return self._send(_Calls.evidence(work_item_id))

    def review(
        self, work_item_id: str, action: ReviewAction, *, comment: str | None = None, reviewer: str | None = None
    ) -> ReviewResponse:
        return self._send(_Calls.review(work_item_id, action, comment, reviewer))

    def cancel(self, work_item_id: str) -> ReviewResponse:
        return self._send(_Calls.cancel(work_item_id))

    def artifacts(self, work_item_id: str) -> builtins.list[Artifact]:
        return self._send(_Calls.artifacts(work_item_id))

    def artifact(self, work_item_id: str, artifact_id: str) -> bytes:
        return self._send(_Calls.artifact(work_item_id, artifact_id))

    def diff(self, work_item_id: str, *, attempt: int | None = None) -> str:
        return self._send(_Calls.diff(work_item_id, attempt))

    def create_repository(self, body: Mapping[str, Any], *, tenant: str | None = None) -> dict[str, Any]:
        return self._send(_Calls.create_repository(body, tenant))

    def repositories(self, *, tenant: str | None = None, all_tenants: bool = False) -> builtins.list[dict[str, Any]]:
        return self._send(_Calls.repositories(tenant, all_tenants))

    def delete_repository(self, repository_id: str) -> None:
        self._send(_Calls.delete_repository(repository_id))

    def create_webhook(self, url: str, event_types: Sequence[str] = ()) -> WebhookCreated:
        return self._send(_Calls.create_webhook(url, event_types))

    def webhooks(self) -> builtins.list[WebhookView]:
        return self._send(_Calls.webhooks())

    def webhook(self, webhook_id: str) -> WebhookView:
        return self._send(_Calls.webhook(webhook_id))

    def delete_webhook(self, webhook_id: str) -> None:
        self._send(_Calls.delete_webhook(webhook_id))

    def rotate_webhook_secret(self, webhook_id: str, *, overlap_s: float | None = None) -> SecretRotated:
        return self._send(_Calls.rotate_webhook_secret(webhook_id, overlap_s))

    def webhook_deliveries(self, webhook_id: str, *, limit: int = 100) -> builtins.list[DeliveryView]:
        return self._send(_Calls.webhook_deliveries(webhook_id, limit))

    def redeliver(self, webhook_id: str) -> dict[str, int]:
        return self._send(_Calls.redeliver(webhook_id))

    def health(self) -> dict[str, Any]:
        return self._send(_Calls.health())

    def stream_events(self, work_item_id: str, *, after: int = 0) -> Iterator[Event]:
        """Like `AsyncClient.stream_events`."""
        yield from self._follow(work_item_id, after, None)

    def _follow(self, work_item_id: str, after: int, deadline: float | None) -> Iterator[Event]:
        """The event stream; ends (instead of reconnecting) once `deadline` (monotonic) has passed."""
        import json

        last = after
        failures = 0
        path = f"/v1/work-items/{work_item_id}/events/stream"
        while deadline is None or time.monotonic() < deadline:
            headers = _stream_headers(last)
            # Each read waits at most until the deadline (the stream sends keepalives at least every 15 s).
            read = (
                STREAM_READ_TIMEOUT_S
                if deadline is None
                else max(0.05, min(STREAM_READ_TIMEOUT_S, deadline - time.monotonic()))
            )
            timeout = httpx.Timeout(DEFAULT_TIMEOUT_S, read=read)
            try:
                with connect_sse(self._http, "GET", path, headers=headers, timeout=timeout) as es:
                    if es.response.status_code >= 400:
                        es.response.read()
                        raise ApiError.from_response(es.response)
                    for sse in es.iter_sse():
                        if sse.data:
                            event = cast(Event, json.loads(sse.data))
                            last = int(event["id"])
                            failures = 0
                            yield event
                        if deadline is not None and time.monotonic() >= deadline:
                            return
            except httpx.ReadTimeout:
                continue
            except (httpx.TransportError, SSEError) as exc:
                if failures >= len(RECONNECT_S):
                    raise ApiUnreachable(self.base_url, exc) from exc
                time.sleep(RECONNECT_S[failures])
                failures += 1

    def wait(
        self,
        work_item_id: str,
        *,
        until: Sequence[str] | None = None,
        timeout_s: float | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> WorkItem:
        """Like `AsyncClient.wait`."""
        wanted = _until(until)
        item = self.get(work_item_id, live=False)
        if _reached(item, wanted):
            return item
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for ev in self._follow(work_item_id, 0, deadline):
            if on_event is not None:
                on_event(ev)
            if ev["type"] == "state_changed" and (ev.get("data") or {}).get("state") in wanted:
                current = self.get(work_item_id, live=False)
                if _reached(current, wanted):
                    return current
        raise WaitTimeout(work_item_id, self.get(work_item_id, live=False)["state"], timeout_s or 0)
