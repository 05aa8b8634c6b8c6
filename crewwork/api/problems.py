"""Errors as HTTP problems with one stable shape (RFC 9457 style) and a machine-readable `code`."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from crewwork.api.service import SubmissionRejected, refuse_unstorable
from crewwork.store.engine import store_unreachable


class Problem(BaseModel):
    type: str = "about:blank"
    title: str
    status: int
    code: str
    detail: str
    errors: list[dict[str, Any]] | None = None


class ProblemError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        title: str | None = None,
        errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.title = title or code.replace("_", " ")
        self.errors = errors
        self.headers = headers


def problem_response(p: ProblemError) -> JSONResponse:
    body = Problem(
        type=f"https://crewwork.dev/problems/{p.code}",
        title=p.title,
        status=p.status,
        code=p.code,
        detail=p.detail,
        errors=p.errors,
    )
    return JSONResponse(
        body.model_dump(exclude_none=True),
        status_code=p.status,
        media_type="application/problem+json",
        headers=p.headers,
    )


async def problem_handler(_req: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProblemError)
    return problem_response(exc)


async def validation_handler(_req: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = []
    for e in exc.errors():
        if e.get("type") == "json_invalid":
            # Its loc is ("body", <character offset>): the offset is no field. Say where, as a person counts.
            errors.append({"field": "", "message": _json_error(e, exc.body), "type": "json_invalid"})
            continue
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        errors.append({"field": loc, "message": e.get("msg", ""), "type": e.get("type", "")})
    detail = "; ".join(
        x["message"] if x["type"] == "json_invalid" else f"{x['field'] or 'body'}: {x['message']}" for x in errors[:5]
    )
    return problem_response(ProblemError(422, "invalid_request", detail, errors=jsonable_encoder(errors)))


def _json_error(e: dict[str, Any], doc: Any) -> str:
    """'the body is not valid JSON: <what> at line L, column C (character N)'."""
    loc = e.get("loc", ())
    pos = loc[-1] if loc and isinstance(loc[-1], int) else None
    what = str((e.get("ctx") or {}).get("error") or e.get("msg") or "malformed")
    where = ""
    if pos is not None:
        where = f" at character {pos}"
        if isinstance(doc, str | bytes):
            text = doc if isinstance(doc, str) else doc.decode(errors="replace")
            line = text.count("\n", 0, pos) + 1
            column = pos - (text.rfind("\n", 0, pos) + 1) + 1
            where = f" at line {line}, column {column} (character {pos})"
    return f"the body is not valid JSON: {what}{where}"


async def http_handler(_req: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}.get(exc.status_code, "http_error")
    return problem_response(ProblemError(exc.status_code, code, str(exc.detail), headers=getattr(exc, "headers", None)))


async def disconnect_handler(_req: Request, exc: Exception) -> JSONResponse:
    """The client went away before its body arrived (a Content-Length it did not send, then a closed connection):
    nothing to do and no one to answer; not an error of the server's (it was logged with a traceback, as a 500)."""
    return problem_response(ProblemError(400, "client_disconnected", "the request's body did not arrive"))


async def unhandled_handler(_req: Request, exc: Exception) -> JSONResponse:
    import logging

    if store_unreachable(exc):
        # The store cannot be reached (restart, failover): nothing was done; the client may retry (with the same
        # idempotency key, for a submission).
        logging.getLogger("crewwork.api").warning("store unavailable: %s", exc)
        return problem_response(
            ProblemError(
                503, "store_unavailable", "the store is unreachable; retry shortly", headers={"Retry-After": "2"}
            )
        )
    logging.getLogger("crewwork.api").exception("unhandled error: %s", exc)
    return problem_response(ProblemError(500, "internal_error", "an internal error occurred; it has been logged"))


def _problem(description: str) -> dict[str, Any]:
    return {"model": Problem, "description": description, "content": {"application/problem+json": {}}}


# Documented on every /v1 route (OpenAPI): the errors all routes can answer with, in the one problem shape.
PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _problem("Bad parameter (invalid_cursor, invalid_label_filter, invalid_last_event_id)"),
    401: _problem("Missing, invalid or revoked API key (unauthorized)"),
    403: _problem("Needs the admin scope (forbidden)"),
    404: _problem("No such resource for this tenant (not_found)"),
    413: _problem("Request body too large (payload_too_large)"),
    422: _problem(
        "Invalid request (invalid_request, invalid_work_item, invalid_repository, url_not_allowed, invalid_text, "
        "invalid_number, duplicate_key, too_deeply_nested)"
    ),
    429: _problem(
        "Rate limited (rate_limited; see Retry-After), or, for a submission, the tenant's queue is full (queue_full)"
    ),
    503: _problem("Temporal or the store unreachable (temporal_unavailable, store_unavailable); see Retry-After"),
}


def refuse_unstorable_body(body: Any, field_prefix: str = "") -> None:
    """422 `invalid_text` (or `too_deeply_nested`) for a request body holding what the store cannot keep, naming
    the field: see crewwork.api.service.refuse_unstorable, which every work item submission goes through."""
    try:
        refuse_unstorable(body, field_prefix)
    except SubmissionRejected as exc:
        raise ProblemError(422, exc.code, str(exc), errors=[{"field": exc.field or "", "message": str(exc)}]) from None
