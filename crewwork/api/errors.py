"""Error intake over HTTP (docs/errors-intake.md): a registered repository's error intake project, and the
endpoints the Sentry SDK reports to.

`PUT /v1/repositories/{id}/errors` registers (the tenant's key) and answers the DSN to give the app's `sentry-sdk`
(`http(s)://<public key>@<this API>/<project id>`). The SDK then posts to `POST /api/<project id>/envelope/` (or
the legacy `/api/<project id>/store/`): no API key, the DSN's key (`X-Sentry-Auth: Sentry sentry_key=...`, or
`?sentry_key=`) names the registration. The endpoint starts no workflow: it authenticates, charges the project's
rate, reads the body within its bounds, counts each error event into its group (crewwork/store/errors.py) and
answers; the intake (crewwork/api/errors_intake.py) makes the work items. OpenTelemetry exporters post to
`/otlp/<project id>/v1/logs` and `/v1/traces` with the key as a Bearer token (crewwork/errors/otel.py), answered the
same way (success: an empty export response). What it answers:

| the request | answer |
|---|---|
| `Content-Length` over CREWWORK_ERRORS_MAX_BODY_BYTES (or no `Content-Length`) | 413 `payload_too_large` (411 `length_required`), before the body is read |
| no key | 401 `key_missing` (charged to the address like a wrong API key) |
| a key that is not the project's, or a project that does not exist | 403 `key_invalid` (charged the same way) |
| over the project's rate (`rate_per_s`, `burst`) | 429 `rate_limited`, `Retry-After` and `X-Sentry-Rate-Limits` (the SDK stops sending for that long) |
| a `Content-Encoding` other than identity, gzip or deflate | 415 `unsupported_encoding` |
| a body that inflates past CREWWORK_ERRORS_MAX_DECOMPRESSED_BYTES (a zip bomb) | 413 `payload_too_large`, as soon as it does |
| a body that is not valid per its encoding, or not an envelope / event | 400 `invalid_encoding` / `invalid_envelope` / `invalid_event` |
| more than CREWWORK_ERRORS_MAX_ITEMS items in an envelope | 413 `too_many_items` |
| a new error while the project has `max_open_groups` errors whose item has not ended | 429 `too_many_open_errors`, Retry-After 60 (repeats of known errors are counted) |
| anything else | 200 `{"id": <event id>, "outcomes": [...]}`: `new`, `counted`, `reopened` per error event; other items dropped |
"""

from __future__ import annotations

import asyncio
import hmac
import re
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, Field

from crewwork.admission.policy import PolicyViolation
from crewwork.agents.catalogue import agent_check
from crewwork.api.bodies import CheckedJsonRoute
from crewwork.api.deps import PrincipalDep, StateDep
from crewwork.api.hotfix import implicated_files
from crewwork.api.problems import PROBLEM_RESPONSES, ProblemError, refuse_unstorable_body
from crewwork.api.ratelimit import retry_after_header
from crewwork.api.repositories import ID_PATTERN
from crewwork.errors.otel import PROTOBUF, parse_otlp
from crewwork.errors.reports import ErrorReport, Refused, decompressed
from crewwork.errors.sentry import Envelope, auth_key, parse_envelope, parse_store
from crewwork.errors.work import ErrorIntakeSettings
from crewwork.models import RepoSpec, ReviewSpec, WorkItemKind, WorkItemSpec
from crewwork.models.errors import AgentConfigError
from crewwork.store.errors import ErrorStore, GroupRecord, Project

router = APIRouter(
    prefix="/v1/repositories", tags=["error intake"], responses=PROBLEM_RESPONSES, route_class=CheckedJsonRoute
)
sentry_router = APIRouter(prefix="/api", tags=["error intake"], responses=PROBLEM_RESPONSES)
otlp_router = APIRouter(prefix="/otlp", tags=["error intake"], responses=PROBLEM_RESPONSES)

_PROJECT_ID = re.compile(r"^[1-9][0-9]{0,15}$")
_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")
THREAD_PARSE_BYTES = 64 * 1024
"""A decompressed body larger than this is parsed in a thread, so the event loop keeps answering."""
MAX_FILES = 20
OPEN_GROUPS_RETRY_S = 60


class ErrorProjectView(BaseModel):
    project_id: int
    repository_id: str
    public_key: str = Field(description="The DSN's key. An app ships it: it lets its holder report errors only.")
    dsn: str = Field(description="What to give the app's Sentry SDK as its DSN.")
    settings: ErrorIntakeSettings
    created_at: float


class GroupView(BaseModel):
    id: int
    fingerprint: str
    title: str
    generation: int = Field(description="Items the group has had (a report after its item ended starts the next).")
    count: int = Field(description="Reports of this generation.")
    total: int = Field(description="Reports of every generation.")
    first_seen: float
    last_seen: float
    status: str = Field(description="pending | submitted | failed")
    work_item_id: str | None
    previous_work_item_id: str | None
    last_error: str | None


class GroupPage(BaseModel):
    items: list[GroupView]


class ReportAnswer(BaseModel):
    id: str = Field(description="The event id (the SDK's own).")
    outcomes: list[str] = Field(description="Per error event: new | counted | reopened.")
    dropped: int = Field(description="Items that were not error events (sessions, transactions, ...).")


def _errors(state: StateDep) -> ErrorStore:
    return ErrorStore(state.store)


def dsn_of(request: Request, project: Project) -> str:
    base = str(request.base_url).rstrip("/")
    scheme, _, rest = base.partition("://")
    return f"{scheme}://{project.public_key}@{rest}/{project.id}"


def _view(request: Request, project: Project) -> ErrorProjectView:
    return ErrorProjectView(
        project_id=project.id,
        repository_id=project.repository_id,
        public_key=project.public_key,
        dsn=dsn_of(request, project),
        settings=ErrorIntakeSettings.model_validate(project.settings),
        created_at=project.created_at,
    )


async def _owned_repository(state: StateDep, principal: PrincipalDep, repository_id: str) -> str:
    if not ID_PATTERN.match(repository_id):
        raise ProblemError(404, "not_found", "no such repository")
    row = await state.store.get_repository(repository_id, principal.tenant_id)
    if row is None:
        raise ProblemError(404, "not_found", f"no repository {repository_id}")
    return principal.tenant_id


async def _check_runnable(state: StateDep, tenant_id: str, repository_id: str, body: ErrorIntakeSettings) -> None:
    """What an error's item would run passes the agent's own check and the operator's policy now, not only when
    the first error arrives: 422 naming the field otherwise."""
    spec = WorkItemSpec(
        kind=WorkItemKind.hotfix,
        repo=RepoSpec(id=repository_id),
        instruction="(the error)",
        validation=body.validation,
        agent=body.agent,
        budget=body.budget,
        review=ReviewSpec(required=body.review_required),
    )
    try:
        agent_check(spec.agent.name, plugins=state.settings.agent_plugins).validate_config(spec.kind, spec.agent.config)
        (await state.service.policy(tenant_id)).check(spec)
    except AgentConfigError as exc:
        raise ProblemError(422, "invalid_settings", str(exc), errors=[{"field": "agent", "message": str(exc)}]) from exc
    except PolicyViolation as exc:
        raise ProblemError(
            422, "policy_violation", str(exc), errors=[{"field": exc.field, "message": str(exc)}]
        ) from exc


@router.put(
    "/{repository_id}/errors",
    response_model=ErrorProjectView,
    summary="Take a repository's application errors (the Sentry SDK's DSN) as hotfix work items",
    description="201 with the DSN when the project is made; a later PUT replaces the settings and keeps the key "
    "and the DSN (200).",
    responses={201: {"model": ErrorProjectView, "description": "Registered"}},
)
async def register(
    repository_id: str,
    body: ErrorIntakeSettings,
    request: Request,
    response: Response,
    principal: PrincipalDep,
    state: StateDep,
) -> ErrorProjectView:
    refuse_unstorable_body(body)
    tenant_id = await _owned_repository(state, principal, repository_id)
    await _check_runnable(state, tenant_id, repository_id, body)
    project, made = await _errors(state).register(
        tenant_id=tenant_id, repository_id=repository_id, settings=body.model_dump(mode="json")
    )
    response.status_code = 201 if made else 200
    return _view(request, project)


@router.get("/{repository_id}/errors", response_model=ErrorProjectView, summary="A repository's error intake")
async def get_project(
    repository_id: str, request: Request, principal: PrincipalDep, state: StateDep
) -> ErrorProjectView:
    return _view(request, await _project(state, principal, repository_id))


async def _project(state: StateDep, principal: PrincipalDep, repository_id: str) -> Project:
    tenant_id = await _owned_repository(state, principal, repository_id)
    project = await _errors(state).project_of(tenant_id, repository_id)
    if project is None:
        raise ProblemError(404, "not_found", f"repository {repository_id} has no error intake")
    return project


@router.post(
    "/{repository_id}/errors/rotate-key",
    response_model=ErrorProjectView,
    summary="A new DSN key (the old one is refused at once: give the apps the new DSN)",
)
async def rotate(repository_id: str, request: Request, principal: PrincipalDep, state: StateDep) -> ErrorProjectView:
    tenant_id = await _owned_repository(state, principal, repository_id)
    project = await _errors(state).rotate_key(tenant_id, repository_id)
    if project is None:
        raise ProblemError(404, "not_found", f"repository {repository_id} has no error intake")
    return _view(request, project)


@router.delete(
    "/{repository_id}/errors", status_code=204, response_class=Response, summary="Stop taking the repository's errors"
)
async def unregister(repository_id: str, principal: PrincipalDep, state: StateDep) -> Response:
    tenant_id = await _owned_repository(state, principal, repository_id)
    if not await _errors(state).unregister(tenant_id, repository_id):
        raise ProblemError(404, "not_found", f"repository {repository_id} has no error intake")
    return Response(status_code=204)


@router.get(
    "/{repository_id}/errors/groups",
    response_model=GroupPage,
    summary="The repository's errors, one group per fingerprint, last seen first",
)
async def groups(repository_id: str, principal: PrincipalDep, state: StateDep) -> GroupPage:
    project = await _project(state, principal, repository_id)
    rows = await _errors(state).groups(project.id)
    return GroupPage(items=[_group_view(r) for r in rows])


def _group_view(r: GroupRecord) -> GroupView:
    return GroupView.model_validate(r, from_attributes=True)


# ---------------------------------------------------------------- the Sentry SDK's endpoints


async def _bounded_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is None or not declared.isdigit():
        raise ProblemError(411, "length_required", "an error report needs a Content-Length")
    if int(declared) > limit:
        raise ProblemError(413, "payload_too_large", f"an error report is at most {limit} bytes as sent")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProblemError(413, "payload_too_large", f"an error report is at most {limit} bytes as sent")
        chunks.append(chunk)
    return b"".join(chunks)


async def _authenticated(request: Request, state: StateDep, project_id: str, key: str | None) -> Project:
    address = request.client.host if request.client else "unknown"
    blocked = state.rate_limits.address_blocked(address)
    if blocked > 0:
        raise ProblemError(
            429,
            "rate_limited",
            "too many failed authentications from this address",
            headers={"Retry-After": retry_after_header(blocked)},
        )
    if key is None:
        await state.rate_limits.charge_auth_failure(address)
        raise ProblemError(
            401,
            "key_missing",
            "send the DSN's key (X-Sentry-Auth: Sentry sentry_key=<key>, or ?sentry_key=<key>; OTLP: "
            "Authorization: Bearer <key>)",
        )
    project = await _errors(state).project(int(project_id)) if _PROJECT_ID.match(project_id) else None
    if project is None or not hmac.compare_digest(key.encode(), project.public_key.encode()):
        await state.rate_limits.charge_auth_failure(address)
        raise ProblemError(403, "key_invalid", "the DSN's key is not this project's (or there is no such project)")
    return project


def _rate_limited(wait_s: float, code: str, detail: str, reason: str) -> ProblemError:
    seconds = retry_after_header(wait_s)
    return ProblemError(
        429,
        code,
        detail,
        # The SDK reads X-Sentry-Rate-Limits first (`<seconds>:<categories>:<scope>:<reason>`, no categories: all).
        headers={"Retry-After": seconds, "X-Sentry-Rate-Limits": f"{seconds}::project:{reason}"},
    )


def _sample(report: ErrorReport) -> dict[str, object]:
    trace = report.trace()
    return {
        "exception_type": report.exception_type,
        "message": report.message,
        "trace": trace,
        "files": implicated_files(trace)[:MAX_FILES],
        "platform": report.platform,
        "event_id": report.event_id,
    }


async def _report(
    request: Request, state: StateDep, project_id: str, key: str | None, parse: Callable[[bytes], Envelope]
) -> ReportAnswer:
    options = state.options
    body = await _bounded_body(request, options.errors_max_body_bytes)
    project = await _authenticated(request, state, project_id, key)
    settings = ErrorIntakeSettings.model_validate(project.settings)
    charge = await state.store.charge_rate_limit(
        f"errors:{project.id}", rate_per_s=settings.rate_per_s, burst=float(settings.burst)
    )
    if not charge.allowed:
        raise _rate_limited(
            charge.retry_after_s,
            "rate_limited",
            f"this project may report {settings.rate_per_s:g} times per second (burst {settings.burst}); retry "
            "after the Retry-After header's seconds",
            "crewwork_project_rate",
        )
    try:
        raw = decompressed(body, request.headers.get("content-encoding", ""), options.errors_max_decompressed_bytes)
        envelope = await asyncio.to_thread(parse, raw) if len(raw) > THREAD_PARSE_BYTES else parse(raw)
    except Refused as exc:
        raise ProblemError(exc.status, exc.code, str(exc)) from None
    # One request's repeats of an error are counted in one transaction: a batch of 500 is not 500 round trips.
    batch: dict[str, tuple[ErrorReport, int]] = {}
    for report in envelope.events:
        fp = report.fingerprint()
        first, n = batch.get(fp, (report, 0))
        batch[fp] = (first, n + 1)
    if len(batch) > options.errors_max_items:
        raise ProblemError(
            413, "too_many_items", f"one request reports at most {options.errors_max_items} distinct errors"
        )
    errors = _errors(state)
    outcomes: list[str] = []
    over = False
    for fp, (report, n) in batch.items():
        recorded = await errors.record(
            project, fp, report.title, _sample(report), max_open_groups=settings.max_open_groups, times=n
        )
        if recorded.outcome == "over_limit":
            over = True
        else:
            outcomes += [recorded.outcome] + ["counted"] * (n - 1)
    if any(o in ("new", "reopened") for o in outcomes) and state.errors_intake is not None:
        state.errors_intake.wake()
    if over:
        raise _rate_limited(
            OPEN_GROUPS_RETRY_S,
            "too_many_open_errors",
            f"this project already has {settings.max_open_groups} errors whose work item has not ended "
            "(max_open_groups): a new error is not taken until one ends",
            "crewwork_open_errors",
        )
    return ReportAnswer(id=envelope.event_id, outcomes=outcomes, dropped=envelope.dropped)


SentryKey = Annotated[str | None, Query(alias="sentry_key", min_length=1, max_length=64)]


@sentry_router.post(
    "/{project_id}/envelope/",
    response_model=ReportAnswer,
    summary="Where the Sentry SDK sends envelopes (authenticated by the DSN's key)",
)
async def envelope(project_id: str, request: Request, state: StateDep, sentry_key: SentryKey = None) -> ReportAnswer:
    key = auth_key(request.headers.get("x-sentry-auth"), sentry_key)
    max_items = state.options.errors_max_items
    return await _report(request, state, project_id, key, lambda raw: parse_envelope(raw, max_items))


@sentry_router.post(
    "/{project_id}/store/",
    response_model=ReportAnswer,
    summary="The legacy Sentry store endpoint: one event as JSON (authenticated by the DSN's key)",
)
async def store_event(project_id: str, request: Request, state: StateDep, sentry_key: SentryKey = None) -> ReportAnswer:
    key = auth_key(request.headers.get("x-sentry-auth"), sentry_key)
    return await _report(request, state, project_id, key, parse_store)


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and _KEY.fullmatch(token) else None


async def _otlp(request: Request, state: StateDep, project_id: str, signal: str) -> Response:
    content_type = request.headers.get("content-type", "")
    await _report(request, state, project_id, _bearer(request), lambda raw: parse_otlp(raw, content_type, signal))
    # An export response with nothing rejected: `{}` as JSON, or the empty message as protobuf.
    if content_type.split(";", 1)[0].strip().lower() == PROTOBUF:
        return Response(b"", media_type=PROTOBUF)
    return Response(b"{}", media_type="application/json")


@otlp_router.post(
    "/{project_id}/v1/logs",
    summary="OTLP/HTTP logs: records with `exception.*` attributes are error reports (the DSN's key as Bearer)",
    response_class=Response,
)
async def otlp_logs(project_id: str, request: Request, state: StateDep) -> Response:
    return await _otlp(request, state, project_id, "logs")


@otlp_router.post(
    "/{project_id}/v1/traces",
    summary="OTLP/HTTP traces: span events named `exception` are error reports (the DSN's key as Bearer)",
    response_class=Response,
)
async def otlp_traces(project_id: str, request: Request, state: StateDep) -> Response:
    return await _otlp(request, state, project_id, "traces")
