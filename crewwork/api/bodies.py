"""Every /v1 route reads its JSON body through `CheckedJsonRoute`: parsed once, where it enters, into values the
store keeps faithfully (crewwork.jsonvalues), or refused with a 422 naming the field, before any handler or model
sees it. Without it, `1e999` in a typed field was a server error and `NaN` in `input` was stored as `null`."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from crewwork import jsonvalues
from crewwork.api.problems import ProblemError

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _is_json(content_type: str | None) -> bool:
    """The bodies FastAPI parses as JSON: no content type at all, or application/json or application/*+json."""
    if not content_type:
        return True
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


class CheckedJsonRoute(APIRoute):
    """An APIRoute whose JSON body is checked by crewwork.jsonvalues.loads before FastAPI validates it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            if request.method in BODY_METHODS and _is_json(request.headers.get("content-type")):
                body = await request.body()
                if body:
                    try:
                        # FastAPI reads the parsed value back (Request.json caches it): parsed once.
                        request._json = jsonvalues.loads(body)
                    except json.JSONDecodeError:
                        pass  # FastAPI parses it again and answers with a 422 saying where (problems.py)
                    except jsonvalues.JsonRefused as exc:
                        raise ProblemError(
                            422, exc.code, str(exc), errors=[{"field": exc.field, "message": str(exc)}]
                        ) from None
            return await handler(request)

        return checked
