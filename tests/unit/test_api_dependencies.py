"""Every dependency and route of the API is a coroutine function: FastAPI runs a plain `def` one in a worker thread,
a thread hop on every request that uses it (three such dependencies once cost ~10% of the API's busy samples under
load). A blocking call belongs in `asyncio.to_thread` inside an `async def`, where it is visible."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from crewwork.cli.serve import api_app
from crewwork.config import Settings


def _calls(dep: Dependant) -> Iterator[Any]:
    if dep.call is not None:
        yield dep.call
    for sub in dep.dependencies:
        yield from _calls(sub)


def _api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    for r in routes:
        if isinstance(r, APIRoute):
            yield r
        inner = getattr(r, "original_router", None) or getattr(r, "app", None)  # included routers, mounts
        if inner is not None and isinstance(getattr(inner, "routes", None), list):
            yield from _api_routes(inner.routes)


def _runs_in_a_thread(call: Any) -> bool:
    if inspect.isroutine(call):
        return not inspect.iscoroutinefunction(call)
    # A callable instance (HTTPBearer and the like): FastAPI looks at its __call__.
    return not inspect.iscoroutinefunction(type(call).__call__)


def test_no_route_or_dependency_of_the_api_runs_in_a_worker_thread(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    settings.mcp.enabled = True  # the MCP endpoint's routes too
    app = api_app(settings)
    routes = list(_api_routes(app.routes))
    assert len(routes) > 20, [r.path for r in routes]
    threaded = sorted(
        {
            f"{route.path}: {getattr(call, '__qualname__', type(call).__qualname__)}"
            for route in routes
            for call in _calls(route.dependant)
            if _runs_in_a_thread(call)
        }
    )
    assert threaded == [], threaded
