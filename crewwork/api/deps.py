"""FastAPI dependencies: the store, the service, and the authenticated (and rate-limited) principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from crewwork.api.problems import ProblemError
from crewwork.api.ratelimit import TokenBuckets, retry_after_header
from crewwork.observability import RATE_LIMITED
from crewwork.service import WorkItemService
from crewwork.store.store import Principal, Store

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer cw_...`")


def get_store(request: Request) -> Store:
    return request.app.state.store  # type: ignore[no-any-return]


def get_service(request: Request) -> WorkItemService:
    return request.app.state.service  # type: ignore[no-any-return]


async def get_principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    store: Annotated[Store, Depends(get_store)],
) -> Principal:
    if creds is None or not creds.credentials:
        raise ProblemError(
            401,
            "unauthorized",
            "missing API key: send `Authorization: Bearer <key>`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if len(creds.credentials) > 200:
        raise ProblemError(401, "unauthorized", "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    principal = await store.authenticate(creds.credentials)
    if principal is None:
        raise ProblemError(401, "unauthorized", "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    limiter: TokenBuckets = request.app.state.rate_limiter
    wait = limiter.take(principal.key_id)
    if wait > 0:
        RATE_LIMITED.inc()
        raise ProblemError(
            429,
            "rate_limited",
            f"too many requests for this API key: at most {limiter.rate:g}/s (burst {limiter.burst:g}) "
            "per API process; retry after the Retry-After header's seconds",
            headers={"Retry-After": retry_after_header(wait)},
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
ServiceDep = Annotated[WorkItemService, Depends(get_service)]
