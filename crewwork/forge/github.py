"""GitHub's pull-request API: open (or find) the pull request of a delivery branch, idempotently.

`POST /repos/{owner}/{repo}/pulls` opens it (`draft` when asked). Before that, `GET /repos/{owner}/{repo}/pulls?
head={owner}:{branch}&state=all` looks for one already open for the branch, so a retried landing returns the
pull request its first try opened instead of failing or opening a second. A `422` "already exists" answer (a race
with another try) is resolved the same way. Without a base branch the repository's `default_branch` is used.

The token is sent as `Authorization: Bearer`, and only to the configured `api_url`; error messages carry the
forge's own message (masked), never the token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from crewwork.forge import ForgeError
from crewwork.transport.redact import Redactor

API_VERSION = "2022-11-28"


@dataclass(frozen=True)
class PullRequest:
    url: str
    number: int
    created: bool
    """False when it already existed (a retried landing)."""
    draft: bool = False


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

    async def _find(self, client: httpx.AsyncClient, owner: str, repo: str, head: str) -> PullRequest | None:
        found = await self._call(
            client, "GET", f"/repos/{owner}/{repo}/pulls", params={"head": f"{owner}:{head}", "state": "all"}
        )
        if isinstance(found, list):
            for pr in found:
                if isinstance(pr, dict) and (pr.get("head") or {}).get("ref") == head:
                    return PullRequest(
                        url=str(pr["html_url"]), number=int(pr["number"]), created=False, draft=bool(pr.get("draft"))
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


def _message(r: httpx.Response) -> str:
    try:
        data = r.json()
    except ValueError:
        return r.text[:500]
    if not isinstance(data, dict):
        return str(data)[:500]
    parts = [str(data.get("message") or "")]
    for e in data.get("errors") or []:
        if isinstance(e, dict) and e.get("message"):
            parts.append(str(e["message"]))
        elif isinstance(e, dict):
            # GitHub's validation errors without a message: `{"resource", "field", "code"}`.
            parts.append(" ".join(str(e[k]) for k in ("resource", "field", "code") if e.get(k)))
    return "; ".join(p for p in parts if p)[:1000]
