"""A preview's app cannot exhaust the validate worker's descriptors through its tunnel: every kind of connection it can
open to the host is capped per preview (crewwork/preview/tunnel.py), and another preview on the same worker is still
served meanwhile. On every backend CI runs (bwrap, docker, gVisor)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from crewwork.models.preview import PreviewSpec
from crewwork.preview.tunnel import ACCEPT_BACKLOG, MAX_FRONT, MAX_HUB_PENDING, MAX_IDLE_TUNNELS
from crewwork.preview.verdict import grade_preview
from tests.preview.conftest import preview

# Eight processes, each opening as many connections to the host's hub socket as it can and holding them: half say
# nothing (unfinished), half say hello and then nothing (idle tunnels that never answer).
FLOOD = """
import os, socket, sys, time
held = []
for worker in range(8):
    if os.fork() == 0:
        for i in range(700):
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect("/crewwork/preview/hub.sock")
                if i % 2:
                    s.sendall(b"CW1\\n")
                held.append(s)
            except OSError:
                time.sleep(0.01)
        print("worker", worker, "holds", len(held), flush=True)
        time.sleep(3600)
print("flooding", flush=True)
time.sleep(3600)
"""
SERVE = """
import http.server, os, time
time.sleep(2)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_thousands_of_tunnel_connections_cost_the_worker_at_most_the_caps(backend: str, tmp_path: Path) -> None:
    flood_spec = {
        "start": {"command": ["python3", "flood.py"]},
        # Ready once a flooding process says it holds its connections (on a loaded machine, under gVisor, that took
        # longer than a fixed 12 s): the test is about the flood's cost, whatever the machine's speed.
        "ready": {"log": "holds", "timeout_s": 180},
        "http": [{"name": "home", "path": "/"}],
    }
    normal_spec = {"start": {"command": ["python3", "serve.py"]}, "http": [{"name": "home", "path": "/"}]}
    baseline = _fds()
    peak = baseline
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _fds())
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        (flood, _), (normal, _) = await asyncio.gather(
            preview(backend, tmp_path / "flood", {"flood.py": FLOOD}, flood_spec, pids=64),
            preview(backend, tmp_path / "normal", {"serve.py": SERVE}, normal_spec),
        )
    finally:
        done.set()
        await sampler
    assert "holds" in flood.evidence.log_tail, flood.evidence.log_tail  # the flood did open its connections
    # Two previews, each: its pending and idle hub connections, its front door's connections, a batch of accepted
    # connections per socket not closed yet; and the sandboxes' own pipes and files.
    bound = 2 * (MAX_HUB_PENDING + MAX_IDLE_TUNNELS + 2 * MAX_FRONT + 2 * ACCEPT_BACKLOG) + 64
    assert peak - baseline <= bound, f"the worker held {peak - baseline} more descriptors (cap {bound})"
    v = grade_preview(PreviewSpec.model_validate(normal_spec), normal.evidence)
    assert v.passed, v.reason
