"""Tenants are untrusted (issue 14, points 5 and 6), black-box on the real API over PostgreSQL and Temporal:

- a sweep of EVERY route of the app (enumerated from `app.routes`, so a new route is covered or fails the test until
  it is classified) and every field that names a resource: tenant B gets the same 404 for tenant A's work item,
  artifact, webhook or repository as for a missing one, and no listing, stream, cursor or public page shows B
  anything of A's;
- no JSON response, SSE stream or webhook payload carries a fencing rank or token;
- idempotency: the same key with the same submission replays (200), with another is a 409 `idempotency_conflict`,
  and `Location` names the item;
- failed authentication is rate limited per client address, and the per-key limit holds across API processes.
"""

from __future__ import annotations

import asyncio
import random
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.responses import StreamingResponse
from starlette.routing import Mount

from crewwork.cli.serve import api_app
from crewwork.config import Settings
from crewwork.config.api import ApiOptions
from crewwork.store.tables import OutboxMessage
from tests.api.conftest import LiveApi, Stack, make_tenant, task_item
from tests.api.tenant_world import SHARED_IDEMPOTENCY_KEY, Owned, World, build_world, read_sse

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


@pytest.fixture(scope="module")
def api_settings(api_settings: Settings) -> Settings:
    # Both tenants register loopback webhooks, which the operator must allow (crewwork/boundary/outbound.py).
    return api_settings.model_copy(update={"outbound_allow_networks": "127.0.0.0/8"})


PUBLIC_PATHS = {
    "/",
    "/healthz",
    "/metrics",
    "/console",
    "/console/static",
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
    "/.well-known/oauth-protected-resource/mcp",
    # The operator's public signing keys (docs/evidence.md): the same for every caller, no tenant's data.
    "/evidence/keys",
}
"""Routes outside the tenants' data: served to anyone, they must not show any tenant's resources."""

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def mcp_sweep(beta: httpx.AsyncClient, anon: httpx.AsyncClient, a: Owned, method: str) -> None:
    """/mcp (docs/mcp.md): anonymous is a 401; tenant B naming A's repositories and work items in tools gets exactly
    the answer of a missing one (tests/mcp/test_mcp_tenancy.py sweeps every tool and resource)."""
    assert method == "POST"  # stateless: GET (a stream) and DELETE (a session's end) are 405
    for other in ("GET", "DELETE"):
        assert (await beta.request(other, "/mcp", headers=MCP_HEADERS)).status_code == 405
    r = await anon.post("/mcp", headers=MCP_HEADERS, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert r.status_code == 401 and "resource_metadata=" in r.headers["www-authenticate"], r.text

    async def tool(name: str, args: dict[str, Any]) -> str:
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": args}}
        r = await beta.post("/mcp", headers=MCP_HEADERS, json=call)
        assert r.status_code == 200, r.text
        assert r.json()["result"]["isError"] is True, r.text
        return str(r.json()["result"]["content"][0]["text"])

    for rid in a.repositories:
        got = await tool("read_file", {"repo": rid, "path": "calc.py"})
        missing = await tool("read_file", {"repo": missing_like(rid), "path": "calc.py"})
        assert got.replace(rid, "<id>") == missing.replace(missing_like(rid), "<id>"), (got, missing)
    for wid in a.work_items:
        for name in ("get_work_item", "get_evidence", "git_status"):
            got = await tool(name, {"work_item_id": wid})
            missing = await tool(name, {"work_item_id": missing_like(wid)})
            assert got.replace(wid, "<id>") == missing.replace(missing_like(wid), "<id>"), (name, got, missing)


async def forge_webhook_sweep(beta: httpx.AsyncClient, anon: httpx.AsyncClient, a: Owned) -> None:
    """The forge's webhook endpoint (docs/forge.md) takes no API key: the subscription's secret signs each delivery.
    Anyone, tenant B included, naming a subscription that is not there, or a dialect that is not one, gets the same
    404, and a delivery is never read before its signature is checked against the named subscription's secret
    (tests/repos/test_forge_intake.py: another secret is a 401)."""
    answers = set()
    for client in (beta, anon):
        for path in ("/forge/github/fsub_0000000000", "/forge/gitlab/fsub_0000000000", "/forge/github/x%2F..%2Fy"):
            r = await client.post(path, content=b"{}", headers={"Content-Type": "application/json"})
            assert r.status_code == 404, (path, r.text)
            assert_no_names(r.text, a, f"POST {path}")
            if "%2F" not in path:  # a decoded slash reaches no route at all: the router's own 404
                answers.add(r.json()["detail"])
    assert answers == {"no such forge subscription"}


async def sentry_sweep(beta: httpx.AsyncClient, anon: httpx.AsyncClient, a: Owned, path: str) -> None:
    """The Sentry SDK's and OTLP's endpoints (docs/errors-intake.md) take no API key: the DSN's key names the
    project. Anyone,
    tenant B included, naming a project that is not there, or one with a key that is not its own, gets the same
    403 (401 without a key), and nothing of any tenant's."""
    for client in (beta, anon):
        for project in ("999999999", "x%2F..%2Fy"):  # each 401/403 is charged to the address: a few suffice
            url = path.replace("{project_id}", project)
            key = (
                {"Authorization": f"Bearer {'0' * 32}", "Content-Type": "application/json"}
                if path.startswith("/otlp")
                else {"X-Sentry-Auth": f"Sentry sentry_key={'0' * 32}"}
            )
            for auth in ({}, key):
                r = await client.post(url, content=b"{}\n", headers=auth)
                assert_no_names(r.text, a, f"POST {url}")
                if "%2F" in project:
                    assert r.status_code == 404, (url, r.text)
                else:
                    # Tenant B's client sends its API key as a Bearer token: to OTLP's endpoints, a wrong key.
                    keyed = bool(auth) or (path.startswith("/otlp") and client is beta)
                    assert r.status_code == (403 if keyed else 401), (url, r.text)


BODIES = {"/review": {"action": "approve"}, "/forge": {}, "/errors": {}}
"""A minimal valid body for routes that need one (by the end of their path)."""
QUERIES = {
    ("POST", "/evidence-bundle"): {"attempt": "1"},
    ("POST", "/replay"): {"attempt": "1"},
    ("GET", "/replay"): {"id": "replay-x"},
}
"""A minimal valid query for routes that require one (by method and the end of their path): without it the route
answers 422 for any id, and the sweep would not reach its ownership check."""

FENCING_FIELDS = {"rank", "token", "fence_rank", "state_rank", "result_rank", "presented", "current", "step"}


KINDS = {
    "work_item": "work_items",
    "work-item": "work_items",
    "artifact": "artifacts",
    "webhook": "webhooks",
    "repository": "repositories",
    "repo": "repositories",
}


def resource_kind(param: str, path: str) -> str:
    """Which resource a path parameter names, from its name alone (`{webhook_id}`), or for a bare `{id}` from the
    path segment before it (`/v1/repositories/{id}`), so new routes are classified generically."""
    name = param.removesuffix("_id")
    if name == "id":
        segment = path.split("{" + param)[0].rstrip("/").rsplit("/", 1)[-1]
        name = segment.removesuffix("s").removesuffix("ie") + ("y" if segment.endswith("ies") else "")
    if name not in KINDS:
        raise AssertionError(
            f"path parameter {{{param}}} of {path} names no resource the sweep knows: classify it in KINDS and "
            "give the sweep an instance of it for tenant A"
        )
    return KINDS[name]


def path_params(path: str) -> list[str]:
    return re.findall(r"{(\w+)(?::\w+)?}", path)


def fill(path: str, values: dict[str, str]) -> str:
    return re.sub(r"{(\w+)(?::\w+)?}", lambda m: values[m.group(1)], path)


def missing_like(value: str) -> str:
    """An id of the same shape that names nothing."""
    return value[: max(1, len(value) - 8)] + "00000000"


def _flat(routes: Any) -> Any:
    for r in routes:
        if hasattr(r, "effective_route_contexts"):  # a router included by FastAPI (resolved lazily)
            yield from r.effective_route_contexts()
        else:
            yield r


def app_routes(stack: Stack) -> list[tuple[str, str, Any]]:
    """(method, path, route) for every route of the app: what the sweep must cover."""
    out: list[tuple[str, str, Any]] = []
    for r in _flat(api_app(stack.api.settings).routes):
        if isinstance(r, Mount):
            out.append(("GET", r.path, r))
            continue
        for m in sorted(getattr(r, "methods", None) or {"GET"}):
            if m != "HEAD":
                out.append((m, r.path, r))
    return out


def is_stream(route: Any) -> bool:
    return getattr(route, "response_class", None) is StreamingResponse


def query_names(route: Any) -> set[str]:
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return set()
    return {p.alias or p.name for p in dependant.query_params}


def assert_no_names(text: str, owned: Owned, where: str) -> None:
    leaked = [n for n in owned.names() if n in text]
    assert not leaked, f"{where} shows tenant A's {leaked}"


async def repositories_of(c: httpx.AsyncClient) -> list[str]:
    r = await c.get("/v1/repositories")
    assert r.status_code == 200, r.text
    body = r.json()
    items = body.get("items", body) if isinstance(body, dict) else body
    return [str(x["id"]) for x in items]


async def give_a_repository(stack: Stack, world: World, calc_repo: Path, routes: list[tuple[str, str, Any]]) -> None:
    """Tenant A's registered repositories, when the app has a repositories resource (registering one if needed)."""
    if not any(resource_kind(p, path) == "repositories" for _m, path, _r in routes for p in path_params(path)):
        return
    async with stack.client(stack.alpha) as alpha:
        ids = await repositories_of(alpha)
        if not ids:
            r = await alpha.post("/v1/repositories", json={"url": str(calc_repo)})
            assert r.status_code in (200, 201), f"the sweep could not register a repository for tenant A: {r.text}"
            ids = await repositories_of(alpha)
    assert ids
    world.a.repositories = ids


def owned_values(o: Owned, kind: str) -> list[str]:
    return list(getattr(o, kind, []) or [])


async def test_tenant_b_gets_the_missing_404_for_everything_of_tenant_a_on_every_route(
    stack: Stack, calc_repo: Path
) -> None:
    world = await build_world(stack, calc_repo)
    routes = app_routes(stack)
    await give_a_repository(stack, world, calc_repo, routes)
    a, b = world.a, world.b
    covered: set[tuple[str, str]] = set()
    # From a loopback address of their own: every 401/403 of the sweep is charged to the client's address, and on
    # 127.0.0.1 it drained the bucket the module's other tests share (their requests then answered 429).
    own = _loopback()
    async with (
        stack.client(stack.beta, transport=httpx.AsyncHTTPTransport(local_address=own)) as beta,
        _from(stack.api, own) as anon,
    ):
        for method, path, route in routes:
            params = path_params(path)
            if path == "/mcp":
                await mcp_sweep(beta, anon, a, method)
                covered.add((method, path))
                continue
            if path in (
                "/api/{project_id}/envelope/",
                "/api/{project_id}/store/",
                "/otlp/{project_id}/v1/logs",
                "/otlp/{project_id}/v1/traces",
            ):
                await sentry_sweep(beta, anon, a, path)
                covered.add((method, path))
                continue
            if path == "/forge/{dialect}/{subscription_id}":
                await forge_webhook_sweep(beta, anon, a)
                covered.add((method, path))
                continue
            if not path.startswith("/v1"):
                # Public pages: nothing of any tenant's, for a tenant or for anyone.
                assert path in PUBLIC_PATHS and method in ("GET", "OPTIONS"), f"unclassified route {method} {path}"
                if isinstance(route, Mount):
                    target = f"{path}/console.js"
                else:
                    target = path
                for client in (beta, anon):
                    r = await client.get(target)
                    assert_no_names(r.text, a, f"{method} {path}")
                covered.add((method, path))
                continue

            if params:
                kinds = {p: resource_kind(p, path) for p in params}
                for p in params:
                    for a_value in owned_values(a, kinds[p]):
                        values = {q: (owned_values(b, kinds[q]) or owned_values(a, kinds[q]))[0] for q in params}
                        values[p] = a_value
                        for variant in ({**values}, {q: owned_values(a, kinds[q])[0] for q in params} | {p: a_value}):
                            body = next((v for k, v in BODIES.items() if path.endswith(k)), None)
                            query = next((v for (m, k), v in QUERIES.items() if m == method and path.endswith(k)), {})
                            got = await beta.request(method, fill(path, variant), json=body, params=query)
                            missing = {**variant, p: missing_like(a_value)}
                            ref = await beta.request(method, fill(path, missing), json=body, params=query)
                            where = f"tenant B: {method} {fill(path, variant)}"
                            assert got.status_code == 404, f"{where}: {got.status_code} {got.text}"
                            assert ref.status_code == 404, f"{method} {fill(path, missing)}: {ref.text}"
                            normal = got.text.replace(a_value, "<id>")
                            assert normal == ref.text.replace(missing[p], "<id>"), (where, got.text, ref.text)
                            echoed = got.text
                            for sent in variant.values():
                                echoed = echoed.replace(sent, "")
                            assert_no_names(echoed, a, where)
                covered.add((method, path))
                continue

            # Collection routes: the fields that name a resource (cursor, search, resume point, idempotency key)
            # given A's values show B nothing of A's.
            if method == "GET":
                names = query_names(route)
                if "all_tenants" in names:
                    r = await beta.get(path, params={"all_tenants": "true"})
                    assert r.status_code == 403, f"{path}?all_tenants=true for tenant B: {r.status_code}"
                if is_stream(route):
                    for kw in (
                        {"headers": {"Last-Event-ID": "0", "Accept": "text/event-stream"}},
                        {"params": {"after": str(min(a.event_ids) - 1)}, "headers": {"Accept": "text/event-stream"}},
                    ):
                        events = await read_sse(beta, path, seconds=2.0, **kw)
                        assert events, f"{path} sent tenant B none of its own events"
                        assert not {e["work_item_id"] for e in events} & set(a.work_items), path
                        assert not {e["id"] for e in events} & set(a.event_ids), path
                else:
                    tries: list[dict[str, str]] = [{}]
                    if "cursor" in names:
                        assert a.page_cursor
                        tries.append({"cursor": a.page_cursor})
                    if "q" in names:
                        tries += [{"q": wid} for wid in a.work_items]
                    for params_ in tries:
                        r = await beta.get(path, params=params_)
                        assert r.status_code in (200, 400, 403), (path, params_, r.text)
                        assert_no_names(r.text, a, f"tenant B: GET {path} {params_}")
                covered.add((method, path))
                continue

            if (method, path) == ("POST", "/v1/work-items"):
                # Idempotency keys are the tenant's own: A's key makes B a new item, never A's.
                r = await beta.post(
                    path, json=task_item({"answer": 3}), headers={"Idempotency-Key": SHARED_IDEMPOTENCY_KEY}
                )
                assert r.status_code == 202 and r.json()["created"] is True, r.text
                b.work_items.append(r.json()["id"])
                assert_no_names(r.text, a, f"tenant B: POST {path} with A's idempotency key")
            elif (method, path) == ("POST", "/v1/hotfix"):
                report = {"message": "boom", "repo": {"url": str(calc_repo), "ref": "main"}}
                r = await beta.post(path, json=report, headers={"Idempotency-Key": SHARED_IDEMPOTENCY_KEY})
                # 409 names B's own item of that key (submitted above), never A's.
                assert r.status_code in (202, 404, 409, 422), r.text
                assert_no_names(r.text, a, f"tenant B: POST {path} with A's idempotency key")
            elif (method, path) == ("POST", "/v1/webhooks"):
                r = await beta.post(path, json={"url": "http://127.0.0.1:9/b"})
                assert r.status_code == 201, r.text
                assert_no_names(r.text, a, f"tenant B: POST {path}")
            elif (method, path) == ("POST", "/v1/repositories"):
                r = await beta.post(path, json={"url": str(calc_repo)})
                assert_no_names(r.text, a, f"tenant B: POST {path} naming A's repository")
            else:
                raise AssertionError(f"unclassified route {method} {path}: say how tenant B may use it")
            covered.add((method, path))

    assert covered == {(m, p) for m, p, _r in routes}
    # Nothing B did changed A's resources.
    async with stack.client(stack.alpha) as alpha:
        item = (await alpha.get(f"/v1/work-items/{world.code_change}", params={"live": "false"})).json()
        assert item["state"] == "awaiting_review"
        for hook in a.webhooks:
            assert (await alpha.get(f"/v1/webhooks/{hook}")).status_code == 200
        for art in a.artifacts:
            assert (await alpha.get(f"/v1/work-items/{world.code_change}/artifacts/{art}")).status_code in (200, 404)
        assert (await alpha.get(f"/v1/work-items/{a.work_items[1]}")).json()["spec"]["idempotency_key"] == (
            SHARED_IDEMPOTENCY_KEY
        )


def fencing_leaks(obj: Any, path: str = "$") -> list[str]:
    out: list[str] = []
    if isinstance(obj, dict):
        if {"step", "attempt"} <= obj.keys():
            out.append(f"{path} (a rank)")
        for k, v in obj.items():
            if k in FENCING_FIELDS:
                out.append(f"{path}.{k}")
            out += fencing_leaks(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += fencing_leaks(v, f"{path}[{i}]")
    return out


async def test_no_response_stream_or_webhook_payload_carries_a_fencing_rank_or_token(
    stack: Stack, calc_repo: Path
) -> None:
    world = await build_world(stack, calc_repo)
    a = world.a
    seen_stale = False
    scanned = 0
    async with stack.client(stack.alpha) as alpha, stack.client(stack.admin) as admin:
        for method, path, route in app_routes(stack):
            if method != "GET" or not path.startswith("/v1"):
                continue
            params = path_params(path)
            if any(not owned_values(a, resource_kind(p, path)) for p in params):
                continue
            combos = [{p: owned_values(a, resource_kind(p, path))[0] for p in params}]
            if "work_item_id" in params:
                combos = [{**combos[0], "work_item_id": wid} for wid in a.work_items]
            for values in combos:
                target = fill(path, values)
                for who in (alpha, admin):
                    extra = {"all_tenants": "true"} if who is admin and "all_tenants" in query_names(route) else {}
                    if is_stream(route) or path.endswith("/events"):
                        events = await read_sse(
                            who, target, seconds=2.0, params=extra, headers={"Accept": "text/event-stream"}
                        )
                        for e in events:
                            scanned += 1
                            seen_stale |= e["type"] == "stale_write_rejected"
                            assert not fencing_leaks(e), (target, fencing_leaks(e), e)
                        if is_stream(route):
                            continue
                    r = await who.get(target, params=extra)
                    if not r.headers.get("content-type", "").startswith("application/json"):
                        continue
                    scanned += 1
                    body = r.json()
                    seen_stale |= '"stale_write_rejected"' in r.text
                    assert not fencing_leaks(body), (target, fencing_leaks(body))
    assert seen_stale, "the scan saw the rejected stale write's event"
    assert scanned > 20
    # The webhook payloads, exactly as the outbox will deliver them.
    async with stack.crew.store.session() as s:
        from sqlalchemy import select

        payloads = (await s.scalars(select(OutboxMessage.payload).where(OutboxMessage.tenant_id == a.tenant_id))).all()
    assert payloads
    for p in payloads:
        assert not fencing_leaks(p), p


async def test_same_idempotency_key_with_another_submission_is_409_and_the_same_replays_with_location(
    stack: Stack,
) -> None:
    async with stack.client() as c:
        key = {"Idempotency-Key": f"idem-{uuid.uuid4().hex[:8]}"}
        first = await c.post("/v1/work-items", json=task_item({"answer": 1}), headers=key)
        assert first.status_code == 202, first.text
        wid = first.json()["id"]
        assert first.headers["location"] == f"/v1/work-items/{wid}"
        assert (await c.get(first.headers["location"])).json()["id"] == wid

        # The same submission, spelled differently (key in the body, fields reordered, a default spelled out).
        same = {"agent": {"config": {"output": {"answer": 1}}, "name": "scripted"}, "input": {}, "kind": "task"}
        same |= {"labels": {}, "idempotency_key": key["Idempotency-Key"]}
        again = await c.post("/v1/work-items", json=same)
        assert again.status_code == 200, again.text
        assert again.json()["id"] == wid and again.json()["created"] is False
        assert again.headers["location"] == f"/v1/work-items/{wid}"

        other = await c.post("/v1/work-items", json=task_item({"answer": 2}), headers=key)
        assert other.status_code == 409, other.text
        assert other.headers["content-type"].startswith("application/problem+json")
        assert other.json()["code"] == "idempotency_conflict" and wid in other.json()["detail"]
        labelled = await c.post("/v1/work-items", json=task_item({"answer": 1}, labels={"x": "y"}), headers=key)
        assert labelled.status_code == 409 and labelled.json()["code"] == "idempotency_conflict"
        # Another route deriving its own submission shares the tenant's keys.
        report = {"message": "boom", "repo": {"url": "/nonexistent", "ref": "main"}}
        hotfix = await c.post("/v1/hotfix", json=report, headers=key)
        assert hotfix.status_code == 409 and hotfix.json()["code"] == "idempotency_conflict", hotfix.text

        # Racing first submissions with one key and different payloads: one item, the others conflict.
        race = {"Idempotency-Key": f"race-{uuid.uuid4().hex[:8]}"}
        results = await asyncio.gather(
            *(c.post("/v1/work-items", json=task_item({"answer": i}), headers=race) for i in range(4))
        )
        codes = sorted(r.status_code for r in results)
        assert codes == [202, 409, 409, 409], [(r.status_code, r.text) for r in results]
        items = (await c.get("/v1/work-items", params={"limit": 200})).json()["items"]
        assert sum(1 for i in items if i["spec"].get("idempotency_key") == race["Idempotency-Key"]) == 1


def _loopback() -> str:
    """A loopback address of its own (all of 127/8 reaches this host), so the test's buckets are its own."""
    return f"127.{random.randint(10, 250)}.{random.randint(1, 250)}.{random.randint(2, 250)}"


def _from(api: LiveApi, address: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=api.url, timeout=10, transport=httpx.AsyncHTTPTransport(local_address=address))


async def test_failed_authentication_is_rate_limited_per_client_address_across_api_processes(stack: Stack) -> None:
    settings = stack.api.settings.model_copy(update={"api_auth_failure_burst": 4, "api_auth_failure_rate_per_s": 0.02})
    first, second = LiveApi(settings).start(), LiveApi(settings).start()
    attacker, bystander = _loopback(), _loopback()
    bad = {"Authorization": "Bearer cw_" + "x" * 43}
    try:
        async with _from(first, attacker) as c:
            codes = [(await c.get("/v1/me", headers=bad)).status_code for _ in range(6)]
            assert codes == [401, 401, 401, 401, 429, 429], codes
            r = await c.get("/v1/work-items", headers=bad)
            assert r.status_code == 429 and r.json()["code"] == "rate_limited"
            assert r.headers["content-type"].startswith("application/problem+json")
            assert int(r.headers["retry-after"]) >= 1
            # While refused, the address gets no key checked at all (a right key too: documented).
            assert (await c.get("/v1/me", headers=stack.alpha.headers)).status_code == 429
        async with _from(second, attacker) as c:
            # The other API process shares the address's bucket.
            r = await c.get("/v1/me", headers=bad)
            assert r.status_code == 429 and r.json()["code"] == "rate_limited", r.text
        async with _from(first, bystander) as c:
            assert (await c.get("/v1/me", headers=bad)).status_code == 401
            assert (await c.get("/v1/me", headers=stack.alpha.headers)).status_code == 200
    finally:
        first.stop()
        second.stop()


async def test_per_key_limit_holds_across_two_api_processes_sharing_the_store(stack: Stack) -> None:
    options = ApiOptions(api_rate_per_s=0.05, api_rate_burst=6, webhook_delivery=False)
    one, two = LiveApi(stack.api.settings, options).start(), LiveApi(stack.api.settings, options).start()
    tenant = await make_tenant(stack.crew, "limited")
    try:
        async with (
            httpx.AsyncClient(base_url=one.url, timeout=10, headers=tenant.headers) as c1,
            httpx.AsyncClient(base_url=two.url, timeout=10, headers=tenant.headers) as c2,
        ):
            answers = [await (c1 if i % 2 == 0 else c2).get("/v1/me") for i in range(12)]
            codes = [r.status_code for r in answers]
            # One bucket of 6 for the key, whichever process answers (per process it would be 12 of 12).
            assert codes.count(200) == 6 and codes[:6] == [200] * 6, codes
            limited = [r for r in answers if r.status_code == 429]
            assert {r.url.port for r in limited} == {one.port, two.port}
            assert all(r.json()["code"] == "rate_limited" and int(r.headers["retry-after"]) >= 1 for r in limited)
            # Another key is unaffected.
            assert (await c1.get("/v1/me", headers=stack.beta.headers)).status_code == 200
    finally:
        one.stop()
        two.stop()
