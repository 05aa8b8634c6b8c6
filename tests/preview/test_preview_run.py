"""`run_preview` on one backend (what differs between backends is covered by test_containment.py and
test_repair.py): readiness by a log line, a request as declared (method, headers, JSON body), a redirect answered but
never followed, and nothing to start."""

from __future__ import annotations

from pathlib import Path

from crewwork.models.preview import PreviewSpec
from crewwork.preview.verdict import grade_preview
from tests.preview.conftest import preview, require

ECHO = """
import http.server, json, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.dumps({"method": self.command, "path": self.path, "x": self.headers.get("X-Probe"),
                           "ct": self.headers.get("Content-Type"), "body": self.rfile.read(n).decode()}).encode()
        if self.path == "/moved":
            self.send_response(302); self.send_header("Location", "http://169.254.169.254/"); self.end_headers()
            return
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = _answer
    def log_message(self, *a):
        pass
print("warming up", flush=True)
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H)
print("READY on port", os.environ["PORT"], flush=True)
server.serve_forever()
"""


async def test_a_request_as_declared_and_readiness_by_a_log_line(tmp_path: Path) -> None:
    backend = require("bwrap")
    spec = {
        "start": {"command": ["python3", "echo.py"]},
        "ready": {"log": "^READY on port \\d+$"},
        "http": [
            {
                "name": "post",
                "method": "POST",
                "path": "/items?x=1",
                "headers": {"X-Probe": "yes"},
                "json": {"a": [1, 2]},
                "expect": [
                    {"json_path": "$.method", "equals": "POST"},
                    {"json_path": "$.x", "equals": "yes"},
                    {"json_path": "$.ct", "equals": "application/json"},
                    {"contains": '\\"a\\": [1, 2]'},
                ],
            },
            {"name": "moved", "path": "/moved", "status": 302},
        ],
    }
    run, saved = await preview(backend, tmp_path, {"echo.py": ECHO}, spec)
    v = grade_preview(PreviewSpec.model_validate(spec), run.evidence)
    assert v.passed, (v.reason, run.evidence.http)
    assert run.evidence.ready and run.evidence.ready_after_s is not None
    moved = run.evidence.http[1]
    assert moved.status == 302 and ("location", "http://169.254.169.254/") in moved.response_headers
    transcript, _ = saved.artifacts["attempt-1-probe-http-post.txt"]
    assert transcript.startswith(b"> POST /items?x=1 HTTP/1.1\n> X-Probe: yes") and b"< HTTP 200" in transcript


async def test_nothing_to_start_is_evidence_not_an_error(tmp_path: Path) -> None:
    backend = require("bwrap")
    spec = {"http": [{"name": "home"}]}
    run, _ = await preview(backend, tmp_path, {"README.md": "no app here\n"}, spec)
    v = grade_preview(PreviewSpec.model_validate(spec), run.evidence)
    assert v.cause == "preview_not_started" and "validation.preview.start.command" in v.reason
