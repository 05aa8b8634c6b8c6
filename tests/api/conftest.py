"""Fixtures for the API tests: the real API (uvicorn, restartable on the same port) over real PostgreSQL and a
real Temporal dev server with in-process worker pools, plus API keys for two tenants and an operator.

One crew (three worker pools) and one API serve every test of a module (`api_crew`, `shared_api`): starting and
stopping them for each test cost about a second of every API test. What a test sees of them is its own: `stack` gives
each test fresh tenants (their own keys, items, webhooks, repositories), and the store and Temporal server were
already one per pytest session. A test that needs the API configured otherwise starts its own `LiveApi` on the
module's crew; a test that stops or restarts the shared API leaves it to `stack`, which starts it again for the next
test if it is down."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from crewwork.config import Settings
from crewwork.config.api import ApiOptions
from crewwork.temporal.devserver import DevServer, free_port
from tests.conftest import Crew, make_settings, running_crew


class LiveApi:
    """The real API app served by uvicorn in a thread. `restart()` stops it and starts a fresh app on the same
    port (a new process state: new event horizon, new buckets), like an API process restart."""

    def __init__(self, settings: Settings, options: ApiOptions | None = None, port: int | None = None) -> None:
        self.settings = settings
        self.options = options or ApiOptions(api_rate_per_s=1000, api_rate_burst=1000, webhook_backoff_s=0.2)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> LiveApi:
        import uvicorn

        from crewwork.api.edge import uvicorn_proxy_options
        from crewwork.cli.serve import ApiServer, api_app

        app = api_app(self.settings, options=self.options)
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            **uvicorn_proxy_options(self.settings.api_forwarded_allow_ips),
            timeout_graceful_shutdown=3,
        )
        # What `crewwork api` runs: a shutdown ends the open event streams first (a resumable close).
        self._server = ApiServer(config, app)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).json().get("ok"):
                    return self
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError("API did not become ready")

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(15)
        self._server = self._thread = None

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


@dataclass
class Tenant:
    name: str
    key: str
    key_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@dataclass
class Stack:
    crew: Crew
    api: LiveApi
    alpha: Tenant
    beta: Tenant
    admin: Tenant

    def client(self, who: Tenant | None = None, **kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.api.url, headers=(who or self.alpha).headers, timeout=30, **kw)


async def make_tenant(crew: Crew, prefix: str, scopes: tuple[str, ...] = ()) -> Tenant:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kid, key = await crew.store.create_api_key(name, scopes)
    return Tenant(name, key, kid)


@pytest.fixture(scope="module")
def api_settings(
    tmp_path_factory: pytest.TempPathFactory, temporal_server: DevServer, pg_url: str, sandbox_backend: str
) -> Settings:
    """The settings of the module's crew and API (one data directory and task queue prefix per module).

    metrics_store_refresh_s=0: a scrape right after a change must see it (the interval is tested on its own)."""
    return make_settings(
        tmp_path_factory.mktemp("api"),
        temporal_server,
        pg_url,
        sandbox_backend=sandbox_backend,
        metrics_store_refresh_s=0,
    )


@pytest.fixture(scope="module")
async def api_crew(api_settings: Settings) -> AsyncIterator[Crew]:
    """The module's crew: control, agent and validate pools on the module's task queues."""
    async with running_crew(api_settings) as crew:
        yield crew


@pytest.fixture(scope="module")
def shared_api(api_settings: Settings, api_crew: Crew) -> Iterator[LiveApi]:
    """The module's API (it stops before the crew does)."""
    api = LiveApi(api_settings).start()
    yield api
    api.stop()


@pytest.fixture
async def stack(api_crew: Crew, shared_api: LiveApi) -> Stack:
    """The module's crew and API with tenants of this test's own; the crew submits as a tenant of its own too."""
    if not shared_api.running:  # an earlier test stopped it and did not get to start it again
        shared_api.start()
    crew = await api_crew.with_new_tenant()
    alpha = await make_tenant(crew, "alpha")
    beta = await make_tenant(crew, "beta")
    admin = await make_tenant(crew, "ops", ("admin",))
    return Stack(crew, shared_api, alpha, beta, admin)


def task_item(output: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "task",
        "input": {},
        "agent": {"name": "scripted", "config": {"output": output or {}}},
    }
    body.update(kw)
    return body


async def wait_state(client: httpx.AsyncClient, wid: str, states: set[str], timeout_s: float = 60) -> dict[str, Any]:
    import asyncio

    deadline = time.monotonic() + timeout_s
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = (await client.get(f"/v1/work-items/{wid}", params={"live": "false"})).json()
        if body.get("state") in states:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"{wid} never reached {states}: {body.get('state')}")


@pytest.fixture
def artifacts_dir() -> Iterator[Path]:
    d = Path(__file__).resolve().parents[2] / "test-artifacts"
    d.mkdir(exist_ok=True)
    yield d
