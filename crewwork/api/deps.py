"""FastAPI dependencies: the store, the service, and the authenticated principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from crewwork.api.problems import ProblemError
from crewwork.service import WorkItemService
from crewwork.store.store import Principal, Store

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer cw_...`")


def get_store(request: Request) -> Store:
    return request.app.state.store  # type: ignore[no-any-return]


def get_service(request: Request) -> WorkItemService:
    return request.app.state.service  # type: ignore[no-any-return]


async def get_principal(
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
    principal = await store.authenticate(creds.credentials)
    if principal is None:
        raise ProblemError(401, "unauthorized", "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]
StoreDep = Annotated[Store, Depends(get_store)]
ServiceDep = Annotated[WorkItemService, Depends(get_service)]
