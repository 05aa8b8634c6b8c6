"""The API's edge: what every request must be before any route (or the MCP endpoint) reads it, and what a refusal
there costs the client.

Refused before any route runs, each a 4xx problem (never a 500):

| what | answer |
|---|---|
| a `Host` header that is not `host[:port]` (a DNS name, an IPv4 address or a bracketed IPv6 literal; a port of 1 to 65535 digits' worth, at most 65535), or more than one `Host` | 400 `invalid_host` |
| a body over MAX_BODY_BYTES (by its `Content-Length`), or a `Content-Length` that is not a number | 413 `payload_too_large` |
| a chunked body on POST, PUT or PATCH (no `Content-Length`) | 411 `length_required` |
| NUL in the path or query | 400 `invalid_request` |

**Every refusal at the edge is charged** to the client address's failed-authentication bucket
(crewwork.api.ratelimit, shared by all API processes), like a wrong key: a client that keeps sending malformed requests
is refused with 429 `rate_limited` from this process's memory, without another database round trip, until its
Retry-After has passed. The MCP endpoint's own edge refusals (a Host not allowed, a foreign Origin) are charged the
same way (crewwork.mcp.server).

The client address is the TCP peer, or, behind a proxy the operator names (CREWWORK_API_FORWARDED_ALLOW_IPS), the
address that proxy forwards: `uvicorn_proxy_options` is what every way of starting the API passes to uvicorn.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from typing import Any

from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from crewwork.api import problems
from crewwork.api.appstate import NotRunning, api_state
from crewwork.api.ratelimit import retry_after_header
from crewwork.observability.metrics import RATE_LIMITED

log = logging.getLogger("crewwork.api")

MAX_BODY_BYTES = 1024 * 1024
MAX_HOST_CHARS = 261
"""A DNS name (253) or a bracketed IPv6 literal (47), a colon and five port digits, and no more."""

_HOST = re.compile(
    r"(?:([A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_.])?)|\[([0-9A-Fa-f:.]{2,45})\])(?::([0-9]{1,5}))?"
)
_NUMERIC = re.compile(r"[0-9.]+")


def host_is_valid(value: str) -> bool:
    """A `Host` header as RFC 9110 allows it and nothing else: `name[:port]` or `[ipv6][:port]`, a port 1-65535.
    `127.0.0.1:evil.example` (a port that is a name), `localhost:99999`, `host:` and anything with a space, a slash,
    a user or a control character are not."""
    if len(value) > MAX_HOST_CHARS:
        return False
    m = _HOST.fullmatch(value)
    if m is None:
        return False
    name, ipv6, port = m.groups()
    try:
        if ipv6 is not None:
            ipaddress.IPv6Address(ipv6)
        elif _NUMERIC.fullmatch(name):  # all digits and dots: an IPv4 address or nothing
            ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return port is None or 1 <= int(port) <= 65535


def refusal(scope: Scope) -> problems.ProblemError | None:
    """Why this request is refused before any route reads it (the table above), or None."""
    headers = Headers(scope=scope)
    hosts = headers.getlist("host")
    if len(hosts) > 1 or (hosts and not host_is_valid(hosts[0])):
        return problems.ProblemError(
            400,
            "invalid_host",
            "the Host header must be one `host[:port]` (a DNS name, an IPv4 address or a bracketed IPv6 address; "
            "a port from 1 to 65535)",
        )
    length = headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
        return problems.ProblemError(413, "payload_too_large", f"request bodies are limited to {MAX_BODY_BYTES} bytes")
    if (
        scope["method"] in ("POST", "PUT", "PATCH")
        and length is None
        and "chunked" in headers.get("transfer-encoding", "")
    ):
        return problems.ProblemError(411, "length_required", "send Content-Length (chunked bodies are not accepted)")
    if "\x00" in scope["path"] or b"%00" in scope["query_string"]:
        # PostgreSQL text cannot hold NUL: refused here, not as a database error halfway through the request.
        return problems.ProblemError(400, "invalid_request", "NUL (%00) is not allowed in a URL's path or query")
    return None


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


async def charged(scope: Scope) -> float:
    """Charge one refused request to its client address (the failed-authentication bucket). Returns the seconds the
    address is now refused for (0: under the limit). A store that cannot be reached charges nothing: the refusal
    stands on its own."""
    try:
        limits = api_state(scope["app"]).rate_limits
    except (KeyError, NotRunning):  # before the app's lifespan has run
        return 0.0
    address = client_address(scope)
    blocked: float = limits.address_blocked(address)
    if blocked > 0:
        return blocked
    try:
        wait: float = await limits.charge_auth_failure(address)
    except Exception as exc:  # the store is down: the 4xx is still the answer
        log.warning("could not charge a refused request to %s: %s", address, exc)
        return 0.0
    return wait


def rate_limited(wait_s: float) -> problems.ProblemError:
    RATE_LIMITED.inc()
    return problems.ProblemError(
        429,
        "rate_limited",
        "too many refused requests (failed authentications or malformed requests) from this address; retry after "
        "the Retry-After header's seconds",
        headers={"Retry-After": retry_after_header(wait_s)},
    )


async def refuse(scope: Scope, receive: Receive, send: Send, problem: problems.ProblemError) -> None:
    """Answer `problem`, charged to the client's address: 429 instead once the address is over its limit."""
    wait = await charged(scope)
    await problems.problem_response(rate_limited(wait) if wait > 0 else problem)(scope, receive, send)


def uvicorn_proxy_options(forwarded_allow_ips: str) -> dict[str, Any]:
    """uvicorn's proxy options for CREWWORK_API_FORWARDED_ALLOW_IPS: `X-Forwarded-For`/`-Proto` are read only from
    the proxies the operator names. Empty (the default): from nobody, not uvicorn's own default (127.0.0.1, or its
    FORWARDED_ALLOW_IPS variable), under which any client on the API's host chose its own address by sending the
    header, and escaped the failed-authentication limit."""
    ips = ",".join(x.strip() for x in forwarded_allow_ips.split(",") if x.strip())
    if not ips:
        return {"proxy_headers": False, "forwarded_allow_ips": ""}
    return {"proxy_headers": True, "forwarded_allow_ips": ips}
