"""GitHub's REST API as crewwork uses it: open (or find) the pull request of a delivery branch, idempotently; and
for intake (crewwork/forge/intake.py `IntakeForge`), a user's permission on a repository, a comment on an issue,
a comment edited in place, a pull request's head, a review's line comments, and the recent triggers the API lists
(issue events and comments, reviews and closings of crewwork's pull requests: the catch-up poll).

Hand-written over httpx rather than githubkit: crewwork calls ten endpoints, and each call here carries properties
that must hold whatever a library does by default (the token sent only to the configured `api_url`, no redirects
followed, no proxy or netrc from the environment, every error message masked); githubkit brings an HTTP cache
(hishel) and its own retry and redirect behaviour to audit, and generated models of the whole API. The tests keep
these calls honest instead: the local GitHub they run against checks every request and answer against GitHub's
official OpenAPI description (tests/fakes/github_openapi.py).

`POST /repos/{owner}/{repo}/pulls` opens it (`draft` when asked). Before that, `GET /repos/{owner}/{repo}/pulls?
head={owner}:{branch}&state=all` looks for one already open for the branch, so a retried landing returns the
pull request its first try opened instead of failing or opening a second. A `422` "already exists" answer (a race
with another try) is resolved the same way. Without a base branch the repository's `default_branch` is used.

The token is sent as `Authorization: Bearer`, and only to the configured `api_url`; error messages carry the
forge's own message (masked), never the token.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx

from crewwork.boundary.masking import Redactor
from crewwork.forge.common import ForgeError
from crewwork.forge.github_events import (
    REVIEW_BRANCH_PREFIX,
    from_closed,
    from_comment,
    from_issue_event,
    from_review,
    mentions_command,
)
from crewwork.forge.intake import MAX_REVIEW_COMMENTS, IntakeRules, PostedComment, ReviewComment, Trigger
from crewwork.forge.pr_review import MAX_DIFF_FILES, PostedReview

API_VERSION = "2022-11-28"


@dataclass(frozen=True)
class PullRequest:
    url: str
    number: int
    created: bool
    """False when it already existed (a retried landing)."""
    draft: bool = False
    body: str | None = None
    title: str | None = None


class GitHubForge:
    def __init__(self, api_url: str, token: str, *, timeout_s: float = 30.0) -> None:
        self.api_url = api_url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s
        self._redact = Redactor([token])

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.api_url,
            timeout=self.timeout_s,
            follow_redirects=False,
            trust_env=False,
            headers={
                "Authorization": f"Bearer {self._token}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
                "User-Agent": "crewwork",
            },
        )

    async def open_pull_request(
        self,
        owner: str,
        repo: str,
        *,
        head: str,
        base: str | None,
        title: str,
        body: str,
        draft: bool = False,
    ) -> PullRequest:
        async with self._client() as client:
            existing = await self._find(client, owner, repo, head)
            if existing is not None:
                if (existing.body, existing.title) != (body, title):
                    # Opened earlier for review on the forge (before the landing, whose body adds the evidence):
                    # `PATCH /repos/{owner}/{repo}/pulls/{pull_number}` brings it up to date.
                    await self._call(
                        client,
                        "PATCH",
                        f"/repos/{_seg(owner)}/{_seg(repo)}/pulls/{existing.number}",
                        json={"title": title, "body": body},
                    )
                return existing
            if base is None:
                info = await self._call(client, "GET", f"/repos/{owner}/{repo}")
                base = str(info.get("default_branch") or "main")
            payload = {"title": title, "head": head, "base": base, "body": body, "draft": draft}
            try:
                pr = await self._call(client, "POST", f"/repos/{owner}/{repo}/pulls", json=payload)
            except ForgeError as exc:
                if exc.status == 422 and "already exists" in str(exc).lower():
                    again = await self._find(client, owner, repo, head)
                    if again is not None:
                        return again
                raise
            return PullRequest(
                url=str(pr["html_url"]), number=int(pr["number"]), created=True, draft=bool(pr.get("draft"))
            )

    async def permission(self, owner: str, repo: str, user: str) -> str:
        """`GET /repos/{owner}/{repo}/collaborators/{username}/permission`: the user's role on the repository
        (`role_name`: admin, maintain, write, triage, read; `permission` where there is none), `none` when GitHub
        says the user is not a collaborator (404)."""
        async with self._client() as client:
            try:
                found = await self._call(
                    client, "GET", f"/repos/{_seg(owner)}/{_seg(repo)}/collaborators/{_seg(user)}/permission"
                )
            except ForgeError as exc:
                if exc.status == 404:
                    return "none"
                raise
        if not isinstance(found, dict):
            raise ForgeError("the forge's permission answer is not an object", retryable=True)
        role = str(found.get("role_name") or found.get("permission") or "none")
        return role if role in ("admin", "maintain", "write", "triage", "read") else "none"

    async def comment(self, owner: str, repo: str, issue_number: int, body: str) -> PostedComment:
        """`POST /repos/{owner}/{repo}/issues/{issue_number}/comments`."""
        async with self._client() as client:
            made = await self._call(
                client,
                "POST",
                f"/repos/{_seg(owner)}/{_seg(repo)}/issues/{int(issue_number)}/comments",
                json={"body": body},
            )
        return _comment(made)

    async def edit_comment(self, owner: str, repo: str, comment_id: int, body: str) -> PostedComment:
        """`PATCH /repos/{owner}/{repo}/issues/comments/{comment_id}`."""
        async with self._client() as client:
            made = await self._call(
                client,
                "PATCH",
                f"/repos/{_seg(owner)}/{_seg(repo)}/issues/comments/{int(comment_id)}",
                json={"body": body},
            )
        return _comment(made)

    async def pull_request_head(self, owner: str, repo: str, number: int) -> str:
        """`GET /repos/{owner}/{repo}/pulls/{pull_number}`: its `head.sha`."""
        async with self._client() as client:
            pr = await self._call(client, "GET", f"/repos/{_seg(owner)}/{_seg(repo)}/pulls/{int(number)}")
        head = pr.get("head") if isinstance(pr, dict) else None
        sha = head.get("sha") if isinstance(head, dict) else None
        if not isinstance(sha, str):
            raise ForgeError("the forge's pull request answer has no head.sha", retryable=True)
        return sha

    async def review_comments(self, owner: str, repo: str, number: int, review_id: int) -> list[ReviewComment]:
        """`GET /repos/{owner}/{repo}/pulls/{pull_number}/reviews/{review_id}/comments`, the first page: each
        comment's file, its line on the diff's new side (`side: RIGHT`) or old side (`LEFT`), and its text. A
        comment GitHub no longer places on a line of the current diff (`line` null: outdated, or on the whole file)
        keeps its `original_line`, or none."""
        async with self._client() as client:
            found = await self._call(
                client,
                "GET",
                f"/repos/{_seg(owner)}/{_seg(repo)}/pulls/{int(number)}/reviews/{int(review_id)}/comments",
                params={"per_page": MAX_REVIEW_COMMENTS},
            )
        out = []
        for c in found if isinstance(found, list) else []:
            if not isinstance(c, dict) or not isinstance(c.get("path"), str) or not isinstance(c.get("body"), str):
                continue
            line = c.get("line") if isinstance(c.get("line"), int) else c.get("original_line")
            out.append(
                ReviewComment(
                    path=c["path"],
                    line=line if isinstance(line, int) and line >= 1 else None,
                    side="old" if c.get("side") == "LEFT" else "new",
                    body=c["body"],
                )
            )
        return out

    async def pull_request(self, owner: str, repo: str, number: int) -> dict[str, Any]:
        """`GET /repos/{owner}/{repo}/pulls/{pull_number}`: the pull request as the forge says now."""
        async with self._client() as client:
            pr = await self._call(client, "GET", f"/repos/{_seg(owner)}/{_seg(repo)}/pulls/{int(number)}")
        if not isinstance(pr, dict):
            raise ForgeError("the forge's pull request answer is not an object", retryable=True)
        return pr

    async def pull_request_files(self, owner: str, repo: str, number: int) -> tuple[list[dict[str, Any]], bool]:
        """`GET /repos/{owner}/{repo}/pulls/{pull_number}/files`, up to MAX_DIFF_FILES (pages of 100): each file's
        `filename` and `patch` (the forge leaves the patch out of a binary or very large file). Also whether the pull
        request changes more files than were read."""
        files: list[dict[str, Any]] = []
        async with self._client() as client:
            for page in range(1, MAX_DIFF_FILES // 100 + 1):
                got = await self._call(
                    client,
                    "GET",
                    f"/repos/{_seg(owner)}/{_seg(repo)}/pulls/{int(number)}/files",
                    params={"per_page": 100, "page": page},
                )
                batch = [f for f in got if isinstance(f, dict)] if isinstance(got, list) else []
                files += batch
                if len(batch) < 100:
                    return files, False
        return files, True

    async def pull_request_reviews(self, owner: str, repo: str, number: int) -> list[dict[str, Any]]:
        """`GET /repos/{owner}/{repo}/pulls/{pull_number}/reviews`: the first three pages (300 reviews)."""
        out: list[dict[str, Any]] = []
        async with self._client() as client:
            for page in (1, 2, 3):
                got = await self._call(
                    client,
                    "GET",
                    f"/repos/{_seg(owner)}/{_seg(repo)}/pulls/{int(number)}/reviews",
                    params={"per_page": 100, "page": page},
                )
                batch = [r for r in got if isinstance(r, dict)] if isinstance(got, list) else []
                out += batch
                if len(batch) < 100:
                    break
        return out

    async def create_review(
        self, owner: str, repo: str, number: int, *, commit_id: str, body: str, comments: list[dict[str, Any]]
    ) -> PostedReview:
        """`POST /repos/{owner}/{repo}/pulls/{pull_number}/reviews`, event `COMMENT` always: a review that neither
        approves nor requests changes, with line comments `{path, line, side, body}` on lines of the diff."""
        payload: dict[str, Any] = {"body": body, "event": "COMMENT", "comments": comments}
        if commit_id:
            payload["commit_id"] = commit_id
        async with self._client() as client:
            made = await self._call(
                client, "POST", f"/repos/{_seg(owner)}/{_seg(repo)}/pulls/{int(number)}/reviews", json=payload
            )
        if not isinstance(made, dict) or not isinstance(made.get("id"), int):
            raise ForgeError("the forge's review answer has no id", retryable=True)
        return PostedReview(int(made["id"]), str(made.get("html_url") or ""), existing=False)

    async def recent_triggers(self, owner: str, repo: str, rules: IntakeRules, since: float) -> list[Trigger]:
        """`GET /repos/{owner}/{repo}/issues/events` (its `labeled` events) and `GET /repos/{owner}/{repo}/issues/
        comments?since=` (comments with a command, each with `GET /repos/{owner}/{repo}/issues/{issue_number}`):
        the first page (100) of each, newest first, created at `since` or later. Then the pull requests crewwork
        opened (`GET /repos/{owner}/{repo}/pulls?state=all`, the 100 updated last, those updated at `since` or
        later): each one's deciding reviews (`GET …/pulls/{pull_number}/reviews`) and, closed without a merge, its
        closing (who closed it: `GET …/issues/{issue_number}`, `closed_by`)."""
        repository = f"{owner}/{repo}"
        base = f"/repos/{_seg(owner)}/{_seg(repo)}/issues"
        found: list[Trigger] = []
        async with self._client() as client:
            events = await self._call(client, "GET", f"{base}/events", params={"per_page": 100})
            for event in events if isinstance(events, list) else []:
                if _epoch(event.get("created_at") if isinstance(event, dict) else None) >= since:
                    trigger = from_issue_event(event, rules, repository)
                    if trigger is not None:
                        found.append(trigger)
            comments = await self._call(
                client,
                "GET",
                f"{base}/comments",
                params={"since": _iso(since), "sort": "created", "direction": "desc", "per_page": 100},
            )
            for comment in comments if isinstance(comments, list) else []:
                if not mentions_command(comment, rules) or _epoch(comment.get("created_at")) < since:
                    continue
                number = str(comment.get("issue_url") or "").rsplit("/", 1)[-1]
                if not number.isdigit():
                    continue
                issue = await self._call(client, "GET", f"{base}/{int(number)}")
                trigger = from_comment(comment, issue, rules, repository)
                if trigger is not None:
                    found.append(trigger)
            found += await self._recent_reviews(client, owner, repo, since)
        return found

    async def _recent_reviews(self, client: httpx.AsyncClient, owner: str, repo: str, since: float) -> list[Trigger]:
        repository = f"{owner}/{repo}"
        base = f"/repos/{_seg(owner)}/{_seg(repo)}"
        pulls = await self._call(
            client,
            "GET",
            f"{base}/pulls",
            params={"state": "all", "sort": "updated", "direction": "desc", "per_page": 100},
        )
        found: list[Trigger] = []
        for pull in pulls if isinstance(pulls, list) else []:
            if not isinstance(pull, dict) or _epoch(pull.get("updated_at")) < since:
                continue
            head = pull.get("head")
            if not isinstance(head, dict) or not str(head.get("ref") or "").startswith(REVIEW_BRANCH_PREFIX):
                continue
            number = pull.get("number")
            if not isinstance(number, int):
                continue
            reviews = await self._call(client, "GET", f"{base}/pulls/{number}/reviews", params={"per_page": 100})
            for review in reviews if isinstance(reviews, list) else []:
                if isinstance(review, dict) and _epoch(review.get("submitted_at")) >= since:
                    trigger = from_review(review, pull, repository)
                    if trigger is not None:
                        found.append(trigger)
            if pull.get("state") == "closed" and not pull.get("merged_at"):
                issue = await self._call(client, "GET", f"{base}/issues/{number}")
                closed_by = issue.get("closed_by") if isinstance(issue, dict) else None
                trigger = from_closed(pull, closed_by, repository)
                if trigger is not None:
                    found.append(trigger)
        return found

    async def _find(self, client: httpx.AsyncClient, owner: str, repo: str, head: str) -> PullRequest | None:
        found = await self._call(
            client, "GET", f"/repos/{owner}/{repo}/pulls", params={"head": f"{owner}:{head}", "state": "all"}
        )
        if isinstance(found, list):
            for pr in found:
                if isinstance(pr, dict) and (pr.get("head") or {}).get("ref") == head:
                    return PullRequest(
                        url=str(pr["html_url"]),
                        number=int(pr["number"]),
                        created=False,
                        draft=bool(pr.get("draft")),
                        body=pr.get("body") if isinstance(pr.get("body"), str) else None,
                        title=pr.get("title") if isinstance(pr.get("title"), str) else None,
                    )
        return None

    async def _call(self, client: httpx.AsyncClient, method: str, path: str, **kw: Any) -> Any:
        where = f"{method} {self.api_url}{path}"
        try:
            r = await client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ForgeError(self._redact(f"{where}: {type(exc).__name__}: {exc}"), retryable=True) from None
        if r.status_code < 300:
            try:
                return r.json()
            except ValueError:
                raise ForgeError(f"{where}: the forge answered {r.status_code} without JSON", retryable=True) from None
        message = _message(r)
        retryable = (
            r.status_code >= 500
            or r.status_code == 429
            or (r.status_code == 403 and r.headers.get("x-ratelimit-remaining") == "0")
        )
        raise ForgeError(
            self._redact(f"{where} answered {r.status_code}: {message}"), retryable=retryable, status=r.status_code
        )


def _comment(made: Any) -> PostedComment:
    if not isinstance(made, dict) or not isinstance(made.get("id"), int):
        raise ForgeError("the forge's comment answer has no id", retryable=True)
    return PostedComment(int(made["id"]), str(made.get("html_url") or ""))


def _epoch(stamp: Any) -> float:
    """GitHub's `2011-04-14T16:00:49Z` as epoch seconds (0 for anything else)."""
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seg(part: str) -> str:
    """One path segment: a name from a payload or a registration never adds a segment or a query."""
    return quote(part, safe="")


def _message(r: httpx.Response) -> str:
    try:
        data = r.json()
    except ValueError:
        return r.text[:500]
    if not isinstance(data, dict):
        return str(data)[:500]
    parts = [str(data.get("message") or "")]
    for e in data.get("errors") or []:
        if isinstance(e, str):
            parts.append(e)  # the review API's "Line could not be resolved"
        elif isinstance(e, dict) and e.get("message"):
            parts.append(str(e["message"]))
        elif isinstance(e, dict):
            # GitHub's validation errors without a message: `{"resource", "field", "code"}`.
            parts.append(" ".join(str(e[k]) for k in ("resource", "field", "code") if e.get(k)))
    return "; ".join(p for p in parts if p)[:1000]
