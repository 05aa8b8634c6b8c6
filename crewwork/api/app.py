"""The FastAPI application: the workflow-start API (OpenAPI at /openapi.json), live events, webhooks, the review
console (/console), Prometheus metrics (/metrics) and health (/healthz), and the front ends mounted on it
(`Extension`: the MCP endpoint, crewwork/mcp, which calls this API's route functions; crewwork/serve.py mounts it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crewwork import __version__, tracing
from crewwork.api import problems
from crewwork.api.admin import router as admin_router
from crewwork.api.evidence import router as evidence_router
from crewwork.api.hotfix import router as hotfix_router
from crewwork.api.ratelimit import ApiRateLimits
from crewwork.api.repositories import router as repositories_router
from crewwork.api.streams import EventHorizon
from crewwork.api.streams import router as events_router
from crewwork.api.webhooks import router as webhooks_router
from crewwork.api.work_items import router as work_items_router
from crewwork.config import Settings
from crewwork.config.api import ApiOptions
from crewwork.observability import (
    CONTENT_TYPE,
    HTTP_LATENCY,
    HTTP_REQUESTS,
    StoreProjections,
    configure_logging,
    render,
)
from crewwork.outbound import OutboundPolicy
from crewwork.service import WorkItemService
from crewwork.store.outbox import OutboxStore
from crewwork.store.store import Store
from crewwork.temporal.client import connect
from crewwork.webhooks.deliver import DeliveryPolicy, OutboxDeliverer

log = logging.getLogger("crewwork.api")

MAX_BODY_BYTES = 1024 * 1024
STATIC_DIR = Path(__file__).parent / "static"


class Extension(Protocol):
    """A front end served by the API process next to the API: its routes, and what runs while the app serves."""

    def routes(self) -> Sequence[BaseRoute]: ...

    def running(self) -> AbstractAsyncContextManager[None]: ...


class GuardAndMeasure:
    """Refuses what no route may read (an oversized, chunked or NUL-carrying request) before any route runs, and
    counts and times every request by route and status (HTTP_REQUESTS, HTTP_LATENCY; an event stream is counted, not
    timed).

    A plain ASGI middleware, not `@app.middleware("http")`: Starlette's BaseHTTPMiddleware runs each request's route
    in a task of its own behind memory streams, which cost more CPU per request than the rest of this class."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = _refusal(scope)
        if refused is not None:
            await problems.problem_response(refused)(scope, receive, send)
            return
        t0 = time.perf_counter()
        status, streaming = 500, False

        async def sending(message: Message) -> None:
            nonlocal status, streaming
            if message["type"] == "http.response.start":
                status = message["status"]
                streaming = Headers(raw=message["headers"]).get("content-type", "").startswith("text/event-stream")
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            # The route's template (set in the scope by the router), or "unmatched"; an exception no handler turned
            # into a response counts as the 500 the server answers with.
            path = getattr(scope.get("route"), "path", "unmatched")
            HTTP_REQUESTS.labels(method=scope["method"], route=path, status=str(status)).inc()
            if not streaming:
                HTTP_LATENCY.labels(method=scope["method"], route=path).observe(time.perf_counter() - t0)


def _refusal(scope: Scope) -> problems.ProblemError | None:
    headers = Headers(scope=scope)
    length = headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
        return problems.ProblemError(413, "payload_too_large", f"request bodies are limited to {MAX_BODY_BYTES} bytes")
    if (
        scope["method"] in ("POST", "PUT", "PATCH")
        and length is None
        and "chunked" in headers.get("transfer-encoding", "")
    ):
        return problems.ProblemError(411, "length_required", "send Content-Length (chunked bodies are not accepted)")
    if "\x00" in scope["path"] or b"%00" in scope["query_string"]:
        # PostgreSQL text cannot hold NUL: refused here, not as a database error halfway through the request.
        return problems.ProblemError(400, "invalid_request", "NUL (%00) is not allowed in a URL's path or query")
    return None


def create_app(
    settings: Settings,
    *,
    store: Store | None = None,
    options: ApiOptions | None = None,
    extensions: Sequence[Callable[[Settings, Any], Extension]] = (),
) -> FastAPI:
    """The API app. `extensions`: front ends to mount, each made from the settings and the app's state (which holds
    the store, the service and the rate limits once the app runs)."""
    options = options or settings.api

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.log_format == "json":
            configure_logging(settings.log_level, json_logs=True)
        own_store = store is None
        app.state.store = store or Store(
            settings.resolved_database_url(),
            pool_size=settings.db_pool_size,
            server_writes=settings.store_server_writes,
        )
        app.state.outbox = OutboxStore(app.state.store)
        app.state.service = WorkItemService(app.state.store, None, settings)
        app.state.rate_limits = ApiRateLimits(
            app.state.store,
            key_rate_per_s=options.api_rate_per_s,
            key_burst=options.api_rate_burst,
            auth_failure_rate_per_s=settings.api_auth_failure_rate_per_s,
            auth_failure_burst=settings.api_auth_failure_burst,
        )
        app.state.horizon = EventHorizon(app.state.store, poll_s=options.sse_poll_s)
        await app.state.horizon.start()
        # The projections go on a registry of this app's own (several apps may share one process in tests).
        app.state.projections = StoreProjections(app.state.store, settings.metrics_store_refresh_s)
        app.state.projections_registry = CollectorRegistry(auto_describe=True)
        app.state.projections_registry.register(app.state.projections)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_connect_forever(app, settings))]
        if options.webhook_delivery:
            app.state.deliverer = OutboxDeliverer(
                app.state.outbox,
                DeliveryPolicy(
                    max_attempts=options.webhook_max_attempts,
                    backoff_s=options.webhook_backoff_s,
                    max_backoff_s=options.webhook_max_backoff_s,
                ),
                OutboundPolicy.from_settings(settings),
            )
            tasks.append(asyncio.create_task(app.state.deliverer.run(stop)))
        try:
            async with contextlib.AsyncExitStack() as running:
                for extension in app.state.extensions:
                    await running.enter_async_context(extension.running())
                yield
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await app.state.horizon.stop()
            if own_store:
                await app.state.store.close()

    app = FastAPI(
        title="crewwork",
        version=__version__,
        description="A durable runtime for AI agent work, built on Temporal. Submit work items, follow them live, "
        "review their changes. Errors are `application/problem+json` with a stable machine-readable `code`. "
        "Authenticate with `Authorization: Bearer <API key>`; requests are rate limited per key (429 with "
        "Retry-After), shared by all API processes; failed authentications are rate limited per client address.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.options = options
    app.add_exception_handler(problems.ProblemError, problems.problem_handler)
    app.add_exception_handler(RequestValidationError, problems.validation_handler)
    app.add_exception_handler(StarletteHTTPException, problems.http_handler)
    app.add_exception_handler(Exception, problems.unhandled_handler)
    app.include_router(work_items_router)
    app.include_router(hotfix_router)
    app.include_router(repositories_router)
    app.include_router(events_router)
    app.include_router(webhooks_router)
    app.include_router(admin_router)
    app.include_router(evidence_router)
    app.state.extensions = [make(settings, app.state) for make in extensions]
    for extension in app.state.extensions:
        app.router.routes.extend(extension.routes())

    app.add_middleware(GuardAndMeasure)

    @app.get(
        "/healthz",
        tags=["health"],
        summary="Readiness: 200 when the database and Temporal are reachable, 503 otherwise",
        responses={503: {"description": "Not ready: the body says which dependency is down"}},
    )
    async def healthz() -> Response:
        db_ok = True
        try:
            await app.state.store.db_now()
        except Exception:
            db_ok = False
        temporal_ok = app.state.service.client is not None
        body = {"ok": db_ok and temporal_ok, "database": db_ok, "temporal": temporal_ok, "version": __version__}
        # A plain HTTP readiness probe (load balancer, Kubernetes) only looks at the status code.
        return JSONResponse(body, status_code=200 if body["ok"] else 503)

    @app.get(
        "/metrics",
        tags=["health"],
        summary="Prometheus metrics (text format)",
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def metrics() -> Response:
        await app.state.projections.refresh()
        return Response(render() + render(app.state.projections_registry), media_type=CONTENT_TYPE)

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/console")

    @app.get("/console", include_in_schema=False)
    async def console() -> FileResponse:
        return FileResponse(
            STATIC_DIR / "index.html",
            headers={
                "Content-Security-Policy": "default-src 'self'; style-src 'self'; script-src 'self'; "
                "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
                "Cache-Control": "no-cache",
            },
        )

    app.mount("/console/static", StaticFiles(directory=STATIC_DIR), name="console-static")
    tracing.instrument_app(app)
    return app


async def _connect_forever(app: FastAPI, settings: Settings) -> None:
    """Connect to Temporal in the background, so the API starts (and reports unready) while Temporal is down."""
    delay = 0.2
    while app.state.service.client is None:
        try:
            app.state.service.client = await connect(settings)
            log.info("connected to Temporal at %s", settings.temporal_address)
        except Exception as exc:
            log.warning("Temporal at %s not reachable yet: %s", settings.temporal_address, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
