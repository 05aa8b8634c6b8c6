"""The edge of the API process (`crewwork api`, as the operator starts it): whatever arrives there, in the headers,
the method, the content type and encoding, the path or the body, of the API, the console or /mcp, is answered with
a 4xx (or the 503 of a Temporal that is not there), never a 500 and never a traceback in the log; a request refused
at the edge is charged to its address like a failed authentication; and `X-Forwarded-For` is believed only from a
proxy the operator names.

Requests are written to the socket byte for byte (an HTTP client would refuse to send most of them). The API runs
as its own process on a SQLite store of its own, with nothing at its Temporal address, so blocking 127.0.0.1 here
blocks no other test."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.conftest import api_process

Request = tuple[str, bytes]


def send(port: int, data: bytes, timeout_s: float = 30.0, *, half_close: bool = False) -> tuple[int, bytes]:
    """(status, raw response) of one request on its own connection (-1: no HTTP answer). `half_close`: the client
    says it sends nothing more (a body shorter than its Content-Length never arrives)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk or len(out) > 2_000_000:
                break
            out += chunk
    try:
        return int(out.split(b" ", 2)[1]), out
    except (IndexError, ValueError):
        return -1, out


def request(
    port: int,
    method: str = "GET",
    path: str = "/",
    headers: Sequence[tuple[str, str | bytes]] | None = None,
    body: bytes = b"",
    host: str | bytes | None = None,
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1".encode("latin-1")]
    if host != b"":
        h = host if host is not None else f"127.0.0.1:{port}"
        lines.append(b"Host: " + (h if isinstance(h, bytes) else h.encode("latin-1")))
    names = set()
    for k, v in headers or []:
        names.add(k.lower())
        lines.append(k.encode() + b": " + (v if isinstance(v, bytes) else v.encode("latin-1")))
    if body and not names & {"content-length", "transfer-encoding"}:
        lines.append(f"Content-Length: {len(body)}".encode())
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _key(log_dir: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    env["CREWWORK_DATABASE_URL"] = f"sqlite+aiosqlite:///{log_dir / 'db.sqlite'}"
    out = subprocess.run(
        [sys.executable, "-m", "crewwork", "keys", "create", "--tenant", "edge", "--json"],
        env=env,
        capture_output=True,
        check=True,
    )
    return str(json.loads(out.stdout)["key"])


@contextlib.contextmanager
def running_api(tmp_path: Path, **env: str) -> Iterator[tuple[int, Path, str]]:
    """`crewwork api` with `env`: (port, its log file, an API key of its store)."""
    with api_process(tmp_path, **env) as (_proc, port, log):
        yield port, log, _key(tmp_path)


def tracebacks(log: Path) -> list[str]:
    text = log.read_text(errors="replace")
    return [chunk[:1500] for chunk in text.split("Traceback (most recent call last)")[1:]]


# ----------------------------------------------------------------------------------------------- the corpus

MT = "application/vnd.crewwork.attestation-bundle.v1+json"
PATHS = [
    "/",
    "/console",
    "/console/static/app.js",
    "/console/static/../../../etc/passwd",
    "/console/static/%2e%2e/%2e%2e/etc/passwd",
    "/console/static/%ff",
    "/healthz",
    "/metrics",
    "/openapi.json",
    "/v1/me",
    "/v1/work-items",
    "/v1/work-items/%ff%fe",
    "/v1/work-items/" + "a" * 8000,
    "/v1/work-items?limit=-1",
    "/v1/work-items?limit=99999999999999999999",
    "/v1/work-items?cursor=garbage",
    "/v1/work-items?cursor=" + base64.urlsafe_b64encode(b"[1e999, 1]").decode(),
    "/v1/work-items?cursor=" + base64.urlsafe_b64encode(b"[" + b"1" * 5000 + b', "x"]').decode(),
    "/v1/work-items?cursor=" + base64.urlsafe_b64encode(b'[1, "\\ud800"]').decode(),
    "/v1/work-items?state=%ff&label=%ff&q=%ff%fe",
    "/v1/work-items?created_after=1e999",
    "/v1/work-items?q=" + "x" * 10_000,
    "//v1//work-items",
    "/v1/work-items/wi_x/events?after=99999999999999999999999",
    "/v1/events/stream?after=abc",
    "/v1/webhooks/wh_x/deliveries?limit=0",
    "/mcp/",
    "/mcp?x=%",
    "/%",
    "/.well-known/oauth-protected-resource/mcp",
    "/.well-known/oauth-protected-resource/mcp?x=%ff",
    "/evidence/keys",
    "http://evil.example/v1/me",
    "/v1/work-items/wi_x/artifacts/%2e%2e%2f",
    "/v1/work-items/\u00e9".encode().decode("latin-1"),
]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "PROPFIND", "FOO"]
HOSTS: list[str | bytes] = [
    "127.0.0.1:evil.example",
    "localhost:99999",
    "localhost:0",
    "127.0.0.1:",
    " ",
    "a b",
    "[::1",
    "[zz]",
    "999.1.1.1",
    "127.0.0.1:1:2",
    "h" * 300,
    "user@localhost",
    "localhost/x",
    b"\xff\xfe",
    "é",
]
HEADERS: list[tuple[str, str | bytes]] = [
    ("Authorization", "Bearer"),
    ("Authorization", "Bearer " + "x" * 10_000),
    ("Authorization", b"Bearer \x80\xff"),
    ("Authorization", "Basic !!!"),
    ("Content-Type", "application/json; charset=utf-16"),
    ("Content-Type", "a/b/c"),
    ("Content-Type", "multipart/form-data; boundary=x"),
    ("Content-Type", "application/x-www-form-urlencoded"),
    ("Content-Encoding", "gzip"),
    ("Accept", "text/event-stream"),
    ("Accept", "*/*;q=x"),
    ("Range", "bytes=999999-"),
    ("Range", "bytes=5-2"),
    ("Range", ",".join(["bytes=0-0"] + ["0-0"] * 2000)),
    ("If-None-Match", "*"),
    ("If-Modified-Since", "garbage"),
    ("Last-Event-ID", "x" * 1000),
    ("Idempotency-Key", "x" * 10_000),
    ("Idempotency-Key", b"\xff"),
    ("Origin", "null"),
    ("Origin", "http://evil.example"),
    ("Cookie", "a=" + "b" * 8000),
    ("X-Forwarded-For", "garbage"),
    ("Mcp-Session-Id", "\x01"),
    ("Mcp-Protocol-Version", "garbage"),
    ("Content-Length", "-1"),
    ("Content-Length", "1e3"),
    ("Content-Length", "99999999999999999999"),
    ("Transfer-Encoding", "chunked"),
    ("Traceparent", "garbage"),
    ("Baggage", "x" * 5000),
]
BODIES = [
    b"\xff\xfe{}",
    b"\xef\xbb\xbf{}",
    b'{"a":"\\ud800"}',
    b'{"a":"\\u0000"}',
    b"[" * 100_000,
    b"1" * 5000,
    b"1e999",
    b"NaN",
    b'{"a":1,"a":2}',
    b'{"kind":"task","input":{"x":1e999}}',
    b'{"kind":"task","input":{}} trailing',
    b"[]",
    b"null",
    '{"a":"é"}'.encode("utf-16"),
    b"\x00" * 100,
    b"{" + b",".join(b'"k%d":1' % i for i in range(50_000)) + b"}",
    b"{'a':1}",
]
BODY_PATHS = ["/v1/work-items", "/v1/repositories", "/v1/webhooks", "/v1/hotfix", "/v1/work-items/wi_x/review", "/mcp"]
RPC: list[object] = [
    [],
    [{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}] * 2,
    {"jsonrpc": "1.0", "id": 1, "method": "tools/list"},
    {"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"},
    {"jsonrpc": "2.0", "id": 1},
    {"jsonrpc": "2.0", "id": 1, "method": "nope"},
    {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "read_file", "arguments": []}},
    {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x" * 100_000}},
    {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": None},
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "git_log", "arguments": {"repo": "x", "skip": -1}},
    },
    {"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "crewwork://repositories/%ff/files/%00"}},
    {"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "file:///etc/passwd"}},
    {"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "crewwork://work-items/" + "x" * 1000}},
    {"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "crewwork://repositories/" + "x" * 5000}},
    {"jsonrpc": "2.0", "id": 1, "method": "resources/list", "params": {"cursor": "garbage"}},
    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "x", "capabilities": []}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 1, "result": {}},
    {"jsonrpc": "2.0", "id": 1, "method": "logging/setLevel", "params": {"level": "debug"}},
    {"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe", "params": {"uri": "x"}},
]


def corpus(port: int, key: str) -> Iterator[Request]:
    auth = ("Authorization", f"Bearer {key}")
    json_ct = ("Content-Type", "application/json")
    mcp_accept = ("Accept", "application/json, text/event-stream")
    for path in PATHS:
        for method in ("GET", "POST", "OPTIONS", "FOO"):
            body = b"{}" if method == "POST" else b""
            yield f"{method} {path[:60]}", request(port, method, path, [auth, json_ct], body)
    for method in METHODS:
        yield f"{method} /mcp", request(port, method, "/mcp", [auth, json_ct, mcp_accept], b"{}")
    for host in HOSTS:
        for path in ("/mcp", "/.well-known/oauth-protected-resource/mcp", "/v1/me", "/console", "/healthz"):
            method, body = ("POST", b"{}") if path == "/mcp" else ("GET", b"")
            yield f"Host {host!r:.30} {path}", request(port, method, path, [auth, json_ct, mcp_accept], body, host)
    yield "two Hosts", request(port, "GET", "/v1/me", [auth, ("Host", "other")])
    yield "no Host", request(port, "GET", "/v1/me", [auth], host=b"")
    rpc_list = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    for name, value in HEADERS:
        for method, path in (
            ("GET", "/v1/work-items"),
            ("POST", "/v1/work-items"),
            ("POST", "/mcp"),
            ("GET", "/console/static/app.js"),
            ("GET", "/evidence/keys"),
        ):
            body = rpc_list if path == "/mcp" else (b'{"kind":"task","input":{}}' if method == "POST" else b"")
            base = [(n, v) for n, v in (auth, json_ct, mcp_accept) if n.lower() != name.lower()]
            yield (
                f"{name}: {str(value)[:30]} {method} {path}",
                request(port, method, path, [*base, (name, value)], body),
            )
    for body in BODIES:
        for path in BODY_PATHS:
            yield f"body {body[:24]!r} {path}", request(port, "POST", path, [auth, json_ct, mcp_accept], body)
    for message in RPC:
        for version in (None, "2025-11-25", "2026-07-28"):
            headers: list[tuple[str, str | bytes]] = [auth, json_ct, mcp_accept]
            if version:
                headers.append(("Mcp-Protocol-Version", version))
            yield (
                f"rpc {json.dumps(message)[:60]} {version}",
                request(port, "POST", "/mcp", headers, json.dumps(message).encode()),
            )


# ----------------------------------------------------------------------------------------------- the tests


# Over 500 requests, each on a connection of its own, to an API process: ~15 s of CPU, run by `make test`.
@pytest.mark.heavy
def test_no_input_at_the_edge_gets_a_500_or_a_traceback(tmp_path: Path) -> None:
    with running_api(tmp_path, CREWWORK_API_AUTH_FAILURE_BURST="1000000") as (port, log, key):
        _fuzz(port, log, key)


def _fuzz(port: int, log: Path, key: str) -> None:
    wrong: list[str] = []
    n = 0
    for what, data in corpus(port, key):
        n += 1
        status, raw = send(port, data)
        # No Temporal behind this API: a submission that gets that far is a 503 `temporal_unavailable`, and
        # /healthz says it is not ready; any other 5xx (or no answer at all) is a failure.
        expected_503 = b"temporal_unavailable" in raw or b'"temporal":false' in raw
        if status < 100 or (status >= 500 and not (status == 503 and expected_503)):
            wrong.append(f"{what}: {status} {raw[-300:]!r}")
    assert n > 500
    assert not wrong, "\n".join(wrong[:30])
    # A client that goes away before its body arrives: a ClientDisconnect in the route logged a traceback (as a 500).
    for path in BODY_PATHS:
        headers = [("Authorization", f"Bearer {key}"), ("Content-Type", "application/json"), ("Content-Length", "100")]
        send(
            port,
            request(port, "POST", path, [*headers, ("Accept", "application/json, text/event-stream")], b"{}"),
            half_close=True,
        )
    assert not tracebacks(log), tracebacks(log)[:3]


SLOW_REFILL = {"CREWWORK_API_AUTH_FAILURE_RATE_PER_S": "0.001"}


def test_a_malformed_host_is_a_400_charged_to_the_address_before_authentication(tmp_path: Path) -> None:
    """`127.0.0.1:evil.example` or `localhost:99999` got a 500 and a logged traceback on /mcp and its metadata route,
    before authentication, and never counted against the failed-authentication limit."""
    with running_api(tmp_path, CREWWORK_API_AUTH_FAILURE_BURST="4", **SLOW_REFILL) as (port, log, key):
        _malformed_host(port, log, key)


def _malformed_host(port: int, log: Path, key: str) -> None:
    auth = ("Authorization", f"Bearer {key}")
    mcp = [auth, ("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")]
    metadata = "/.well-known/oauth-protected-resource/mcp"
    answers = [
        send(port, request(port, "POST", "/mcp", mcp, b"{}", "127.0.0.1:evil.example")),
        send(port, request(port, "GET", metadata, [], host="localhost:99999")),
        send(port, request(port, "GET", "/v1/me", [auth], host="localhost:99999")),
        send(port, request(port, "GET", "/console", [], host="127.0.0.1:evil.example")),
    ]
    for status, raw in answers:
        assert status == 400 and b'"code":"invalid_host"' in raw, raw[-300:]
    # Over the limit (4 here): refused from memory, a right key and a right Host too.
    for data in (
        request(port, "GET", metadata, [], host="localhost:99999"),
        request(port, "GET", "/v1/me", [auth]),
        request(port, "POST", "/mcp", mcp, b"{}"),
    ):
        status, raw = send(port, data)
        assert status == 429 and b"rate_limited" in raw and b"retry-after" in raw.lower(), raw[-300:]
    assert not tracebacks(log), tracebacks(log)[:3]


def _wrong_key(port: int, client: str) -> int:
    headers: list[tuple[str, str | bytes]] = [("Authorization", "Bearer cw_wrong"), ("X-Forwarded-For", client)]
    return send(port, request(port, "GET", "/v1/me", headers))[0]


def test_a_client_on_the_api_host_cannot_pick_its_address_with_x_forwarded_for(tmp_path: Path) -> None:
    """uvicorn believes X-Forwarded-For from 127.0.0.1 by default: a client there escaped the failed-authentication
    block by sending a new address with every wrong key. No proxy is named here, so the header is ignored."""
    with running_api(tmp_path, CREWWORK_API_AUTH_FAILURE_BURST="3", **SLOW_REFILL) as (port, _log, _key):
        codes = [_wrong_key(port, f"203.0.113.{i}") for i in range(5)]
    assert codes == [401, 401, 401, 429, 429], codes


def test_x_forwarded_for_is_believed_from_a_proxy_the_operator_names(tmp_path: Path) -> None:
    env = {"CREWWORK_API_AUTH_FAILURE_BURST": "3", "CREWWORK_API_FORWARDED_ALLOW_IPS": "127.0.0.1", **SLOW_REFILL}
    with running_api(tmp_path, **env) as (port, _log, _key):
        # Each forwarded client has its own bucket: another client's failures do not block this one.
        assert [_wrong_key(port, f"198.51.100.{i}") for i in range(5)] == [401] * 5
        assert [_wrong_key(port, "198.51.100.200") for _ in range(5)] == [401, 401, 401, 429, 429]
