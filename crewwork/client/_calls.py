"""The HTTP client's calls: each API call is described once (`_Calls`: method, path, body, how to read the answer)
and sent by a sync (`crewwork.client._sync.Client`) or async (`crewwork.client._async.AsyncClient`) wrapper around
httpx. The two wrappers are one-line delegations per call, kept apart because one cannot be derived from the other
without code generation. Responses are the API's JSON, typed with TypedDicts (crewwork.client.types): what a script
prints with `--json` is exactly what the API returned."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import httpx

from crewwork.boundary import jsonvalues
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

    def __post_init__(self) -> None:
        if self.json is not None:
            # What the API would refuse (and httpx cannot even encode: NaN, a lone surrogate, an integer of 5,000
            # digits, {1: .., "1": ..}): a ValueError naming the field, at the call, by the API's own rules.
            jsonvalues.refuse(self.json)


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
        work_item_id: str,
        action: ReviewAction,
        comment: str | None,
        reviewer: str | None,
        attempt: int | None = None,
        line_comments: Sequence[dict[str, Any]] | None = None,
    ) -> _Call[ReviewResponse]:
        body: dict[str, Any] = {"action": action}
        if comment is not None:
            body["comment"] = comment
        if reviewer is not None:
            body["reviewer"] = reviewer
        if attempt is not None:
            body["attempt"] = attempt
        if line_comments:
            body["line_comments"] = list(line_comments)
        return _Call("POST", f"/v1/work-items/{work_item_id}/review", json=body)

    @staticmethod
    def cancel(work_item_id: str) -> _Call[ReviewResponse]:
        return _Call("POST", f"/v1/work-items/{work_item_id}/cancel")

    @staticmethod
    def legal_hold(work_item_id: str, reason: str | None) -> _Call[dict[str, Any]]:
        """Set (a reason) or clear (None) the item's legal hold."""
        if reason is None:
            return _Call("DELETE", f"/v1/work-items/{work_item_id}/legal-hold")
        return _Call("PUT", f"/v1/work-items/{work_item_id}/legal-hold", json={"reason": reason})

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
    def evidence_bundle(work_item_id: str, attempt: int | None) -> _Call[bytes]:
        params = {"attempt": attempt} if attempt is not None else None
        return _Call("GET", f"/v1/work-items/{work_item_id}/evidence-bundle", params=params, parse=_bytes)

    @staticmethod
    def sign_evidence_bundle(work_item_id: str, attempt: int) -> _Call[bytes]:
        return _Call(
            "POST", f"/v1/work-items/{work_item_id}/evidence-bundle", params={"attempt": attempt}, parse=_bytes
        )

    @staticmethod
    def evidence_keys() -> _Call[dict[str, Any]]:
        return _Call("GET", "/evidence/keys")

    @staticmethod
    def create_repository(body: Mapping[str, Any], tenant: str | None) -> _Call[dict[str, Any]]:
        return _Call("POST", "/v1/repositories", json=dict(body), params=_tenant(tenant))

    @staticmethod
    def repositories(tenant: str | None, all_tenants: bool) -> _Call[builtins.list[dict[str, Any]]]:
        params = {**_tenant(tenant), **({"all_tenants": "true"} if all_tenants else {})}
        return _Call("GET", "/v1/repositories", params=params, parse=lambda r: r.json()["items"])

    @staticmethod
    def flaky_tests(repository_id: str) -> _Call[builtins.list[dict[str, Any]]]:
        return _Call("GET", f"/v1/repositories/{repository_id}/flaky-tests", parse=lambda r: r.json()["items"])

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
