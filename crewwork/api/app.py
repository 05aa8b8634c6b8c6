"""The FastAPI application: the workflow-start API (OpenAPI at /openapi.json) and health."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from crewwork import __version__
from crewwork.api import problems
from crewwork.api.work_items import router as work_items_router
from crewwork.config import Settings, get_settings
from crewwork.service import WorkItemService
from crewwork.store.store import Store
from crewwork.temporal.client import connect

log = logging.getLogger("crewwork.api")

MAX_BODY_BYTES = 1024 * 1024


def create_app(settings: Settings | None = None, *, store: Store | None = None) -> FastAPI:
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_store = store is None
        app.state.store = store or Store(settings.resolved_database_url(), pool_size=settings.db_pool_size)
        app.state.settings = settings
        app.state.service = WorkItemService(app.state.store, None, settings)
        connector = asyncio.create_task(_connect_forever(app, settings))
        try:
            yield
        finally:
            connector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await connector
            if own_store:
                await app.state.store.close()

    app = FastAPI(
        title="crewwork",
        version=__version__,
        description="A durable runtime for AI agent work, built on Temporal. Submit work items, follow them, "
        "review their changes.",
        lifespan=lifespan,
    )
    app.add_exception_handler(problems.ProblemError, problems.problem_handler)
    app.add_exception_handler(RequestValidationError, problems.validation_handler)
    app.add_exception_handler(StarletteHTTPException, problems.http_handler)
    app.add_exception_handler(Exception, problems.unhandled_handler)
    app.include_router(work_items_router)

    @app.middleware("http")
    async def limit_body(request, call_next):  # type: ignore[no-untyped-def]
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return problems.problem_response(
                problems.ProblemError(413, "payload_too_large", f"request bodies are limited to {MAX_BODY_BYTES} bytes")
            )
        return await call_next(request)

    @app.get("/healthz", tags=["health"], summary="Liveness and readiness")
    async def healthz() -> dict[str, object]:
        db_ok = True
        try:
            await app.state.store.db_now()
        except Exception:
            db_ok = False
        temporal_ok = app.state.service.client is not None
        return {
            "ok": db_ok and temporal_ok,
            "database": db_ok,
            "temporal": temporal_ok,
            "version": __version__,
        }

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
