"""A preview is untrusted code running for a while: each way it can misbehave is contained and becomes evidence,
and nothing of it is left afterwards. On every backend CI runs (bwrap, docker, gVisor)."""

from __future__ import annotations

import http.server
import resource
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from crewwork.models.preview import PreviewSpec
from crewwork.preview.verdict import grade_preview
from tests.preview.conftest import preview

SERVE = """
import http.server, os, sys
BODY = (sys.argv[1] if len(sys.argv) > 1 else "ok").encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", str(len(BODY))); self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""
PROBE = {"http": [{"name": "home", "path": "/", "expect": [{"contains": "ok"}]}]}


def _left_behind(tmp_path: Path, port: int | None) -> list[str]:
    """This test's preview sockets, relays (a runc container's processes show on the host) and containers."""
    import subprocess

    scratch = tmp_path / "scratch"
    found = [str(p) for p in scratch.rglob("*")] if scratch.exists() else []
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    found += [line for line in ps.splitlines() if f"/crewwork/preview/hub.sock {port} " in line]
    containers = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"volume={tmp_path / 'ws'}"], capture_output=True, text=True
    ).stdout.split()
    return found + [f"container {c}" for c in containers]


async def test_a_preview_that_hangs_is_not_ready_and_is_stopped(backend: str, tmp_path: Path) -> None:
    spec = {**PROBE, "ready": {"timeout_s": 4}}
    run, _ = await preview(backend, tmp_path, {"app.py": "import time\nprint('starting', flush=True)\ntime.sleep(3600)\n"},
                           {**spec, "start": {"command": ["python3", "app.py"]}})  # fmt: skip
    v = grade_preview(PreviewSpec.model_validate(spec), run.evidence)
    assert v.cause == "preview_not_ready", v.reason
    assert "starting" in run.evidence.log_tail
    assert not _left_behind(tmp_path, run.evidence.port)


async def test_a_crash_loop_is_contained_and_its_crashes_are_evidence(backend: str, tmp_path: Path) -> None:
    loop = "n=0; while true; do n=$((n+1)); echo \"crash $n\"; sh -c 'exit 3'; sleep 0.05; done"
    spec = {**PROBE, "ready": {"timeout_s": 4}, "start": {"command": ["sh", "-c", loop]}}
    run, _ = await preview(backend, tmp_path, {}, spec)
    v = grade_preview(PreviewSpec.model_validate(spec), run.evidence)
    assert v.cause == "preview_not_ready", v.reason
    assert "crash 3" in run.evidence.log_tail
    assert not _left_behind(tmp_path, run.evidence.port)

    # An app that simply exits is a crash, with its output as the reason.
    spec = {
        **PROBE,
        "start": {"command": ["python3", "-c", "import sys; print('ImportError: no module named shop'); sys.exit(1)"]},
    }
    run, _ = await preview(backend, tmp_path / "2", {}, spec)
    v = grade_preview(PreviewSpec.model_validate(spec), run.evidence)
    assert v.cause == "preview_crashed" and "ImportError: no module named shop" in v.reason
    assert run.evidence.run.exit_code == 1


@pytest.fixture
def host_api() -> Iterator[tuple[int, list[str]]]:
    """A service on the host's loopback, standing for the crewwork API: it records every connection it gets."""
    seen: list[str] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], seen
    server.shutdown()


async def test_a_preview_cannot_reach_the_hosts_postgresql_or_api(
    backend: str, tmp_path: Path, host_api: tuple[int, list[str]]
) -> None:
    api_port, seen = host_api
    with socket.create_connection(("127.0.0.1", 5432), timeout=5):
        pass  # PostgreSQL is there for the host
    reach = f"""
import socket
out = []
for port in (5432, {api_port}):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close(); out.append(f"{{port}}:CONNECTED")
    except OSError as e:
        out.append(f"{{port}}:refused({{type(e).__name__}})")
import os
out.append("sees:" + ",".join(sorted(os.listdir("/crewwork/preview"))))
open("reach.txt", "w").write(" ".join(out))
"""
    spec = {
        "start": {"command": ["sh", "-c", 'python3 reach.py && exec python3 serve.py "$(cat reach.txt)"']},
        "http": [{"name": "reach", "expect": [{"not_contains": "CONNECTED"}, {"contains": "5432:refused"}]}],
    }
    run, saved = await preview(backend, tmp_path, {"reach.py": reach, "serve.py": SERVE}, spec)
    v = grade_preview(PreviewSpec.model_validate(spec), run.evidence)
    assert v.passed, (v.reason, run.evidence.http)
    assert f"{api_port}:refused" in run.evidence.http[0].body
    # The app sees its side of the tunnel only: never the front door the probes and the browser use.
    assert "sees:hub.sock,relay.py" in run.evidence.http[0].body
    assert seen == [], "the host's service never saw the preview"
    assert "attempt-1-probe-http-reach.txt" in saved.artifacts


async def test_a_preview_that_floods_output_is_bounded(backend: str, tmp_path: Path) -> None:
    flood = (
        "import sys, threading\n"
        "def flood():\n"
        "    line = 'x' * 1023 + '\\n'\n"
        "    for _ in range(300_000):\n"
        "        sys.stdout.write(line)\n"
        "threading.Thread(target=flood, daemon=True).start()\n"
        "exec(open('serve.py').read())\n"
    )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    spec = {**PROBE, "start": {"command": ["python3", "flood.py"]}}
    run, saved = await preview(backend, tmp_path, {"flood.py": flood, "serve.py": SERVE}, spec, disk_mb=64)
    v = grade_preview(PreviewSpec.model_validate(spec), run.evidence)
    assert v.passed, v.reason
    log, _ = saved.artifacts["attempt-1-preview.log"]
    assert len(log) <= 4 * 1024 * 1024 and run.evidence.log_truncated
    assert len(run.evidence.log_tail) <= 16 * 1024
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 100 * 1024, "the worker kept no flood in memory"
    assert not (tmp_path / "ws" / ".crewwork" / "preview" / "app.log").stat().st_size > 4 * 1024 * 1024
