"""The FastAPI application: the workflow-start API (OpenAPI at /openapi.json), live events, webhooks, the review
console (/console), Prometheus metrics (/metrics) and health (/healthz), and the front ends mounted on it
(`Extension`: the MCP endpoint, crewwork/mcp, which calls this API's route functions; crewwork/cli/serve.py mounts it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crewwork import __version__
from crewwork.api import edge, problems
from crewwork.api.admin import router as admin_router
from crewwork.api.appstate import STATE_KEY, ApiState, api_state
from crewwork.api.bundles import router as evidence_router
from crewwork.api.changes import router as changes_router
from crewwork.api.errors import otlp_router, sentry_router
from crewwork.api.errors import router as errors_router
from crewwork.api.errors_intake import ErrorIntake
from crewwork.api.forge import router as forge_router
from crewwork.api.forge import webhook_router as forge_webhook_router
from crewwork.api.forge_intake import ForgeIntake
from crewwork.api.holds import router as holds_router
from crewwork.api.horizon import EventHorizon
from crewwork.api.hotfix import router as hotfix_router
from crewwork.api.ratelimit import ApiRateLimits
from crewwork.api.replays import router as replays_router
from crewwork.api.repositories import router as repositories_router
from crewwork.api.service import WorkItemService
from crewwork.api.streams import router as events_router
from crewwork.api.webhooks import router as webhooks_router
from crewwork.api.work_items import router as work_items_router
from crewwork.boundary import hostproc
from crewwork.boundary.outbound import OutboundPolicy
from crewwork.config import Settings
from crewwork.config.api import ApiOptions
from crewwork.observability import tracing
from crewwork.observability.logs import configure_logging
from crewwork.observability.metrics import CONTENT_TYPE, HTTP_LATENCY, HTTP_REQUESTS, StoreProjections, render
from crewwork.store.errors import ErrorStore
from crewwork.store.forge import ForgeStore
from crewwork.store.outbox import OutboxStore
from crewwork.store.store import Store
from crewwork.temporal.client import connect
from crewwork.webhooks.deliver import DeliveryPolicy, OutboxDeliverer

log = logging.getLogger("crewwork.api")

MAX_BODY_BYTES = edge.MAX_BODY_BYTES
STATIC_DIR = Path(__file__).parent / "static"


class Extension(Protocol):
    """A front end served by the API process next to the API: its routes, and what runs while the app serves."""

    def routes(self) -> Sequence[BaseRoute]: ...

    def running(self) -> AbstractAsyncContextManager[None]: ...


class GuardAndMeasure:
    """Refuses what no route may read (a malformed Host, an oversized, chunked or NUL-carrying request: crewwork.api.edge,
    each charged to the client's address) before any route runs, and
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
        refused = edge.refusal(scope)
        if refused is not None:
            await edge.refuse(scope, receive, send, refused)
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


def create_app(
    settings: Settings,
    *,
    store: Store | None = None,
    options: ApiOptions | None = None,
    extensions: Sequence[Callable[[Settings, Callable[[], ApiState]], Extension]] = (),
) -> FastAPI:
    """The API app. `extensions`: front ends to mount, each made from the settings and a reader of the app's state
    (`ApiState`: the store, the service and the rate limits, once the app runs)."""
    options = options or settings.api

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.log_format == "json":
            configure_logging(settings.log_level, json_logs=True)
        # The bounds of every git process and parse this process starts on tenant input (docs/bounds.md).
        hostproc.configure_from(settings)
        own_store = store is None
        running_store = store or Store(
            settings.resolved_database_url(),
            pool_size=settings.db_pool_size,
            server_writes=settings.store_server_writes,
            driver_writes=settings.store_driver_writes,
        )
        outbox = OutboxStore(running_store)
        projections = StoreProjections(running_store, settings.metrics_store_refresh_s)
        state = ApiState(
            settings=settings,
            options=options,
            store=running_store,
            outbox=outbox,
            service=WorkItemService(running_store, None, settings),
            rate_limits=ApiRateLimits(
                running_store,
                key_rate_per_s=options.api_rate_per_s,
                key_burst=options.api_rate_burst,
                auth_failure_rate_per_s=settings.api_auth_failure_rate_per_s,
                auth_failure_burst=settings.api_auth_failure_burst,
            ),
            horizon=EventHorizon(running_store, poll_s=options.sse_poll_s),
            projections=projections,
            projections_registry=CollectorRegistry(auto_describe=True),
        )
        state.projections_registry.register(projections)
        if options.webhook_delivery:
            state.deliverer = OutboxDeliverer(
                outbox,
                DeliveryPolicy(
                    max_attempts=options.webhook_max_attempts,
                    backoff_s=options.webhook_backoff_s,
                    max_backoff_s=options.webhook_max_backoff_s,
                ),
                OutboundPolicy.from_settings(settings),
            )
        if options.forge_intake:
            state.forge_intake = ForgeIntake(
                ForgeStore(running_store),
                state.service,
                settings,
                max_attempts=options.forge_intake_max_attempts,
                poll_interval_s=options.forge_poll_interval_s,
                poll_lookback_s=options.forge_poll_lookback_s,
                progress_poll_s=options.forge_progress_poll_s,
                delivery_retention_s=options.forge_delivery_retention_s,
            )
        if options.errors_intake:
            state.errors_intake = ErrorIntake(
                ErrorStore(running_store), state.service, max_attempts=options.errors_intake_max_attempts
            )
        setattr(app.state, STATE_KEY, state)
        await state.horizon.start()
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_connect_forever(state.service, settings))]
        if state.deliverer is not None:
            tasks.append(asyncio.create_task(state.deliverer.run(stop)))
        if state.forge_intake is not None:
            tasks.append(asyncio.create_task(state.forge_intake.run(stop)))
        if state.errors_intake is not None:
            tasks.append(asyncio.create_task(state.errors_intake.run(stop)))
        try:
            async with contextlib.AsyncExitStack() as running:
                for extension in mounted:
                    await running.enter_async_context(extension.running())
                yield
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await state.horizon.stop()
            if own_store:
                await running_store.close()

    app = FastAPI(
        title="crewwork",
        version=__version__,
        description="A durable runtime for AI agent work, built on Temporal. Submit work items, follow them live, "
        "review their changes. Errors are `application/problem+json` with a stable machine-readable `code`. "
        "Authenticate with `Authorization: Bearer <API key>`; requests are rate limited per key (429 with "
        "Retry-After), shared by all API processes; failed authentications are rate limited per client address.",
        lifespan=lifespan,
    )
    app.add_exception_handler(problems.ProblemError, problems.problem_handler)
    app.add_exception_handler(RequestValidationError, problems.validation_handler)
    app.add_exception_handler(StarletteHTTPException, problems.http_handler)
    app.add_exception_handler(ClientDisconnect, problems.disconnect_handler)
    app.add_exception_handler(Exception, problems.unhandled_handler)
    app.include_router(work_items_router)
    app.include_router(changes_router)
    app.include_router(hotfix_router)
    app.include_router(holds_router)
    app.include_router(repositories_router)
    app.include_router(forge_router)
    app.include_router(forge_webhook_router)
    app.include_router(errors_router)
    app.include_router(sentry_router)
    app.include_router(otlp_router)
    app.include_router(events_router)
    app.include_router(webhooks_router)
    app.include_router(admin_router)
    app.include_router(evidence_router)
    app.include_router(replays_router)
    mounted = [make(settings, lambda: api_state(app)) for make in extensions]
    for extension in mounted:
        app.router.routes.extend(extension.routes())

    app.add_middleware(GuardAndMeasure)

    @app.get(
        "/healthz",
        tags=["health"],
        summary="Readiness: 200 when the database and Temporal are reachable, 503 otherwise",
        responses={503: {"description": "Not ready: the body says which dependency is down"}},
    )
    async def healthz() -> Response:
        state = api_state(app)
        db_ok = True
        try:
            await state.store.db_now()
        except Exception:
            db_ok = False
        temporal_ok = state.service.client is not None
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
        state = api_state(app)
        await state.projections.refresh()
        return Response(render() + render(state.projections_registry), media_type=CONTENT_TYPE)

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


async def _connect_forever(service: WorkItemService, settings: Settings) -> None:
    """Connect to Temporal in the background, so the API starts (and reports unready) while Temporal is down."""
    delay = 0.2
    while service.client is None:
        try:
            service.client = await connect(settings)
            log.info("connected to Temporal at %s", settings.temporal_address)
        except Exception as exc:
            log.warning("Temporal at %s not reachable yet: %s", settings.temporal_address, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
