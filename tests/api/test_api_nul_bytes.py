"""NUL (U+0000) in every place a client can put text: a clear 4xx or a stored value, never a server error.

PostgreSQL text columns refuse NUL outright (asyncpg: "invalid byte sequence for encoding UTF8: 0x00"), and jsonb
refuses the escape \\u0000; json accepts it. So a NUL that reaches a text column unchecked is a 500 with the
submission half done."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import Stack, task_item

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

NUL = "a\x00b"


def _bodies(repo: Path) -> list[tuple[str, dict[str, Any]]]:
    code = {
        "kind": "code_change",
        "repo": {"url": str(repo), "ref": "main"},
        "instruction": "Fix add()",
        "validation": {"command": ["python", "-m", "pytest", "-q"], "timeout_s": 60},
        "agent": {"name": "scripted", "config": {"attempts": []}},
    }
    return [
        ("idempotency key field", task_item(idempotency_key=NUL)),
        ("label key", task_item(labels={NUL: "v"})),
        ("label value", task_item(labels={"k": NUL})),
        ("input string", task_item(input={"q": NUL, NUL: 1})),
        ("agent name", {**task_item(), "agent": {"name": NUL, "config": {}}}),
        ("agent config", {**task_item(), "agent": {"name": "scripted", "config": {"output": {NUL: NUL}}}}),
        ("instruction", {**code, "instruction": NUL}),
        ("repo url", {**code, "repo": {"url": str(repo) + "\x00", "ref": "main"}}),
        ("repo ref", {**code, "repo": {"url": str(repo), "ref": "ma\x00in"}}),
        ("target branch", {**code, "target_branch": "x\x00y"}),
        ("junit path", {**code, "validation": {**code["validation"], "junit_path": "a\x00.xml"}}),
        ("test files", {**code, "validation": {**code["validation"], "test_files": ["t\x00.py"]}}),
        ("validation command", {**code, "validation": {**code["validation"], "command": ["python", NUL]}}),
        ("setup command", {**code, "environment": {"setup": [["pip", NUL]]}}),
    ]


# A lone surrogate can only arrive as a JSON escape (it is not UTF-8): sent as the raw body.
RAW = [
    ("lone surrogate", '{"kind": "task", "input": {}, "labels": {"k": "\\ud800"}}'),
    ("lone surrogate key", '{"kind": "task", "input": {"\\udfff": 1}}'),
    ("escaped NUL", '{"kind": "task", "input": {}, "idempotency_key": "k\\u0000"}'),
]


async def test_nul_or_a_lone_surrogate_anywhere_in_a_request_is_refused_with_its_place(
    stack: Stack, calc_repo: Path
) -> None:
    bad: list[str] = []
    async with stack.client() as raw:
        c = _Recorder(raw, bad)

        def expect(what: str, r: Any, status: int, code: str | None = None) -> None:
            got = r.json().get("code") if r.status_code else None
            if r.status_code != status or (code is not None and got != code):
                bad.append(f"{what}: {r.status_code} {r.text[:200]}")

        for name, body in _bodies(calc_repo):
            # Refused by the field's own rule where it has one (repo URLs, refs, paths), else as unstorable text.
            r = await c.post("/v1/work-items", json=body)
            expect(name, r, 422)
            if r.status_code == 422 and r.json()["code"] == "invalid_text":
                assert r.json()["errors"][0]["field"] == r.json()["detail"].split(":")[0], r.json()
        for name, raw_body in RAW:
            r = await c.post("/v1/work-items", content=raw_body, headers={"Content-Type": "application/json"})
            expect(name, r, 422, "invalid_text")
        for params in ({"search": NUL}, {"label": f"k={NUL}"}, {"state": NUL}, {"kind": NUL}, {"cursor": NUL}):
            expect(f"list {params}", await c.get("/v1/work-items", params=params), 400, "invalid_request")
        # Percent-encoded invalid UTF-8 (what would decode to a lone surrogate) is decoded with replacement.
        for q in ("search=%ED%A0%80", "label=k%3D%ED%B0%80", "search=%C0%80", "search=%FF"):
            r = await c.get(f"/v1/work-items?{q}")
            if r.status_code == 0 or r.status_code >= 500:
                bad.append(f"list ?{q}: {r.status_code} {r.text[:200]}")
        for path in ("/v1/work-items/a%00b", "/v1/work-items/wi_a%00b/events", "/v1/webhooks/a%00"):
            expect(f"GET {path}", await c.get(path), 400, "invalid_request")
        # An address literal needs no DNS: the URL passed the address policy and reached the store.
        expect("webhook url", await c.post("/v1/webhooks", json={"url": "http://1.1.1.1/h\x00"}), 422, "invalid_text")
        expect("webhook events", await c.post("/v1/webhooks", json={"url": "http://1.1.1.1/h", "events": [NUL]}), 422)
        expect("repository", await c.post("/v1/repositories", json={"url": str(calc_repo) + "\x00"}), 422)
        env = {"setup": [["python", "-c", "print(1)", NUL]]}
        r = await c.post("/v1/repositories", json={"url": str(calc_repo), "environment": env})
        expect("repository environment", r, 422, "invalid_text")
        r = await c.post("/v1/hotfix", json={"repo": {"url": str(calc_repo)}, "message": NUL})
        expect("hotfix", r, 422, "invalid_text")
        if r.status_code == 422 and r.json()["errors"][0]["field"] != "message":
            bad.append(f"hotfix names {r.json()['errors'][0]['field']}, not the report's field")
        r = await c.post("/v1/work-items/wi_none/review", json={"action": "reject", "comment": NUL})
        expect("review comment", r, 422, "invalid_text")
        # A cursor is base64: what it hides is checked when it is decoded.
        for hidden in ([1.0, NUL], [1.0, "\ud800"], [float("inf"), "wi_x"], [1.0, "x" * 65]):
            cursor = base64.urlsafe_b64encode(json.dumps(hidden).encode()).decode()
            expect(f"cursor {hidden!r:.40}", await c.get("/v1/work-items", params={"cursor": cursor}), 400)
        # Nested beyond what the serializer takes (it failed at ~300 levels).
        deep: Any = "leaf"
        for _ in range(300):
            deep = {"d": deep}
        expect("deep input", await c.post("/v1/work-items", json=task_item(input=deep)), 422, "too_deeply_nested")
        deep = "leaf"
        for _ in range(80):
            deep = [deep]
        r = await c.post("/v1/work-items", json={**task_item(), "agent": {"name": "scripted", "config": {"x": deep}}})
        expect("deep agent config", r, 422, "too_deeply_nested")
        # Above the events table's bigint: the stream failed its first read and the browser reconnected forever.
        r = await c.get("/v1/events/stream", headers={"Last-Event-ID": "99999999999999999999"})
        expect("Last-Event-ID above int64", r, 400, "invalid_last_event_id")
        # Nothing of the refused submissions was stored.
        listed = (await c.get("/v1/work-items", params={"limit": 100})).json()["items"]
        if listed:
            bad.append(f"{len(listed)} refused submission(s) stored anyway")
    assert not bad, "\n".join(bad)


class _Recorder:
    """The client, with a request that fails outright (the in-process app raised) recorded as a server error."""

    def __init__(self, c: Any, bad: list[str]) -> None:
        self.c, self.bad = c, bad

    async def post(self, path: str, **kw: Any) -> Any:
        return await self._call("POST", path, **kw)

    async def get(self, path: str, **kw: Any) -> Any:
        return await self._call("GET", path, **kw)

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            # A fresh connection each time: after a 500 the server closes the one it answered on.
            async with httpx.AsyncClient(base_url=self.c.base_url, headers=self.c.headers, timeout=30) as one:
                return await one.request(method, path, **kw)
        except Exception as exc:
            self.bad.append(f"{method} {path!r} {kw}: raised {type(exc).__name__}: {str(exc)[:160]}")
            return _Failed()


class _Failed:
    status_code = 0
    text = ""


async def test_a_registration_stored_before_the_check_is_refused_at_submission(stack: Stack, calc_repo: Path) -> None:
    """A repository registered with a NUL in its environment before registrations were checked: every code change on
    it was accepted, stored with the NUL and failed its sandbox three times. Now the submission is refused and says
    whose text it is."""
    from crewwork.models import EnvironmentSpec
    from crewwork.repos.tenancy import Registration, RepositoryRegistry

    principal = await stack.crew.store.authenticate(stack.alpha.key)
    assert principal is not None
    env = EnvironmentSpec.model_validate({"setup": [["python", "-c", "print(1)", NUL]]})
    registry = RepositoryRegistry(stack.crew.store, stack.crew.settings)
    await registry.register(principal.tenant_id, Registration(url=str(calc_repo), environment=env))
    body = {
        "kind": "code_change",
        "repo": {"url": str(calc_repo), "ref": "main"},
        "instruction": "Fix add()",
        "validation": {"command": ["python", "-m", "pytest", "-q"], "timeout_s": 60},
        "agent": {"name": "scripted", "config": {"attempts": []}},
    }
    async with stack.client() as c:
        r = await c.post("/v1/work-items", json=body)
        assert r.status_code == 422 and r.json()["code"] == "invalid_text", r.text
        assert "registered environment" in r.json()["detail"] and r.json()["errors"][0]["field"] == "environment"
        assert (await c.get("/v1/work-items")).json()["items"] == []
