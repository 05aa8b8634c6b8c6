"""Readiness: /healthz answers 503 (with the reason) until the database and Temporal are both reachable."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import uvicorn

from crewwork.api.app import create_app
from crewwork.api.edge import uvicorn_proxy_options
from crewwork.config import Settings
from crewwork.store.db import upgrade
from crewwork.temporal.devserver import free_port
from tests.conftest import run_sync


def test_healthz_is_503_while_temporal_is_unreachable(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'health.db'}"
    run_sync(upgrade(url))
    settings = Settings(data_dir=tmp_path, database_url=url, temporal_address="127.0.0.1:9")
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            **uvicorn_proxy_options(settings.api_forwarded_allow_ips),
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        r = None
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert r is not None, "the API never answered"
        assert r.status_code == 503
        body = r.json()
        assert (body["ok"], body["database"], body["temporal"]) == (False, True, False)
    finally:
        server.should_exit = True
        thread.join(15)
