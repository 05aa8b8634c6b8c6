"""The repositories resource: the repositories a tenant registered, the only ones its work items may name.

Every query is scoped to the caller's tenant: another tenant's repository is a 404 with the same body as a missing
one. An admin key may act for any tenant (`?tenant=NAME` or id) and read or delete any repository by id."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from crewwork.api.bodies import CheckedJsonRoute
from crewwork.api.deps import PrincipalDep, StateDep, StoreDep
from crewwork.api.problems import PROBLEM_RESPONSES, ProblemError, refuse_unstorable_body
from crewwork.boundary.paths import PathPattern
from crewwork.models import CheckSpec, EnvironmentSpec, ValidationSpec
from crewwork.models.matrix import MAX_CHECKS
from crewwork.models.spec import _check_ref_name
from crewwork.repos.registration import RepoAddressRefused, RepoPolicyError
from crewwork.repos.tenancy import (
    Registration,
    RegistrationRejected,
    RepositoryRegistry,
    TooManyRepositories,
    not_found_by_id,
    repository_view,
)
from crewwork.store.repositories import RepositoryExists
from crewwork.store.store import Principal, Store
from crewwork.store.views import StoredRepository

router = APIRouter(
    prefix="/v1/repositories", tags=["repositories"], responses=PROBLEM_RESPONSES, route_class=CheckedJsonRoute
)

ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
MAX_PROTECT_PATHS = 64


class RepositoryCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(
        min_length=1,
        max_length=4096,
        description="The repository: https://, ssh://, scp-style, git://, file:// or a local path under the "
        "tenant's repository roots. Never credentials.",
    )
    default_ref: str = Field(
        default="HEAD", min_length=1, max_length=256, description="Ref work items start from when they name none."
    )
    credential: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="NAME of an operator-held credential (CREWWORK_REPO_CREDENTIALS) scoped to this URL and "
        "available to the tenant. The secret itself never passes through the API.",
    )
    protect_paths: list[PathPattern] = Field(
        default_factory=list,
        max_length=MAX_PROTECT_PATHS,
        description="Paths restored to the base commit before every validation of this repository's work items "
        "(added to `validation.protect.paths`).",
    )
    environment: EnvironmentSpec | None = Field(
        default=None, description="Default environment of this repository's work items (theirs overrides it)."
    )
    checks: list[CheckSpec] = Field(
        default_factory=list,
        max_length=MAX_CHECKS,
        description="Named checks every work item of this repository runs beside its tests (lint, type-check, "
        "another environment's tests ...); a work item's check of the same name replaces one (docs/checks.md).",
    )

    @field_validator("checks")
    @classmethod
    def _checks(cls, v: list[CheckSpec]) -> list[CheckSpec]:
        # The same rules as a work item's (distinct names and report paths).
        try:
            ValidationSpec(command=["true"], checks=v)
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return v

    @field_validator("default_ref")
    @classmethod
    def _ref(cls, v: str) -> str:
        return _check_ref_name(v)


class RepositoryView(BaseModel):
    id: str
    url: str
    default_ref: str
    credential: str | None = Field(description="The credential's name (never its secret).")
    protect_paths: list[str]
    # Likewise an environment stored under other rules: shown as stored, its items refused with a 422.
    environment: EnvironmentSpec | dict[str, Any] | None
    # A check stored under an earlier release's rules that this release refuses is shown as stored (a plain object),
    # not a server error; its items' submissions are refused with a 422 naming it until the registration is updated.
    checks: list[CheckSpec | dict[str, Any]] = Field(
        default_factory=list,
        description="Named checks its work items run (one this release no longer takes is shown as it was stored).",
    )
    auto_registered: bool = Field(description="Registered on first use (CREWWORK_AUTO_REGISTER_REPOS).")
    created_at: float


class RepositoryPage(BaseModel):
    items: list[RepositoryView]


def _view(row: StoredRepository) -> RepositoryView:
    return RepositoryView.model_validate(repository_view(row))


async def _acting_for(store: Store, principal: Principal, tenant: str | None) -> str:
    """The tenant a request acts for: the caller's, or (admin keys only) the one `tenant` names."""
    if tenant is None:
        return principal.tenant_id
    if not principal.admin:
        raise ProblemError(403, "forbidden", "acting for another tenant needs an API key with the `admin` scope")
    if await store.tenant_name(tenant) is not None:
        return tenant
    tid = await store.tenant_by_name(tenant)
    if tid is None:
        raise ProblemError(404, "not_found", f"no tenant {tenant}")
    return tid


TenantQuery = Annotated[
    str | None, Query(min_length=1, max_length=200, description="Admin only: act for this tenant (name or id).")
]


@router.post(
    "",
    status_code=201,
    response_model=RepositoryView,
    summary="Register a repository for the tenant",
    description="Checked before it is stored: allowed scheme, a local path resolved and under the tenant's "
    "repository roots with a git directory that sends git nowhere else (no alternates, `gitdir:`/`commondir` "
    "redirect or symlink out of it; else 422 `invalid_repository` naming the entry), a remote's host at an address the operator allows (public, or in "
    "CREWWORK_REPO_ALLOW_NETWORKS; else 422 `url_not_allowed`), the credential scoped to it and available to the "
    "tenant, the remote reachable with the default ref. 409 `repository_exists` if the tenant already registered "
    "the URL.",
)
async def create(
    request: Request,
    response: Response,
    body: RepositoryCreate,
    principal: PrincipalDep,
    store: StoreDep,
    state: StateDep,
    tenant: TenantQuery = None,
) -> RepositoryView:
    refuse_unstorable_body(body)
    tenant_id = await _acting_for(store, principal, tenant)
    registry = RepositoryRegistry(store, state.settings)
    reg = Registration(
        url=body.url,
        default_ref=body.default_ref,
        credential=body.credential,
        protect_paths=[str(p) for p in body.protect_paths],
        environment=body.environment,
        checks=list(body.checks),
    )
    try:
        row = await registry.register(tenant_id, reg)
    except RepositoryExists as exc:
        raise ProblemError(
            409,
            "repository_exists",
            str(exc),
            errors=[{"field": "url", "message": str(exc), "id": exc.existing.id}],
        ) from exc
    except TooManyRepositories as exc:
        raise ProblemError(409, "too_many_repositories", str(exc)) from exc
    except RepoAddressRefused as exc:
        # Before anything is stored or any git process runs (crewwork.repos.address).
        raise ProblemError(422, "url_not_allowed", str(exc), errors=[{"field": "url", "message": str(exc)}]) from exc
    except RepoPolicyError as exc:
        field = exc.field if isinstance(exc, RegistrationRejected) else "url"
        raise ProblemError(422, "invalid_repository", str(exc), errors=[{"field": field, "message": str(exc)}]) from exc
    response.headers["Location"] = f"/v1/repositories/{row.id}"
    return _view(row)


@router.get("", response_model=RepositoryPage, summary="The tenant's repositories, oldest first")
async def list_repositories(
    principal: PrincipalDep,
    store: StoreDep,
    tenant: TenantQuery = None,
    all_tenants: Annotated[bool, Query(description="Admin only: every tenant's repositories.")] = False,
) -> RepositoryPage:
    if all_tenants and not principal.admin:
        raise ProblemError(403, "forbidden", "all_tenants needs an API key with the `admin` scope")
    tenant_id = None if all_tenants else await _acting_for(store, principal, tenant)
    return RepositoryPage(items=[_view(r) for r in await store.list_repositories(tenant_id)])


async def _owned(store: Store, principal: Principal, repository_id: str) -> StoredRepository:
    if not ID_PATTERN.match(repository_id):
        raise ProblemError(404, "not_found", "no such repository")
    row = await store.get_repository(repository_id, None if principal.admin else principal.tenant_id)
    if row is None:
        raise ProblemError(404, "not_found", not_found_by_id(repository_id))
    return row


@router.get("/{repository_id}", response_model=RepositoryView, summary="One of the tenant's repositories")
async def get_repository(repository_id: str, principal: PrincipalDep, store: StoreDep) -> RepositoryView:
    return _view(await _owned(store, principal, repository_id))


@router.delete(
    "/{repository_id}",
    status_code=204,
    response_class=Response,
    summary="Unregister a repository (work items already submitted keep running)",
)
async def delete_repository(repository_id: str, principal: PrincipalDep, store: StoreDep) -> Response:
    await _owned(store, principal, repository_id)
    await store.delete_repository(repository_id, None if principal.admin else principal.tenant_id)
    return Response(status_code=204)


class FlakyTestView(BaseModel):
    model_config = ConfigDict(frozen=True)

    test_id: str
    times: int = Field(description="Validations that saw it fail and then pass on the same tree.")
    first_seen_at: float
    last_seen_at: float
    last_work_item_id: str
    last_attempt: int
    last_runs: str = Field(description="In which runs of that validation it failed and passed.")


class FlakyTestPage(BaseModel):
    items: list[FlakyTestView]


@router.get(
    "/{repository_id}/flaky-tests",
    response_model=FlakyTestPage,
    summary="The repository's flaky tests (validation.baseline), most recently seen first",
)
async def flaky_tests(repository_id: str, principal: PrincipalDep, store: StoreDep) -> FlakyTestPage:
    row = await _owned(store, principal, repository_id)
    rows = await store.list_flaky(None if principal.admin else principal.tenant_id, row.id)
    return FlakyTestPage(
        items=[
            FlakyTestView(
                test_id=f.test_id,
                times=f.times,
                first_seen_at=f.first_seen_at,
                last_seen_at=f.last_seen_at,
                last_work_item_id=f.last_work_item_id,
                last_attempt=f.last_attempt,
                last_runs=f.last_runs,
            )
            for f in rows
        ]
    )
