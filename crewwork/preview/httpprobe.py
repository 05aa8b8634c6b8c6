"""HTTP probes: one request to the running app through the front door (httpx over the unix socket), its answer
read with a bound, never a redirect followed, recorded as an `HttpExchange` and a readable transcript."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from crewwork.models.preview import HttpProbe
from crewwork.preview.records import MAX_BODY_SEEN, MAX_HEADERS_SEEN, HttpExchange, cut


async def run_http(client: httpx.AsyncClient, probe: HttpProbe) -> HttpExchange:
    """Send the probe's request and record what came back (or why nothing did), within its timeout."""
    headers = dict(probe.headers)
    content: bytes | None = None
    if probe.json_body is not None:
        content = json.dumps(probe.json_body).encode()
        headers.setdefault("Content-Type", "application/json")
    elif probe.body is not None:
        content = probe.body.encode()
    base: dict[str, object] = dict(
        name=probe.name,
        method=probe.method,
        path=probe.path,
        request_headers=headers,
        request_body=(content or b"").decode("utf-8", "replace"),
    )
    started = time.monotonic()
    try:
        return await asyncio.wait_for(_exchange(client, probe, headers, content, base, started), probe.timeout_s)
    except TimeoutError:
        return HttpExchange(**base, error=f"no complete answer within {probe.timeout_s:g} s", elapsed_s=probe.timeout_s)  # type: ignore[arg-type]
    except httpx.HTTPError as exc:
        why = cut(f"{type(exc).__name__}: {exc}", 500)
        return HttpExchange(**base, error=why, elapsed_s=round(time.monotonic() - started, 4))  # type: ignore[arg-type]


async def _exchange(
    client: httpx.AsyncClient,
    probe: HttpProbe,
    headers: dict[str, str],
    content: bytes | None,
    base: dict[str, object],
    started: float,
) -> HttpExchange:
    request = client.build_request(probe.method, probe.path, headers=headers, content=content)
    response = await client.send(request, stream=True)
    try:
        body = bytearray()
        truncated = False
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) > MAX_BODY_SEEN:
                truncated = True
                del body[MAX_BODY_SEEN:]
                break
    finally:
        await response.aclose()
    seen_headers = [(cut(k, 200), cut(v, 500)) for k, v in response.headers.multi_items()[:MAX_HEADERS_SEEN]]
    encoding = response.headers.get("content-encoding", "").strip()
    if encoding.lower() in ("identity", ""):
        encoding = ""
    return HttpExchange(
        **base,  # type: ignore[arg-type]
        status=response.status_code,
        response_headers=seen_headers,
        body=_decode(bytes(body), encoding),
        body_truncated=truncated,
        body_encoding=cut(encoding, 40) if encoding else None,
        elapsed_s=round(time.monotonic() - started, 4),
    )


def _decode(raw: bytes, encoding: str) -> str:
    # Raw bytes are read (a compressed body cannot be inflated into a bomb); a compressed one is shown as such, and no
    # body assertion is judged on it (crewwork/preview/verdict.py).
    if encoding:
        return f"[{len(raw)} bytes of {cut(encoding, 40)}-encoded body, not decoded]"
    return raw.decode("utf-8", "replace")


def transcript(x: HttpExchange) -> bytes:
    """The exchange as a person reads it (the transcript artifact), request then response."""
    lines = [f"> {x.method} {x.path} HTTP/1.1"]
    lines += [f"> {k}: {v}" for k, v in x.request_headers.items()]
    lines.append(">")
    if x.request_body:
        lines.append(x.request_body)
    if x.error is not None:
        lines.append(f"! no answer: {x.error}")
    else:
        lines.append(f"< HTTP {x.status}  ({x.elapsed_s:.3f} s)")
        lines += [f"< {k}: {v}" for k, v in x.response_headers]
        lines.append("<")
        lines.append(x.body)
        if x.body_truncated:
            lines.append(f"[… body cut at {MAX_BODY_SEEN} bytes …]")
    return "\n".join(lines).encode() + b"\n"
