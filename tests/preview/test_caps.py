"""A preview app that hits a cap ends as `preview_limit` naming the cap, on every backend CI runs (bwrap, docker,
gVisor): memory, processes, its lifetime (wall clock) and disk. Its output cap is tests/preview/test_containment.py's
flood test; the plain sandbox's caps are tests/sandbox/test_sandbox_isolation.py's."""

from __future__ import annotations

import os
from pathlib import Path

from crewwork.config.sandbox import SandboxSettings
from crewwork.models.preview import PreviewSpec
from crewwork.preview.verdict import grade_preview
from crewwork.sandbox.disk import WorkspaceDisk
from tests.preview.conftest import preview

# Serves "ok", and on /eat, /fork or /fill spends the resource the cap bounds (from a request, as a real app would).
APP = r"""
import http.server, os, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/eat":
            hog = []
            while True:
                hog.append(b"x" * (8 << 20))
        if self.path == "/fork":
            while True:
                try:
                    if os.fork() == 0:
                        time.sleep(600)
                        os._exit(0)
                except OSError:
                    time.sleep(0.001)
        if self.path == "/fill":
            with open("filler", "wb") as f:
                while True:
                    try:
                        f.write(b"\0" * (1 << 20))
                        f.flush()
                    except OSError:
                        time.sleep(0.05)
        if self.path == "/slow":
            time.sleep(600)
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


def _spec(path: str, timeout_s: int = 30, **more: object) -> dict[str, object]:
    # The spending probe is the last: the app's end must be evidence even when nothing is asked of it afterwards.
    probes = [{"name": "before", "path": "/"}, {"name": "spend", "path": path, "timeout_s": timeout_s}]
    return {"start": {"command": ["python3", "app.py"]}, "http": probes, **more}


async def _cause(backend: str, tmp_path: Path, spec: dict[str, object], **limits: object) -> tuple[str, str]:
    run, _ = await preview(backend, tmp_path, {"app.py": APP}, spec, **limits)
    v = grade_preview(PreviewSpec.model_validate(spec), run.evidence)
    return v.cause, v.reason


async def test_an_app_that_eats_memory_ends_by_its_memory_cap(backend: str, tmp_path: Path) -> None:
    cause, reason = await _cause(backend, tmp_path, _spec("/eat"), memory_mb=256)
    assert (cause, "memory cap" in reason) == ("preview_limit", True), reason


async def test_a_fork_bomb_ends_by_its_process_cap(backend: str, tmp_path: Path) -> None:
    # Under gVisor the cap counts threads (the relay's among them) as well as processes: read from its task list.
    cause, reason = await _cause(backend, tmp_path, _spec("/fork", timeout_s=15), pids=48, memory_mb=1024)
    assert (cause, "process cap" in reason) == ("preview_limit", True), reason


async def test_a_fork_bomb_that_never_becomes_ready_ends_by_its_process_cap(backend: str, tmp_path: Path) -> None:
    bomb = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n"
    spec = {"start": {"command": ["python3", "-c", bomb]}, "ready": {"timeout_s": 10}, "http": [{"name": "home"}]}
    run, _ = await preview(backend, tmp_path, {}, spec, pids=48, memory_mb=1024)
    v = grade_preview(PreviewSpec.model_validate(spec), run.evidence)
    assert (v.cause, "process cap" in v.reason) == ("preview_limit", True), (v.reason, run.evidence.run)


async def test_an_app_outliving_its_lifetime_ends_by_its_wall_clock(backend: str, tmp_path: Path) -> None:
    cause, reason = await _cause(backend, tmp_path, _spec("/slow", timeout_s=60, lifetime_s=8))
    assert (cause, "lifetime" in reason) == ("preview_limit", True), reason


async def test_an_app_that_fills_its_disk_ends_by_its_disk_cap(backend: str, tmp_path: Path) -> None:
    # The workspace is its own small file system, as the validation step gives it (crewwork/sandbox/disk.py).
    owner = SandboxSettings().owner() or (os.geteuid(), os.getegid())
    disk = await WorkspaceDisk.create(tmp_path / "ws.img", tmp_path / "ws", 32, owner)
    try:
        cause, reason = await _cause(backend, tmp_path, _spec("/fill", timeout_s=20), disk_mb=32)
    finally:
        await disk.remove()
    assert (cause, "disk cap" in reason) == ("preview_limit", True), reason
