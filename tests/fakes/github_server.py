"""A real local HTTP server speaking the part of GitHub's REST API that opening pull requests uses.

    GET  /repos/{owner}/{repo}                      -> {"default_branch": ..., "full_name": ...}
    GET  /repos/{owner}/{repo}/pulls?head=o:b&state -> [pull requests whose head is b]
    POST /repos/{owner}/{repo}/pulls                -> 201 the new pull request; 422 when one exists for the head
                                                       or the head branch does not exist; 401 for a bad token
    GET  /repos/{owner}/{repo}/collaborators/{username}/permission
                                                    -> the user's role (`permissions`; anyone else: read, as on
                                                       a public repository)
    POST /repos/{owner}/{repo}/issues/{issue_number}/comments
                                                    -> 201 the new comment (kept in `comments`)
    GET  /repos/{owner}/{repo}/issues/events        -> the issue events `label_issue` made, newest first
    GET  /repos/{owner}/{repo}/issues/comments      -> the comments `comment_on` made (`since`, newest first)
    GET  /repos/{owner}/{repo}/issues/{issue_number} -> an issue `open_issue` made
    PATCH /repos/{owner}/{repo}/issues/comments/{comment_id} -> the comment edited (its `edits` counted)
    PATCH /repos/{owner}/{repo}/pulls/{pull_number} -> the pull request's title and body replaced
    GET  /repos/{owner}/{repo}/pulls/{pull_number}/reviews -> the reviews `review` made
    GET  /repos/{owner}/{repo}/pulls/{pull_number}/reviews/{review_id}/comments -> a review's line comments
    GET  /repos/{owner}/{repo}/pulls/{pull_number}  -> the pull request, its `head.sha` from `branch_sha`

The intake's two operations are checked against GitHub's official OpenAPI description as they are served
(tests/fakes/github_openapi.py): each request crewwork sends and each answer given, built from GitHub's own
documented examples; a mismatch is kept in `openapi_errors`, which the tests assert empty.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from crewwork.temporal.devserver import free_port
from tests.fakes import github_openapi

INTAKE_TEMPLATES = {
    "/repos/{owner}/{repo}/collaborators/{username}/permission": "GET",
    "/repos/{owner}/{repo}/issues/{issue_number}/comments": "POST",
    "/repos/{owner}/{repo}/issues/events": "GET",
    "/repos/{owner}/{repo}/issues/comments": "GET",
    "/repos/{owner}/{repo}/issues/{issue_number}": "GET",
    "/repos/{owner}/{repo}/issues/comments/{comment_id}": "PATCH",
    "/repos/{owner}/{repo}/pulls/{pull_number}": "GET",
    "/repos/{owner}/{repo}/pulls/{pull_number}/reviews": "GET",
    "/repos/{owner}/{repo}/pulls/{pull_number}/reviews/{review_id}/comments": "GET",
    "/repos/{owner}/{repo}/pulls/{pull_number}/files": "GET",
}
REVIEWS = "/repos/{owner}/{repo}/pulls/{pull_number}/reviews"


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
    branch_sha: Callable[[str, str, str], str | None] = lambda owner, repo, branch: None
    """The commit a branch is at (a pull request's `head.sha`), asked of the test's served repository."""
    default_branch: str = "main"
    port: int = field(default_factory=free_port)
    requests: list[ForgeRequest] = field(default_factory=list)
    pulls: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    permissions: dict[str, str] = field(default_factory=dict)
    """login -> role_name (admin, maintain, write, triage, read)."""
    comments: list[dict[str, Any]] = field(default_factory=list)
    """Comments posted on issues: {"repo": "o/r", "issue": n, "body": ...}."""
    openapi_errors: list[str] = field(default_factory=list)
    issues: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    issue_events: list[dict[str, Any]] = field(default_factory=list)
    issue_comments: list[dict[str, Any]] = field(default_factory=list)
    reviews: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    """(repo, pull number) -> its reviews, as `review` made them (oldest first, as GitHub lists them)."""
    review_comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """review id -> its line comments."""
    pull_files: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    """(repo, pull number) -> its changed files as `GET …/pulls/{pull_number}/files` lists them (`set_diff`)."""
    posted_reviews: list[dict[str, Any]] = field(default_factory=list)
    """Reviews POSTed: {"repo", "pull", "id", "event", "body", "commit_id", "comments"}."""
    down: bool = False
    """Answer every request 503, as GitHub does in an outage."""
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
            do_PATCH = _handle

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
        if self.down:
            return 503, {"message": "Service Unavailable"}
        if self._failures:
            return self._failures.popleft()
        if req.method == "PATCH" and re.fullmatch(r"/repos/[^/]+/[^/]+/pulls/\d+", req.path):
            return self._update_pull(req)
        template = github_openapi.template_of(req.path, list(INTAKE_TEMPLATES))
        if template == REVIEWS and req.method == "POST":
            return self._create_review(req)
        if template is not None:
            return self._intake(req, template)
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
            return 201, self._new_pull(repo_key, number, head, body)

    def _new_pull(self, repo_key: tuple[str, str], number: int, head: str, body: dict[str, Any]) -> dict[str, Any]:
        pr = {
            "number": number,
            "state": "open",
            "title": body["title"],
            "body": body.get("body") or "",
            "draft": bool(body.get("draft")),
            "html_url": f"{self.api_url}/{repo_key[0]}/{repo_key[1]}/pull/{number}",
            "url": f"{self.api_url}/repos/{repo_key[0]}/{repo_key[1]}/pulls/{number}",
            "head": {"ref": head, "label": f"{repo_key[0]}:{head}", "repo": {"full_name": "/".join(repo_key)}},
            "base": {"ref": body["base"]},
            "user": {"login": "crewwork-bot"},
            "updated_at": "2099-01-01T00:00:00Z",
            "closed_at": None,
            "merged_at": None,
        }
        self.pulls.setdefault(repo_key, []).append(pr)
        return pr

    # ---------------------------------------------------------------- what happened on the forge (for polls)

    def open_issue(self, repo: str, number: int, title: str, body: str, author: str) -> dict[str, Any]:
        issue = github_openapi.example_response("GET", "/repos/{owner}/{repo}/issues/{issue_number}", 200)
        issue.update(number=number, title=title, body=body, pull_request=None)
        issue.pop("pull_request")
        issue["user"]["login"] = author
        issue["html_url"] = f"{self.api_url}/{repo}/issues/{number}"
        issue["url"] = f"{self.api_url}/repos/{repo}/issues/{number}"
        self.issues[(repo, number)] = issue
        return issue

    def label_issue(self, repo: str, number: int, label: str, actor: str, at: str) -> None:
        event = github_openapi.example_response("GET", "/repos/{owner}/{repo}/issues/events", 200)[0]
        event.update(id=len(self.issue_events) + 1, event="labeled", created_at=at, commit_id=None, commit_url=None)
        event["label"] = {"name": label, "color": "ededed"}
        event["actor"]["login"] = actor
        event["issue"] = json.loads(json.dumps(self.issues[(repo, number)]))
        self.issue_events.insert(0, event)

    def comment_on(self, repo: str, number: int, author: str, body: str, at: str) -> None:
        comment = github_openapi.example_response("GET", "/repos/{owner}/{repo}/issues/comments", 200)[0]
        comment.update(id=50_000 + len(self.issue_comments), body=body, created_at=at, updated_at=at)
        comment["user"]["login"] = author
        comment["issue_url"] = f"{self.api_url}/repos/{repo}/issues/{number}"
        self.issue_comments.insert(0, comment)

    def _update_pull(self, req: ForgeRequest) -> tuple[int, Any]:
        """`PATCH /repos/{owner}/{repo}/pulls/{pull_number}`: its title and body (checked against the description)."""
        template = "/repos/{owner}/{repo}/pulls/{pull_number}"
        self.openapi_errors += github_openapi.check_request("PATCH", template, req.json)
        _, _, owner, repo, _, number = req.path.split("/")
        with self._lock:
            found = [p for p in self.pulls.get((owner, repo), []) if p["number"] == int(number)]
            if not found:
                return 404, {"message": "Not Found"}
            pr = found[0]
            for k in ("title", "body"):
                if isinstance(req.json, dict) and isinstance(req.json.get(k), str):
                    pr[k] = req.json[k]
            pr["edits"] = pr.get("edits", 0) + 1
        body = github_openapi.example_response("PATCH", template, 200)
        body.update(number=pr["number"], state=pr["state"], title=pr["title"], body=pr["body"], draft=pr["draft"])
        body.update(html_url=pr["html_url"], url=pr["url"])
        body["head"]["ref"] = pr["head"]["ref"]
        body["base"]["ref"] = pr["base"]["ref"]
        body["requested_teams"] = []
        return self._checked("PATCH", template, 200, body)

    def open_pull(self, repo: str, head: str, title: str = "Fix add()") -> dict[str, Any]:
        """A pull request of `head` (what crewwork opens for a work item), as if POSTed."""
        owner, name = repo.split("/")
        with self._lock:
            number = sum(len(v) for v in self.pulls.values()) + 1
            return self._new_pull((owner, name), number, head, {"title": title, "base": self.default_branch})

    def review(
        self,
        repo: str,
        number: int,
        login: str,
        state: str,
        body: str,
        at: str,
        comments: Sequence[tuple[str, int | None, str, str]] = (),
    ) -> dict[str, Any]:
        """A review submitted on pull request `number` (`state`: APPROVED, CHANGES_REQUESTED, COMMENTED), with line
        comments (path, line, side RIGHT/LEFT, body). Returns the review as the REST API lists it; GitHub's webhook
        carries the same object with the state in lower case."""
        review = github_openapi.example_response("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews", 200)[0]
        review_id = 80 + sum(len(v) for v in self.reviews.values())
        owner, name = repo.split("/")
        [pr] = [p for p in self.pulls.get((owner, name), []) if p["number"] == number]
        head = self.branch_sha(owner, name, pr["head"]["ref"]) or "e" * 40
        # The commit the reviewer saw: the pull request's head when the review was submitted.
        review.update(id=review_id, state=state, body=body, submitted_at=at, commit_id=head)
        review["user"]["login"] = login
        self.reviews.setdefault((repo, number), []).append(review)
        made = []
        for i, (path, line, side, text) in enumerate(comments):
            c = github_openapi.example_response(
                "GET", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews/{review_id}/comments", 200
            )[0]
            c.update(id=90_000 + 100 * review_id + i, path=path, body=text, pull_request_review_id=review_id)
            c.update(line=line, original_line=line, side=side)
            c["user"]["login"] = login
            made.append(c)
        self.review_comments[review_id] = made
        pr["updated_at"] = at
        return review

    def set_diff(self, repo: str, number: int, patches: dict[str, str | None]) -> None:
        """Pull request `number` changes these files (path -> its unified diff hunks; None: no patch shown)."""
        files = []
        for i, (path, patch) in enumerate(patches.items()):
            f = github_openapi.example_response("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/files", 200)[0]
            f.update(filename=path, status="modified", sha=f"{i + 1:040x}")
            if patch is None:
                f.pop("patch", None)
            else:
                f["patch"] = patch
            files.append(f)
        self.pull_files[(repo, number)] = files

    def _create_review(self, req: ForgeRequest) -> tuple[int, Any]:
        """`POST …/pulls/{pull_number}/reviews`, as GitHub answers it: 422 when a line comment is on a line the
        pull request's diff does not show on its side ("Line could not be resolved")."""
        self.openapi_errors += github_openapi.check_request("POST", REVIEWS, req.json)
        parts = req.path.strip("/").split("/")
        repo, number = f"{parts[1]}/{parts[2]}", int(parts[4])
        body = req.json if isinstance(req.json, dict) else {}
        shown = {f["filename"]: _shown(f.get("patch") or "") for f in self.pull_files.get((repo, number), [])}
        for c in body.get("comments") or []:
            lines = shown.get(c.get("path"), {}).get(c.get("side") or "RIGHT", set())
            if c.get("line") not in lines:
                return 422, {"message": "Unprocessable Entity", "errors": ["Line could not be resolved"]}
        with self._lock:
            review_id = 700 + len(self.posted_reviews)
            review = github_openapi.example_response("POST", REVIEWS, 200)
            review.update(id=review_id, body=body.get("body") or "", state="COMMENTED")
            review["commit_id"] = body.get("commit_id") or review["commit_id"]
            review["html_url"] = f"{self.api_url}/{repo}/pull/{number}#pullrequestreview-{review_id}"
            review["user"]["login"] = "crewwork-bot"
            self.posted_reviews.append(
                {"repo": repo, "pull": number, "id": review_id, **{k: body.get(k) for k in ("event", "body")}}
                | {"commit_id": body.get("commit_id"), "comments": list(body.get("comments") or [])}
            )
            self.reviews.setdefault((repo, number), []).append(review)
        return self._checked("POST", REVIEWS, 200, review)

    def close_pull(self, repo: str, number: int, by: str, at: str) -> dict[str, Any]:
        """Close pull request `number` without merging it; its issue's `closed_by` is `by`."""
        owner, name = repo.split("/")
        [pr] = [p for p in self.pulls.get((owner, name), []) if p["number"] == number]
        pr.update(state="closed", closed_at=at, updated_at=at)
        issue = self.open_issue(repo, number, pr["title"], "", "crewwork-bot")
        issue.update(state="closed", closed_at=at)
        issue["closed_by"] = json.loads(json.dumps(issue["user"]))
        issue["closed_by"]["login"] = by
        issue["pull_request"] = {"url": pr["url"], "html_url": pr["html_url"], "diff_url": None, "patch_url": None}
        return pr

    def _intake(self, req: ForgeRequest, template: str) -> tuple[int, Any]:
        """The intake's operations, each request and answer checked against GitHub's OpenAPI description."""
        method = INTAKE_TEMPLATES[template]
        if req.method != method:
            return 404, {"message": "Not Found"}
        self.openapi_errors += github_openapi.check_request(method, template, req.json)
        parts = req.path.strip("/").split("/")
        owner, repo = parts[1], parts[2]
        full = f"{owner}/{repo}"
        if template.endswith("/files"):
            page = int((req.query.get("page") or ["1"])[0])
            files = self.pull_files.get((full, int(parts[4])), [])
            return self._checked(method, template, 200, files[(page - 1) * 100 : page * 100])
        if template.endswith("/reviews"):
            return self._checked(method, template, 200, self.reviews.get((full, int(parts[4])), [])[:100])
        if template.endswith("/reviews/{review_id}/comments"):
            return self._checked(method, template, 200, self.review_comments.get(int(parts[6]), [])[:100])
        if template.endswith("/issues/events"):
            return self._checked(method, template, 200, self.issue_events[:100])
        if template.endswith("/issues/comments"):
            since = (req.query.get("since") or [""])[0]
            return self._checked(
                method, template, 200, [c for c in self.issue_comments if c["updated_at"] >= since][:100]
            )
        if template.endswith("{comment_id}"):
            found = [c for c in self.comments if c["id"] == int(parts[5])]
            if not found:
                return 404, {"message": "Not Found"}
            found[0]["body"] = req.json["body"]
            found[0]["edits"] += 1
            body = github_openapi.example_response(method, template, 200)
            body.update(id=found[0]["id"], body=req.json["body"], html_url=found[0]["html_url"])
            return self._checked(method, template, 200, body)
        if template.endswith("{pull_number}"):
            with self._lock:
                pulls = [p for p in self.pulls.get((owner, repo), []) if p["number"] == int(parts[4])]
            if not pulls:
                return 404, {"message": "Not Found"}
            body = github_openapi.example_response(method, template, 200)
            pr = pulls[0]
            body.update(number=pr["number"], state=pr["state"], title=pr["title"], body=pr["body"], draft=pr["draft"])
            body.update(html_url=pr["html_url"], url=pr["url"])
            body["head"]["ref"] = pr["head"]["ref"]
            body["head"]["sha"] = self.branch_sha(owner, repo, pr["head"]["ref"]) or "0" * 40
            if pr["head"].get("repo") and body["head"].get("repo"):
                body["head"]["repo"]["full_name"] = pr["head"]["repo"]["full_name"]
            body["base"]["ref"] = pr["base"]["ref"]
            # GitHub's own example names a team without the `type` its schema (team) requires.
            body["requested_teams"] = []
            return self._checked(method, template, 200, body)
        if template.endswith("{issue_number}"):
            issue = self.issues.get((full, int(parts[4])))
            return (404, {"message": "Not Found"}) if issue is None else self._checked(method, template, 200, issue)
        if template.endswith("/permission"):
            user = parts[4]
            role = self.permissions.get(user.lower(), "read")
            status, body = 200, github_openapi.example_response(method, template, 200)
            body["permission"] = {"maintain": "write", "triage": "read"}.get(role, role)
            body["role_name"] = role
            body["user"]["login"] = user
            # GitHub's own example lacks it, but its schema (nullable-collaborator) requires it.
            body["user"]["role_name"] = role
        else:
            status, body = 201, github_openapi.example_response(method, template, 201)
            number = int(parts[4])
            with self._lock:
                body["id"] = len(self.comments) + 1
                body["html_url"] = f"{self.api_url}/{owner}/{repo}/issues/{number}#issuecomment-{body['id']}"
                self.comments.append(
                    {
                        "id": body["id"],
                        "repo": f"{owner}/{repo}",
                        "issue": number,
                        "body": req.json["body"],
                        "html_url": body["html_url"],
                        "edits": 0,
                    }
                )
            body["body"] = req.json["body"]
        return self._checked(method, template, status, body)

    def _checked(self, method: str, template: str, status: int, body: Any) -> tuple[int, Any]:
        self.openapi_errors += github_openapi.check_response(method, template, status, body)
        return status, body


def _shown(patch: str) -> dict[str, set[int]]:
    """The lines a unified diff shows: RIGHT (added or context, new numbering), LEFT (removed or context, old)."""
    out: dict[str, set[int]] = {"RIGHT": set(), "LEFT": set()}
    old = new = 0
    for line in patch.splitlines():
        m = re.match(r"@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@", line)
        if m:
            old, new = int(m.group(1)), int(m.group(2))
        elif line.startswith("+"):
            out["RIGHT"].add(new)
            new += 1
        elif line.startswith("-"):
            out["LEFT"].add(old)
            old += 1
        elif line.startswith(" "):
            out["RIGHT"].add(new)
            out["LEFT"].add(old)
            new, old = new + 1, old + 1
    return out
