"""Every /v1 route reads its JSON body through `CheckedJsonRoute`: parsed once, where it enters, into values the
store keeps faithfully (crewwork.boundary.jsonvalues), or refused with a 422 naming the field, before any handler or model
sees it. Without it, `1e999` in a typed field was a server error and `NaN` in `input` was stored as `null`.

Parsing is work the API does for whoever sends a body, so it is bounded (docs/bounds.md):

- a route that needs a key authenticates (and charges the key's rate limit, or the address's failed-authentication
  limit) **before** the body is read: an unauthenticated client cannot make the API parse anything;
- bodies are at most 1 MiB (crewwork.api.app, before this); one larger than LARGE_BODY_BYTES is parsed in a thread,
  at most MAX_LARGE_BODY_PARSES at once per process (more wait), so the event loop keeps serving everyone else.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials
from fastapi.security.utils import get_authorization_scheme_param

from crewwork.api.deps import get_principal, get_state
from crewwork.api.problems import ProblemError
from crewwork.boundary import jsonvalues

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
LARGE_BODY_BYTES = 64 * 1024
MAX_LARGE_BODY_PARSES = 2
_PARSES: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Semaphore]] = {}


def _parse_slots() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    found = _PARSES.get(id(loop))
    if found is None or found[0] is not loop:  # (the loop is held, so its id is not reused while it is kept here)
        if len(_PARSES) > 64:  # loops of finished apps (tests)
            _PARSES.clear()
        found = _PARSES[id(loop)] = (loop, asyncio.Semaphore(MAX_LARGE_BODY_PARSES))
    return found[1]


def _needs_principal(dependant: Dependant) -> bool:
    return any(d.call is get_principal or _needs_principal(d) for d in dependant.dependencies)


async def _authenticate_first(request: Request) -> None:
    """The route's own authentication, before its body is read (crewwork.api.deps.get_principal keeps the principal
    on the request, so the dependency does not charge the key twice)."""
    scheme, token = get_authorization_scheme_param(request.headers.get("authorization"))
    creds = HTTPAuthorizationCredentials(scheme=scheme, credentials=token) if scheme.lower() == "bearer" else None
    await get_principal(request, await get_state(request), creds)


async def _loads(body: bytes) -> Any:
    if len(body) <= LARGE_BODY_BYTES:
        return jsonvalues.loads(body)
    async with _parse_slots():
        return await asyncio.to_thread(jsonvalues.loads, body)


def _is_json(content_type: str | None) -> bool:
    """The bodies FastAPI parses as JSON: no content type at all, or application/json or application/*+json."""
    if not content_type:
        return True
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


class CheckedJsonRoute(APIRoute):
    """An APIRoute whose JSON body is checked by crewwork.boundary.jsonvalues.loads before FastAPI validates it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        needs_principal = _needs_principal(self.dependant)

        async def checked(request: Request) -> Response:
            if request.method in BODY_METHODS and _is_json(request.headers.get("content-type")):
                if needs_principal:
                    await _authenticate_first(request)
                body = await request.body()
                if body:
                    try:
                        # FastAPI reads the parsed value back (Request.json caches it): parsed once.
                        request._json = await _loads(body)
                    except json.JSONDecodeError:
                        pass  # FastAPI parses it again and answers with a 422 saying where (problems.py)
                    except jsonvalues.JsonRefused as exc:
                        raise ProblemError(
                            422, exc.code, str(exc), errors=[{"field": exc.field, "message": str(exc)}]
                        ) from None
            return await handler(request)

        return checked
