"""A tenant cannot steer the workers to an address the operator did not allow by registering (or naming) a
repository: black box over the real API, Temporal, PostgreSQL and worker pools, with real git servers on loopback.

Registration and submission of an internal address are a 422 `url_not_allowed` naming the address and its
category, with nothing stored and no connection made (TCP listeners count them); the operator's allowlist opens
exactly its networks. A registered repository whose name later resolves inside is refused at submission, and one
that moves between the submission and the worker's fetch fails the item naming the address.

The DNS of the last test is the system resolver replaced for this process (`crewwork.boundary.outbound._system_resolve`,
which the API and the in-process worker pools both use) by a function whose answers change, as a rebinding
attacker's DNS server does. Its name (`gitbox.test`) exists nowhere else, so the git servers are reached only through
the address crewwork checked and pinned."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crewwork.boundary.outbound import IPAddress
from tests.api.conftest import LiveApi, Stack, wait_state
from tests.api.test_repositories import change
from tests.conftest import make_repo
from tests.repos.addresses import INTERNAL, spell
from tests.repos.servers import GitDaemon, Listener, SmartHttp, bare_from, git

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

CALC = {"calc.py": "def add(a, b):\n    return a - b\n", "tests/test_calc.py": "", "conftest.py": ""}

# Refused by the URL grammar before any address is looked at (crewwork.boundary.urls): 422 `invalid_repository`.
MALFORMED = [
    "https://github.com@127.0.0.1/acme/calc.git",  # user info in an http(s) URL: the host is 127.0.0.1
    "https://github.com:x@127.0.0.1/acme/calc.git",
    "http://localhost./acme/calc.git",  # trailing dot
    "http://127.0.0.1%2f@github.com/acme/calc.git",
    "http://%31%32%37.0.0.1/acme/calc.git",  # percent-escaped host
    "ssh://-oProxyCommand=id/acme/calc.git",  # an option smuggled into ssh
    "ssh://-oProxyCommand=id@github.com/acme/calc.git",
    "-oProxyCommand=id:acme/calc.git",
    "ext::sh -c id",
    "http://[fe80::1%25eth0]/acme/calc.git",  # zone id
]


@pytest.fixture
def listeners() -> Iterator[tuple[Listener, Listener]]:
    with Listener("127.0.0.1") as v4, Listener("::1") as v6:
        yield v4, v6


@pytest.fixture
async def strict(stack: Stack) -> AsyncIterator[LiveApi]:
    """An API with the production default: no repository allowlist (public addresses only)."""
    api = LiveApi(stack.api.settings.model_copy(update={"repo_allow_networks": ""})).start()
    try:
        yield api
    finally:
        api.stop()


def client(api: LiveApi, stack: Stack) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=api.url, headers=stack.alpha.headers, timeout=60)


async def test_internal_addresses_are_refused_at_registration_and_submission_with_nothing_stored(
    stack: Stack, strict: LiveApi, listeners: tuple[Listener, Listener]
) -> None:
    async with client(strict, stack) as c:
        for template, category in INTERNAL:
            url = spell(template, listeners)
            r = await c.post("/v1/repositories", json={"url": url, "default_ref": "main"})
            assert r.status_code == 422, (url, r.text)
            body = r.json()
            assert body["code"] == "url_not_allowed", (url, body)
            assert body["errors"][0]["field"] == "url"
            assert "CREWWORK_REPO_ALLOW_NETWORKS" in body["detail"], body
            assert category.split("|")[0] in body["detail"] or category.split("|")[-1] in body["detail"], body
            # A work item naming it (registered on first use in this stack) is refused the same way.
            r = await c.post("/v1/work-items", json=change({"url": url, "ref": "main"}))
            assert r.status_code == 422, (url, r.text)
            assert r.json()["code"] == "url_not_allowed" and r.json()["errors"][0]["field"] == "repo", r.text
        for url in MALFORMED:
            r = await c.post("/v1/repositories", json={"url": url})
            assert r.status_code == 422, (url, r.text)
        assert (await c.get("/v1/repositories")).json()["items"] == []
        assert (await c.get("/v1/work-items")).json()["items"] == []
    assert (listeners[0].connections, listeners[1].connections) == (0, 0), "no git process dialled anything"


async def test_the_operators_allowlist_opens_exactly_its_networks(stack: Stack, tmp_path: Path) -> None:
    work = make_repo(tmp_path / "src" / "calc", CALC)
    root = tmp_path / "served"
    bare_from(work, root / "acme" / "calc.git")
    api = LiveApi(stack.api.settings.model_copy(update={"repo_allow_networks": "127.0.0.1/32"})).start()
    try:
        with GitDaemon(root, tmp_path / "daemon.log") as daemon, Listener("::1") as v6, Listener("127.0.0.1") as v4:
            async with client(api, stack) as c:
                r = await c.post("/v1/repositories", json={"url": daemon.url("acme/calc.git"), "default_ref": "main"})
                assert r.status_code == 201, r.text
                for url, why in (
                    (f"git://[::1]:{v6.port}/acme/calc.git", "::1 is a loopback address"),
                    (f"git://10.0.0.1:{v4.port}/acme/calc.git", "10.0.0.1 is a private address"),
                    (f"http://169.254.169.254:{v4.port}/acme/calc.git", "link-local"),
                ):
                    r = await c.post("/v1/repositories", json={"url": url})
                    assert r.status_code == 422 and r.json()["code"] == "url_not_allowed", r.text
                    assert why in r.json()["detail"]
            assert v6.connections == 0
    finally:
        api.stop()


class RebindingDns:
    """Answers for `gitbox.test` that the test changes; `then` answers after `left` more questions."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.now = ["127.0.0.1"]
        self.left: int | None = None
        self.then: list[str] = []
        self.asked = 0

    async def __call__(self, host: str, port: int, timeout_s: float) -> list[IPAddress]:
        if host != "gitbox.test":
            return list(await self.real(host, port, timeout_s))
        self.asked += 1
        if self.left is not None:
            if self.left == 0:
                self.now = self.then
            self.left -= 1
        return [ipaddress.ip_address(a) for a in self.now]


async def test_a_registered_name_that_now_resolves_inside_is_refused_at_submission_and_at_fetch(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import crewwork.boundary.outbound

    dns = RebindingDns(crewwork.boundary.outbound._system_resolve)
    monkeypatch.setattr(crewwork.boundary.outbound, "_system_resolve", dns)
    work = make_repo(tmp_path / "src" / "calc", CALC)
    root = tmp_path / "served"
    bare = bare_from(work, root / "acme" / "calc.git")
    with SmartHttp(root) as server:
        url = f"http://gitbox.test:{server.port}/acme/calc.git"
        async with stack.client() as c:
            r = await c.post("/v1/repositories", json={"url": url, "default_ref": "main"})
            assert r.status_code == 201, r.text
            repo_id = r.json()["id"]
            # The name now answers with the operator's network: the next submission is refused, nothing stored.
            dns.now = ["10.0.0.1"]
            seen = len(server.requests)
            r = await c.post("/v1/work-items", json=change({"id": repo_id}))
            assert r.status_code == 422, r.text
            assert r.json()["code"] == "url_not_allowed" and "10.0.0.1 is a private address" in r.json()["detail"]
            assert (await c.get("/v1/work-items")).json()["items"] == []
            assert len(server.requests) == seen
            # Rebinding with TTL 0: the submission's two questions (its check, then its ls-remote's pin) see the
            # allowed address, every later one the metadata service's. The worker's fetch checks again and refuses;
            # the item fails naming it.
            dns.now, dns.left, dns.then = ["127.0.0.1"], 2, ["169.254.169.254"]
            r = await c.post("/v1/work-items", json=change({"id": repo_id}))
            assert r.status_code == 202, r.text
            seen = len(server.requests)
            body = await wait_state(c, r.json()["id"], {"failed", "dead", "succeeded"}, timeout_s=120)
        assert body["state"] == "failed", body
        reason = str(body.get("reason") or body)
        assert "169.254.169.254 is a link-local address" in reason and url in reason, reason
        assert len(server.requests) == seen, "no git request reached the server after the name moved"
        assert dns.asked >= 3
    assert not git(bare, "for-each-ref", "refs/heads/crewwork/")


@pytest.mark.parametrize(
    "host",
    [
        "a" * 64 + ".example",  # a label longer than DNS allows
        "\u202e.example",  # a character IDNA refuses (a right-to-left override)
    ],
)
async def test_a_host_name_no_resolver_can_encode_is_a_422_not_a_server_error(stack: Stack, host: str) -> None:
    """Before, the system resolver's IDNA encoding raised UnicodeError (not an OSError): webhooks and repository
    registration answered 500, and a work item naming such a repository had its connection reset (the error escaped
    the app). The name does not resolve: the same 422 as a name that does not exist."""
    async with httpx.AsyncClient(base_url=stack.api.url, headers=stack.alpha.headers, timeout=60) as c:
        r = await c.post("/v1/webhooks", json={"url": f"http://{host}/hook"})
        assert r.status_code == 422 and r.json()["code"] == "url_not_allowed", r.text
        r = await c.post("/v1/repositories", json={"url": f"https://{host}/acme/calc.git"})
        assert r.status_code == 422 and r.json()["code"] in ("invalid_repository", "url_not_allowed"), r.text
        item = change({"url": f"https://{host}/acme/calc.git", "ref": "main"})
        r = await c.post("/v1/work-items", json=item)
        assert r.status_code in (404, 422), r.text
        assert (await c.get("/healthz")).json()["ok"]
