"""FastAPI dependencies: the store, the webhook outbox, the service, and the authenticated (and rate-limited)
principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from crewwork.api.problems import ProblemError
from crewwork.api.ratelimit import ApiRateLimits, retry_after_header
from crewwork.observability import RATE_LIMITED
from crewwork.service import WorkItemService
from crewwork.store.outbox import OutboxStore
from crewwork.store.store import Principal, Store

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer cw_...`")


# `async def`, though nothing in them awaits: FastAPI runs a plain `def` dependency in a worker thread, and these run
# on nearly every request (a thread hop each, ~10% of the API's busy samples under load; bench/trace.py --profile api).
# A dependency must not block: none of these does.


async def get_store(request: Request) -> Store:
    return request.app.state.store  # type: ignore[no-any-return]


async def get_outbox(request: Request) -> OutboxStore:
    return request.app.state.outbox  # type: ignore[no-any-return]


async def get_service(request: Request) -> WorkItemService:
    return request.app.state.service  # type: ignore[no-any-return]


def _unauthorized(detail: str) -> ProblemError:
    return ProblemError(401, "unauthorized", detail, headers={"WWW-Authenticate": "Bearer"})


def _rate_limited(detail: str, wait_s: float) -> ProblemError:
    RATE_LIMITED.inc()
    return ProblemError(
        429,
        "rate_limited",
        f"{detail}; retry after the Retry-After header's seconds",
        headers={"Retry-After": retry_after_header(wait_s)},
    )


async def get_principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    limits: ApiRateLimits = request.app.state.rate_limits
    address = request.client.host if request.client else "unknown"
    blocked = limits.address_blocked(address)
    if blocked > 0:
        # Refused from memory: no key lookup, no database round trip.
        raise _rate_limited("too many failed authentications from this address", blocked)
    if creds is None or not creds.credentials:
        raise _unauthorized("missing API key: send `Authorization: Bearer <key>`")
    principal, wait = (await limits.authenticate(creds.credentials)) if len(creds.credentials) <= 200 else (None, 0.0)
    if principal is None:
        wait = await limits.charge_auth_failure(address)
        if wait > 0:
            raise _rate_limited("too many failed authentications from this address", wait)
        raise _unauthorized("invalid or revoked API key")
    if wait > 0:
        raise _rate_limited(
            f"too many requests for this API key: at most {limits.key_rate_per_s:g}/s "
            f"(burst {limits.key_burst:g}), across all API processes",
            wait,
        )
    request.state.principal = principal
    return principal


async def get_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if not principal.admin:
        raise ProblemError(403, "forbidden", "this route needs an API key with the `admin` scope")
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]
AdminDep = Annotated[Principal, Depends(get_admin)]
StoreDep = Annotated[Store, Depends(get_store)]
OutboxDep = Annotated[OutboxStore, Depends(get_outbox)]
ServiceDep = Annotated[WorkItemService, Depends(get_service)]
