"""The sync client (`Client`); its calls are described in crewwork.client._calls."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

import httpx
from httpx_sse import SSEError, connect_sse

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
        return self._send(_Calls.review(work_item_id, action, comment, reviewer, attempt, line_comments))

    def cancel(self, work_item_id: str) -> ReviewResponse:
        return self._send(_Calls.cancel(work_item_id))

    def legal_hold(self, work_item_id: str, reason: str | None) -> dict[str, Any]:
        """Set (`reason`) or clear (None) the item's legal hold: retention keeps a held item whole."""
        return self._send(_Calls.legal_hold(work_item_id, reason))

    def artifacts(self, work_item_id: str) -> builtins.list[Artifact]:
        return self._send(_Calls.artifacts(work_item_id))

    def artifact(self, work_item_id: str, artifact_id: str) -> bytes:
        return self._send(_Calls.artifact(work_item_id, artifact_id))

    def diff(self, work_item_id: str, *, attempt: int | None = None) -> str:
        return self._send(_Calls.diff(work_item_id, attempt))

    def evidence_bundle(self, work_item_id: str, *, attempt: int | None = None) -> bytes:
        """The signed evidence bundle of the landed change (or of attempt N, once signed): JSON bytes, verify
        them offline with `crewwork verify` or crewwork.attestation.verify.verify_bundle."""
        return self._send(_Calls.evidence_bundle(work_item_id, attempt))

    def sign_evidence_bundle(self, work_item_id: str, attempt: int) -> bytes:
        """Have attempt N's evidence signed now (by the control pool) and return the bundle."""
        return self._send(_Calls.sign_evidence_bundle(work_item_id, attempt))

    def evidence_keys(self) -> dict[str, Any]:
        """The deployment's published evidence keys (active, retired, revoked): a keys document."""
        return self._send(_Calls.evidence_keys())

    def create_repository(self, body: Mapping[str, Any], *, tenant: str | None = None) -> dict[str, Any]:
        return self._send(_Calls.create_repository(body, tenant))

    def repositories(self, *, tenant: str | None = None, all_tenants: bool = False) -> builtins.list[dict[str, Any]]:
        return self._send(_Calls.repositories(tenant, all_tenants))

    def flaky_tests(self, repository_id: str) -> builtins.list[dict[str, Any]]:
        """The repository's flaky tests, most recently seen first."""
        return self._send(_Calls.flaky_tests(repository_id))

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
