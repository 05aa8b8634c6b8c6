"""The API while its PostgreSQL is down: a clear 503 `store_unavailable` with Retry-After (nothing was done, the
client may retry), never a 500, and normal answers again once the server is back. Real server, really stopped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from crewwork.store.db import upgrade
from crewwork.store.store import Store
from crewwork.temporal.devserver import DevServer
from tests.api.conftest import LiveApi
from tests.conftest import make_settings
from tests.soak import privatepg

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


def test_a_stopped_database_is_a_503_and_the_api_recovers(tmp_path: Path, temporal_server: DevServer) -> None:
    ok, why = privatepg.available()
    if not ok:
        pytest.skip(why)
    with privatepg.private_postgres() as pg:
        asyncio.run(upgrade(pg.url))

        async def key() -> str:
            store = Store(pg.url)
            try:
                return (await store.create_api_key("outage", ()))[1]
            finally:
                await store.close()

        api_key = asyncio.run(key())
        api = LiveApi(make_settings(tmp_path, temporal_server, pg.url)).start()
        headers = {"Authorization": f"Bearer {api_key}"}
        try:
            assert httpx.get(f"{api.url}/v1/work-items", headers=headers, timeout=10).status_code == 200
            pg.stop("immediate")
            r = httpx.get(f"{api.url}/v1/work-items", headers=headers, timeout=30)
            assert r.status_code == 503, r.text
            assert r.json()["code"] == "store_unavailable" and r.headers.get("Retry-After")
            pg.start()
            for _ in range(50):  # the pool drops its dead connections on first use
                r = httpx.get(f"{api.url}/v1/work-items", headers=headers, timeout=10)
                if r.status_code == 200:
                    break
            assert r.status_code == 200, r.text
        finally:
            api.stop()
