"""The event loop the long-running processes run on (CREWWORK_EVENT_LOOP, crewwork/cli/eventloop.py): uvloop by default
(with httptools parsing the API's HTTP), the standard loop when asked; read from the process's own memory map, so
it is what the process really loaded, not what a setting says."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from crewwork.cli import eventloop
from crewwork.cli.stack import ManagedProcess
from crewwork.config import Settings
from tests.conftest import api_process, make_settings
from tests.deploy.procs import PoolProcesses, pool_env


def _mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_the_setting_chooses_the_loop_and_the_http_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvloop

    auto = Settings(event_loop="auto")
    assert eventloop.loop_factory(auto) is uvloop.new_event_loop
    assert eventloop.uvicorn_options(auto) == ("uvloop", "httptools")
    plain = Settings(event_loop="asyncio")
    assert eventloop.loop_factory(plain) is None
    assert eventloop.uvicorn_options(plain) == ("asyncio", "h11")
    assert eventloop.run(_loop_name(), auto) == "uvloop.Loop"
    assert eventloop.run(_loop_name(), plain) == "asyncio.unix_events._UnixSelectorEventLoop"
    # Without uvloop installed: `auto` falls back to the standard loop; an explicit `uvloop` says what to do.
    monkeypatch.setitem(sys.modules, "uvloop", None)
    assert eventloop.loop_factory(auto) is None
    with pytest.raises(RuntimeError, match="CREWWORK_EVENT_LOOP=asyncio"):
        eventloop.loop_factory(Settings(event_loop="uvloop"))


async def _loop_name() -> str:
    import asyncio

    loop = asyncio.get_running_loop()
    return f"{type(loop).__module__}.{type(loop).__qualname__}"


@pytest.mark.postgres
@pytest.mark.temporal
def test_a_pool_process_runs_on_the_loop_it_is_told(tmp_path: Path, temporal_server: Any, pg_url: str) -> None:
    settings = make_settings(tmp_path, temporal_server, pg_url)
    procs = PoolProcesses(settings, tmp_path / "logs")
    plain = ManagedProcess(
        "control-plain",
        [sys.executable, "-m", "crewwork", "worker", "--pool", "control"],
        {**pool_env(settings), "CREWWORK_EVENT_LOOP": "asyncio"},
        tmp_path / "logs" / "control-plain.log",
    )
    try:
        [default] = procs.start("control")
        plain.start()
        procs.procs.append(plain)
        procs.wait_polling(plain)
        assert default.proc is not None and plain.proc is not None
        assert "uvloop" in _mapped(default.proc.pid), "the default pool process did not load uvloop"
        assert "uvloop" not in _mapped(plain.proc.pid), "CREWWORK_EVENT_LOOP=asyncio still loaded uvloop"
    finally:
        procs.stop_all()


def test_the_api_process_parses_http_with_httptools_on_uvloop(tmp_path: Path) -> None:
    with api_process(tmp_path) as (proc, port, log):
        # Requests go through the C parser: a plain one, and one it must refuse (a header with no name).
        r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
        assert r.status_code in (200, 503), r.text
        maps = _mapped(proc.pid)
        assert "uvloop" in maps and "httptools" in maps, "the API did not load uvloop and httptools"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n: nameless\r\n\r\n")
            assert s.recv(200).startswith(b"HTTP/1.1 400"), "a malformed request was not refused"
        assert proc.poll() is None, log.read_text()
