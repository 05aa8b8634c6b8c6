"""How long the API takes to stop while a console holds a live event stream: `crewwork api`'s server (`ApiServer`,
which ends open streams first with a resumable close) side by side with plain uvicorn (which waits on them).

A SQLite store and no Temporal (the API starts and reports unready; the stream needs neither). For each server,
`ROUNDS` times: start it, open `/v1/events/stream` and read until it is live, ask the server to exit, and time until
its thread has ended. Plain uvicorn gets a graceful-shutdown timeout of `GRACE_S` (uvicorn's default is none: it would
wait for as long as the client keeps the stream open), so its figure is that bound.

    .venv/bin/python bench/sse_shutdown.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvicorn

from crewwork.cli.serve import ApiServer, api_app
from crewwork.config import Settings
from crewwork.store.db import upgrade_sync
from crewwork.temporal.devserver import free_port

ROUNDS = 3
GRACE_S = 10.0


def one_stop(settings: Settings, key: str, drain: bool) -> float:
    port = free_port()
    app = api_app(settings)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", timeout_graceful_shutdown=GRACE_S)
    server: uvicorn.Server = ApiServer(config, app) if drain else uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    live = threading.Event()

    def listen() -> None:
        headers = {"Authorization": f"Bearer {key}", "Accept": "text/event-stream"}
        try:
            with httpx.stream("GET", f"{url}/v1/events/stream?tail=true", headers=headers, timeout=60) as r:
                for _ in r.iter_lines():
                    live.set()
        except httpx.HTTPError:
            pass

    reader = threading.Thread(target=listen, daemon=True)
    reader.start()
    live.wait(30)
    t0 = time.perf_counter()
    server.should_exit = True
    thread.join(GRACE_S + 30)
    return time.perf_counter() - t0


def main() -> None:
    import asyncio

    from crewwork.store.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite+aiosqlite:///{tmp}/bench.db"
        upgrade_sync(db)
        settings = Settings(data_dir=Path(tmp), database_url=db, temporal_address=f"127.0.0.1:{free_port()}")
        # No MCP endpoint: bench/mcp.py, beside this script, would shadow the `mcp` package.
        settings = settings.model_copy(update={"mcp": settings.mcp.model_copy(update={"enabled": False})})

        async def key() -> str:
            store = Store(db)
            try:
                return (await store.create_api_key("bench"))[1]
            finally:
                await store.close()

        api_key = asyncio.run(key())
        figures = {"ApiServer": [], "uvicorn": []}  # type: dict[str, list[float]]
        for _ in range(ROUNDS):
            figures["ApiServer"].append(one_stop(settings, api_key, drain=True))
            figures["uvicorn"].append(one_stop(settings, api_key, drain=False))
    drain, plain = statistics.median(figures["ApiServer"]), statistics.median(figures["uvicorn"])
    print(f"stop with one open event stream, median of {ROUNDS} (s):")
    print(f"  ApiServer (crewwork api)              {drain:7.3f}   {[round(x, 3) for x in figures['ApiServer']]}")
    print(
        f"  uvicorn, graceful timeout {GRACE_S:.0f} s       {plain:7.3f}   {[round(x, 3) for x in figures['uvicorn']]}"
    )
    print(f"  ratio uvicorn / ApiServer             {plain / drain:7.1f}x")


if __name__ == "__main__":
    main()
