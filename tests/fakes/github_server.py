"""A real local HTTP server speaking the part of GitHub's REST API that opening pull requests uses.

    GET  /repos/{owner}/{repo}                      -> {"default_branch": ..., "full_name": ...}
    GET  /repos/{owner}/{repo}/pulls?head=o:b&state -> [pull requests whose head is b]
    POST /repos/{owner}/{repo}/pulls                -> 201 the new pull request; 422 when one exists for the head
                                                       or the head branch does not exist; 401 for a bad token

Like GitHub, it checks the bearer token, requires `title`, `head` and `base`, refuses a head branch the repository
does not have (asked through `branch_exists`, which a test points at its served bare repository), and answers in
GitHub's JSON shapes (`html_url`, `number`, `draft`, `head.ref`, `base.ref`; errors as `message` + `errors`).
Requests are recorded; `fail_next` queues error replies (e.g. a 502) to exercise retries.
"""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from crewwork.temporal.devserver import free_port


@dataclass
class ForgeRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    json: Any = None


@dataclass
class FakeGitHub:
    token: str
    branch_exists: Callable[[str, str, str], bool] = lambda owner, repo, branch: True
    default_branch: str = "main"
    port: int = field(default_factory=free_port)
    requests: list[ForgeRequest] = field(default_factory=list)
    pulls: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    _failures: deque[tuple[int, dict[str, Any]]] = field(default_factory=deque)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, status: int, message: str = "Server Error") -> None:
        self._failures.append((status, {"message": message}))

    def __enter__(self) -> FakeGitHub:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                parts = urlsplit(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    payload = json.loads(raw) if raw else None
                except ValueError:
                    return self._send(400, {"message": "Problems parsing JSON"})
                req = ForgeRequest(
                    self.command,
                    parts.path,
                    parse_qs(parts.query),
                    {k.lower(): v for k, v in self.headers.items()},
                    payload,
                )
                owner.requests.append(req)
                status, body = owner._route(req)
                self._send(status, body)

            do_GET = _handle
            do_POST = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _route(self, req: ForgeRequest) -> tuple[int, Any]:
        if req.headers.get("authorization") != f"Bearer {self.token}":
            return 401, {"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"}
        if self._failures:
            return self._failures.popleft()
        m = re.fullmatch(r"/repos/([^/]+)/([^/]+)(/pulls)?", req.path)
        if not m:
            return 404, {"message": "Not Found"}
        repo_key = (m.group(1), m.group(2))
        if m.group(3) is None:
            if req.method != "GET":
                return 404, {"message": "Not Found"}
            return 200, {"full_name": "/".join(repo_key), "default_branch": self.default_branch}
        with self._lock:
            pulls = self.pulls.setdefault(repo_key, [])
            if req.method == "GET":
                head = (req.query.get("head") or [""])[0]
                want = head.split(":", 1)[1] if ":" in head else head
                return 200, [p for p in pulls if not want or p["head"]["ref"] == want]
            body = req.json if isinstance(req.json, dict) else {}
            missing = [k for k in ("title", "head", "base") if not body.get(k)]
            if missing:
                return 422, {
                    "message": "Validation Failed",
                    "errors": [{"resource": "PullRequest", "field": f, "code": "missing_field"} for f in missing],
                }
            head = str(body["head"]).split(":")[-1]
            if not self.branch_exists(*repo_key, head):
                return 422, {
                    "message": "Validation Failed",
                    "errors": [{"resource": "PullRequest", "field": "head", "code": "invalid"}],
                }
            if any(p["head"]["ref"] == head and p["state"] == "open" for p in pulls):
                return 422, {
                    "message": "Validation Failed",
                    "errors": [
                        {
                            "resource": "PullRequest",
                            "code": "custom",
                            "message": f"A pull request already exists for {repo_key[0]}:{head}.",
                        }
                    ],
                }
            number = sum(len(v) for v in self.pulls.values()) + 1
            pr = {
                "number": number,
                "state": "open",
                "title": body["title"],
                "body": body.get("body") or "",
                "draft": bool(body.get("draft")),
                "html_url": f"{self.api_url}/{repo_key[0]}/{repo_key[1]}/pull/{number}",
                "url": f"{self.api_url}/repos/{repo_key[0]}/{repo_key[1]}/pulls/{number}",
                "head": {"ref": head, "label": f"{repo_key[0]}:{head}"},
                "base": {"ref": body["base"]},
            }
            pulls.append(pr)
            return 201, pr
