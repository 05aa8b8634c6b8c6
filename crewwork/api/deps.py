"""FastAPI dependencies: the running app's state (`ApiState`, crewwork/api/appstate.py) and its parts (the store, the
webhook outbox, the submission service), and the authenticated (and rate-limited) principal. Every one is typed: a
route names what it needs by type, never an attribute of `app.state`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from crewwork.api.appstate import ApiState, api_state
from crewwork.api.problems import ProblemError
from crewwork.api.ratelimit import retry_after_header
from crewwork.api.service import WorkItemService
from crewwork.observability.metrics import RATE_LIMITED
from crewwork.store.outbox import OutboxStore
from crewwork.store.store import Principal, Store

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer cw_...`")


# `async def`, though nothing in them awaits: FastAPI runs a plain `def` dependency in a worker thread, and these run
# on nearly every request (a thread hop each, ~10% of the API's busy samples under load; bench/trace.py --profile api).
# A dependency must not block: none of these does.


async def get_state(request: Request) -> ApiState:
    return api_state(request.app)


StateDep = Annotated[ApiState, Depends(get_state)]


async def get_store(state: StateDep) -> Store:
    return state.store


async def get_outbox(state: StateDep) -> OutboxStore:
    return state.outbox


async def get_service(state: StateDep) -> WorkItemService:
    return state.service


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
    state: StateDep,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    already = getattr(request.state, "principal", None)
    if isinstance(already, Principal):  # authenticated before its body was read (crewwork.api.bodies)
        return already
    limits = state.rate_limits
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
