"""Repositories owned by tenants (issue 14, point 1), black box over the real API, Temporal and PostgreSQL.

Two tenants, each with its own repository root, and no registration on first use (the production setting): tenant
beta tries to reach alpha's repository by id, by every spelling of its URL, and by registering paths that lead
there (outside its root, through symlinks, `/proc/self/cwd`, `..`). Every attempt is the same 404 as a missing
repository, or a 422 at registration; nothing is stored for beta and no workflow starts."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from crewwork.cli.demo import BUGGY, RIGHT, TEST
from crewwork.config import Settings
from tests.api.conftest import LiveApi, Stack, Tenant, make_tenant, wait_state
from tests.conftest import Crew, make_repo

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

VALIDATION = {"command": ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"], "timeout_s": 60}
CALC = {"calc.py": BUGGY, "tests/test_calc.py": TEST, "conftest.py": ""}


@dataclass
class Roots:
    alpha: Path
    beta: Path
    outside: Path


@dataclass
class Tenancy:
    stack: Stack
    roots: Roots
    alpha_repo: Path


def change(repo: dict[str, Any], **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "code_change",
        "repo": repo,
        "instruction": "Fix add()",
        "validation": VALIDATION,
        "agent": {"name": "scripted", "config": {"files": {"calc.py": RIGHT}}},
    }
    body.update(kw)
    return body


@pytest.fixture
async def tenancy(api_settings: Settings, api_crew: Crew, tmp_path: Path) -> AsyncIterator[Tenancy]:
    """Tenants of this test's own, each with a repository root of its own, and an API of this test's own that
    registers nothing on first use and knows these roots, on the module's crew."""
    roots = Roots(tmp_path / "roots" / "alpha", tmp_path / "roots" / "beta", tmp_path / "elsewhere")
    for p in (roots.alpha, roots.beta, roots.outside):
        p.mkdir(parents=True)
    alpha_repo = make_repo(roots.alpha / "calc", CALC)
    crew = await api_crew.with_new_tenant()
    alpha = await make_tenant(crew, "alpha")
    beta = await make_tenant(crew, "beta")
    admin = await make_tenant(crew, "ops", ("admin",))
    settings = api_settings.model_copy(
        update={
            "auto_register_repos": False,
            "tenant_repo_roots": {alpha.name: [roots.alpha], beta.name: [roots.beta]},
        }
    )
    api = LiveApi(settings).start()
    try:
        yield Tenancy(Stack(crew, api, alpha, beta, admin), roots, alpha_repo)
    finally:
        api.stop()


async def register(t: Tenancy, who: Tenant, url: str, **kw: Any) -> Any:
    async with t.stack.client(who) as c:
        return await c.post("/v1/repositories", json={"url": url, **kw})


def without_ids(body: dict[str, Any]) -> dict[str, Any]:
    return {
        k: re.sub(r"repo_[0-9a-f]+|nope_[0-9a-z]+", "<id>", v) if isinstance(v, str) else v for k, v in body.items()
    }


async def test_register_get_list_delete_and_run_a_change_by_id(tenancy: Tenancy) -> None:
    t = tenancy
    r = await register(t, t.stack.alpha, str(t.alpha_repo), default_ref="main", protect_paths=["conftest.py"])
    assert r.status_code == 201, r.text
    repo = r.json()
    assert r.headers["location"] == f"/v1/repositories/{repo['id']}"
    assert repo["url"] == str(t.alpha_repo.resolve()) and repo["default_ref"] == "main"
    assert repo["protect_paths"] == ["conftest.py"] and repo["credential"] is None
    again = await register(t, t.stack.alpha, str(t.alpha_repo) + "/")
    assert again.status_code == 409 and again.json()["code"] == "repository_exists"
    async with t.stack.client(t.stack.alpha) as c:
        assert [x["id"] for x in (await c.get("/v1/repositories")).json()["items"]] == [repo["id"]]
        assert (await c.get(f"/v1/repositories/{repo['id']}")).json()["url"] == repo["url"]
        # By id, no ref: the repository's default ref; what is stored and run is the registration.
        sub = await c.post("/v1/work-items", json=change({"id": repo["id"]}))
        assert sub.status_code == 202, sub.text
        item = await wait_state(c, sub.json()["id"], {"succeeded", "failed", "dead"}, timeout_s=180)
        assert item["state"] == "succeeded", item["reason"]
        assert item["spec"]["repo"] == {"id": repo["id"], "url": repo["url"], "ref": "main", "pull_request": None}
        assert "conftest.py" in item["spec"]["validation"]["protect"]["paths"]
        assert item["repo"] == repo["url"]
        # Unregistering keeps what ran; the repository can no longer be named.
        assert (await c.delete(f"/v1/repositories/{repo['id']}")).status_code == 204
        gone = await c.post("/v1/work-items", json=change({"id": repo["id"]}))
        assert gone.status_code == 404
        assert (await c.get("/v1/repositories")).json()["items"] == []


async def test_another_tenants_repository_is_the_same_404_as_a_missing_one(tenancy: Tenancy) -> None:
    t = tenancy
    repo = (await register(t, t.stack.alpha, str(t.alpha_repo))).json()
    path = repo["url"]
    async with t.stack.client(t.stack.beta) as c:
        missing = await c.get("/v1/repositories/repo_000000000000000000000000")
        foreign = await c.get(f"/v1/repositories/{repo['id']}")
        assert missing.status_code == foreign.status_code == 404
        assert without_ids(missing.json()) == without_ids(foreign.json())
        assert (await c.delete(f"/v1/repositories/{repo['id']}")).status_code == 404
        assert (await c.get("/v1/repositories")).json()["items"] == []

        by_missing_id = await c.post("/v1/work-items", json=change({"id": "repo_000000000000000000000000"}))
        by_id = await c.post("/v1/work-items", json=change({"id": repo["id"]}))
        assert by_missing_id.status_code == by_id.status_code == 404
        assert without_ids(by_missing_id.json()) == without_ids(by_id.json())

        unregistered = await c.post("/v1/work-items", json=change({"url": str(t.roots.beta / "nothing-here")}))
        assert unregistered.status_code == 404
        parent = Path(path).parent
        for spelling in (
            path,
            path + "/",
            path + "//",
            f"file://{path}",
            f"file://localhost{path}",
            f"{parent}/./calc",
            f"{parent}/../{parent.name}/calc",
            f"{t.roots.beta}/../alpha/calc",
            "/proc/self/cwd",
            f"/proc/self/root{path}",
            os.path.relpath(path, t.roots.beta),
            "../alpha/calc",
        ):
            r = await c.post("/v1/work-items", json=change({"url": spelling}))
            assert r.status_code == 404, (spelling, r.status_code, r.text)
            assert r.json() == unregistered.json(), spelling
        # Naming alpha's id with beta's own spelling of the URL changes nothing.
        r = await c.post("/v1/work-items", json=change({"id": repo["id"], "url": path}))
        assert r.status_code == 404 and without_ids(r.json()) == without_ids(by_id.json())
        assert (await c.get("/v1/work-items")).json()["items"] == []
    # Alpha's own spellings of its URL all name it.
    async with t.stack.client(t.stack.alpha) as c:
        for spelling in (path + "/", f"file://{path}", f"{Path(path).parent}/../alpha/calc"):
            r = await c.post("/v1/work-items", json=change({"url": spelling, "ref": "main"}))
            assert r.status_code == 202, (spelling, r.text)


async def test_paths_outside_the_tenants_roots_cannot_be_registered(tenancy: Tenancy) -> None:
    t = tenancy
    (t.roots.beta / "link").symlink_to(t.alpha_repo)
    (t.roots.beta / "cwd").symlink_to("/proc/self/cwd")
    (t.roots.beta / "parent").symlink_to(t.roots.alpha)
    outside = make_repo(t.roots.outside / "calc", CALC)
    for url in (
        str(t.alpha_repo),
        f"file://{t.alpha_repo}",
        str(t.roots.beta / "link"),
        str(t.roots.beta / "link") + "/",
        str(t.roots.beta / "parent" / "calc"),
        f"{t.roots.beta}/../alpha/calc",
        "../alpha/calc",
        str(t.roots.beta / "cwd"),
        "/proc/self/cwd",
        "/proc/self/root" + str(t.alpha_repo),
        "/../proc/self/cwd",
        str(outside),
        "/",
    ):
        r = await register(t, t.stack.beta, url)
        assert r.status_code == 422, (url, r.status_code, r.text)
        assert r.json()["code"] == "invalid_repository" and r.json()["errors"][0]["field"] == "url"
    async with t.stack.client(t.stack.beta) as c:
        assert (await c.get("/v1/repositories")).json()["items"] == []
    # Its own repository under its root registers.
    own = make_repo(t.roots.beta / "mine", CALC)
    assert (await register(t, t.stack.beta, str(own))).status_code == 201


async def test_a_registered_path_swapped_for_a_symlink_is_refused_at_submission(tenancy: Tenancy) -> None:
    t = tenancy
    own = make_repo(t.roots.beta / "mine", CALC)
    repo = (await register(t, t.stack.beta, str(own))).json()
    own.rename(t.roots.beta / "moved")
    own.symlink_to(t.alpha_repo)
    async with t.stack.client(t.stack.beta) as c:
        r = await c.post("/v1/work-items", json=change({"id": repo["id"], "ref": "main"}))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "repo", r.text
    assert "no longer usable" in r.json()["detail"]


async def test_remote_url_variants_never_reach_another_tenants_repository(tenancy: Tenancy, tmp_path: Path) -> None:
    from tests.repos.servers import GitDaemon, bare_from

    t = tenancy
    bare_from(t.alpha_repo, tmp_path / "served" / "acme" / "calc.git")
    with GitDaemon(tmp_path / "served", tmp_path / "git-daemon.log") as daemon:
        url = daemon.url("acme/calc.git")
        r = await register(t, t.stack.alpha, url, default_ref="main")
        assert r.status_code == 201, r.text
        host = f"127.0.0.1:{daemon.port}"
        async with t.stack.client(t.stack.beta) as c:
            baseline = await c.post("/v1/work-items", json=change({"url": f"git://{host}/acme/other.git"}))
            assert baseline.status_code == 404
            for spelling in (
                url,
                url + "/",
                f"GIT://{host}/acme/calc.git",
                f"git://{host}//acme/calc.git",
                f"git://{host}:9418/acme/calc.git".replace(f":{daemon.port}:9418", f":{daemon.port}"),
                f"git://localhost:{daemon.port}/acme/calc.git",
                f"git://{host}/acme/calc",
                f"git://{host}/acme/./calc.git",
            ):
                r = await c.post("/v1/work-items", json=change({"url": spelling}))
                assert r.status_code in (404, 422), (spelling, r.text)
                if r.status_code == 404:
                    assert r.json() == baseline.json(), spelling
            assert (await c.get("/v1/work-items")).json()["items"] == []
        async with t.stack.client(t.stack.alpha) as c:
            for spelling in (url + "/", f"GIT://{host}/acme/calc.git"):
                r = await c.post("/v1/work-items", json=change({"url": spelling}))
                assert r.status_code == 202, (spelling, r.text)
                assert r.json()["id"]


async def test_credentials_are_named_checked_and_never_shown(tenancy: Tenancy, tmp_path: Path) -> None:
    t = tenancy
    async with t.stack.client(t.stack.alpha) as c:
        r = await c.post(
            "/v1/repositories", json={"url": "https://git.example.invalid/acme/x.git", "credential": "nope"}
        )
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "credential", r.text
        r = await c.post("/v1/repositories", json={"url": str(t.alpha_repo), "credential": "nope"})
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "credential", r.text
        # The API has no field for a secret at all.
        r = await c.post("/v1/repositories", json={"url": str(t.alpha_repo), "token": "s3cret"})
        assert r.status_code == 422 and r.json()["code"] == "invalid_request"


async def test_an_operator_registers_for_any_tenant_and_a_tenant_for_none_other(tenancy: Tenancy) -> None:
    t = tenancy
    async with t.stack.client(t.stack.beta) as c:
        r = await c.post("/v1/repositories", params={"tenant": t.stack.alpha.name}, json={"url": str(t.alpha_repo)})
        assert r.status_code == 403
        assert (await c.get("/v1/repositories", params={"all_tenants": "true"})).status_code == 403
    async with t.stack.client(t.stack.admin) as c:
        r = await c.post("/v1/repositories", params={"tenant": t.stack.alpha.name}, json={"url": str(t.alpha_repo)})
        assert r.status_code == 201, r.text
        # The operator acts under the tenant's roots too.
        r2 = await c.post("/v1/repositories", params={"tenant": t.stack.beta.name}, json={"url": str(t.alpha_repo)})
        assert r2.status_code == 422
        listed = (await c.get("/v1/repositories", params={"tenant": t.stack.alpha.name})).json()["items"]
        assert [x["id"] for x in listed] == [r.json()["id"]]
    async with t.stack.client(t.stack.alpha) as c:
        assert [x["id"] for x in (await c.get("/v1/repositories")).json()["items"]] == [r.json()["id"]]


async def test_the_dev_default_registers_local_repositories_on_first_use(stack: Stack, tmp_path: Path) -> None:
    """The test suite's default (CREWWORK_AUTO_REGISTER_REPOS, as `crewwork dev` and the demo set it): no setup."""
    repo = make_repo(tmp_path / "dev-calc", CALC)
    async with stack.client() as c:
        r = await c.post("/v1/work-items", json=change({"url": str(repo), "ref": "main"}))
        assert r.status_code == 202, r.text
        [registered] = (await c.get("/v1/repositories")).json()["items"]
        assert registered["url"] == str(repo.resolve()) and registered["auto_registered"] is True
        again = await c.post("/v1/work-items", json=change({"url": str(repo) + "/", "ref": "main"}))
        assert again.status_code == 202
        assert len((await c.get("/v1/repositories")).json()["items"]) == 1
    async with stack.client(stack.beta) as c:
        # Another tenant's first use registers its own; it never sees alpha's registration.
        assert (await c.post("/v1/work-items", json=change({"url": str(repo), "ref": "main"}))).status_code == 202
        [mine] = (await c.get("/v1/repositories")).json()["items"]
        assert mine["id"] != registered["id"]


def _cli(t: Tenancy, who: Tenant, *argv: str) -> Any:
    import json
    import subprocess
    import sys

    env = {**os.environ, "CREWWORK_API_URL": t.stack.api.url, "CREWWORK_API_KEY": who.key}
    res = subprocess.run(
        [sys.executable, "-m", "crewwork", "--json", *argv], env=env, capture_output=True, text=True, timeout=60
    )
    return res.returncode, (json.loads(res.stdout) if res.stdout.strip() else None), res.stderr


async def test_cli_repos_add_list_remove_and_an_operator_acting_for_a_tenant(tenancy: Tenancy) -> None:
    import asyncio

    t = tenancy
    checks = t.roots.outside / "checks.json"
    checks.write_text('[{"name": "lint", "command": ["python", "-m", "pyflakes", "."]}]')
    rc, _out, err = await asyncio.to_thread(
        _cli, t, t.stack.alpha, "repos", "add", str(t.alpha_repo), "--checks-file", str(t.roots.outside / "none.json")
    )
    assert rc != 0 and "none.json" in err and "Traceback" not in err, err
    rc, repo, err = await asyncio.to_thread(
        _cli,
        t,
        t.stack.admin,
        "repos",
        "add",
        str(t.alpha_repo),
        "--ref",
        "main",
        "--tenant",
        t.stack.alpha.name,
        "--checks-file",
        str(checks),
    )
    assert rc == 0, err
    assert repo["url"] == str(t.alpha_repo.resolve()) and repo["default_ref"] == "main"
    assert [c["name"] for c in repo["checks"]] == ["lint"]
    rc, rows, err = await asyncio.to_thread(_cli, t, t.stack.alpha, "repos", "list")
    assert rc == 0 and [r["id"] for r in rows] == [repo["id"]], err
    rc, _out, err = await asyncio.to_thread(_cli, t, t.stack.beta, "repos", "add", str(t.alpha_repo))
    assert rc != 0 and "root" in err, err
    rc, _out, err = await asyncio.to_thread(_cli, t, t.stack.beta, "repos", "remove", repo["id"])
    assert rc != 0, err
    rc, _out, err = await asyncio.to_thread(_cli, t, t.stack.alpha, "repos", "remove", repo["id"])
    assert rc == 0, err
    rc, rows, err = await asyncio.to_thread(_cli, t, t.stack.alpha, "repos", "list")
    assert rc == 0 and rows == [], err


async def test_a_tenant_registers_at_most_the_operators_number_of_repositories(tenancy: Tenancy) -> None:
    t = tenancy
    api = LiveApi(t.stack.api.settings.model_copy(update={"max_repositories_per_tenant": 2})).start()
    try:
        repos = [make_repo(t.roots.alpha / f"r{i}", CALC) for i in range(3)]
        headers = {"Authorization": f"Bearer {t.stack.alpha.key}"}
        async with httpx.AsyncClient(base_url=api.url, headers=headers, timeout=30) as c:
            first = [await c.post("/v1/repositories", json={"url": str(r)}) for r in repos[:2]]
            assert [r.status_code for r in first] == [201, 201]
            over = await c.post("/v1/repositories", json={"url": str(repos[2])})
            assert over.status_code == 409 and over.json()["code"] == "too_many_repositories", over.text
            assert len((await c.get("/v1/repositories")).json()["items"]) == 2
            assert (await c.delete(f"/v1/repositories/{first[0].json()['id']}")).status_code == 204
            assert (await c.post("/v1/repositories", json={"url": str(repos[2])})).status_code == 201
        # The cap is per tenant: beta's first registration is not refused for alpha's.
        beta_repo = make_repo(t.roots.beta / "b", CALC)
        async with httpx.AsyncClient(
            base_url=api.url, headers={"Authorization": f"Bearer {t.stack.beta.key}"}, timeout=30
        ) as c:
            assert (await c.post("/v1/repositories", json={"url": str(beta_repo)})).status_code == 201
    finally:
        api.stop()


async def test_a_registrations_checks_run_on_every_item_and_an_item_replaces_one_by_name(tenancy: Tenancy) -> None:
    t = tenancy
    registered = [
        {"name": "lint", "command": ["sh", "-c", "exit 3"]},
        {"name": "shape", "command": ["python", "-c", "import calc"], "required": False},
    ]
    bad = await register(t, t.stack.alpha, str(t.alpha_repo), checks=[registered[0], registered[0]])
    assert bad.status_code == 422 and "lint repeated" in bad.text, bad.text
    r = await register(t, t.stack.alpha, str(t.alpha_repo), default_ref="main", checks=registered)
    assert r.status_code == 201, r.text
    repo = r.json()
    assert [c["name"] for c in repo["checks"]] == ["lint", "shape"]
    async with t.stack.client(t.stack.alpha) as c:
        # The registration's failing lint fails the item: no item escapes the repository's checks.
        sub = await c.post("/v1/work-items", json=change({"id": repo["id"]}, budget={"max_attempts": 1}))
        assert sub.status_code == 202, sub.text
        item = await wait_state(c, sub.json()["id"], {"succeeded", "failed", "dead"}, timeout_s=180)
        assert item["state"] == "failed", item["reason"]
        first = item["attempts"][0]
        assert first["validation"]["cause"] == "check_failed" and "`lint`" in first["reason"], first
        assert [ch["name"] for ch in item["spec"]["validation"]["checks"]] == ["lint", "shape"]
        # An item's check of the same name replaces the registration's; its own others come after.
        own = {**VALIDATION, "checks": [{"name": "extra", "command": ["true"]}, {"name": "lint", "command": ["true"]}]}
        sub = await c.post("/v1/work-items", json=change({"id": repo["id"]}, validation=own))
        item = await wait_state(c, sub.json()["id"], {"succeeded", "failed", "dead"}, timeout_s=180)
        assert item["state"] == "succeeded", item["reason"]
        checks = item["spec"]["validation"]["checks"]
        assert [(ch["name"], ch["command"]) for ch in checks] == [
            ("lint", ["true"]),
            ("shape", ["python", "-c", "import calc"]),
            ("extra", ["true"]),
        ]
        # Together they must still be one valid declaration: a clash is a 422 naming it, and nothing runs.
        clash = {**VALIDATION, "checks": [{"name": f"c{i}", "command": ["true"]} for i in range(7)]}
        refused = await c.post("/v1/work-items", json=change({"id": repo["id"]}, validation=clash))
        assert refused.status_code == 422, refused.text
        assert "registered checks" in refused.text and "validation.checks" in refused.text


async def test_stored_checks_or_environment_this_release_refuses_are_shown_as_stored_and_refuse_items(
    tenancy: Tenancy,
) -> None:
    """A registration's checks or environment stored under another release's rules (a name, a key this release does not take): the
    repository is still listed and shown (never a 500), and a work item of it is refused with a 422 that says so."""
    from sqlalchemy import update

    from crewwork.store.tables import Repository

    t = tenancy
    r = await register(
        t, t.stack.alpha, str(t.alpha_repo), default_ref="main", checks=[{"name": "lint", "command": ["true"]}]
    )
    assert r.status_code == 201, r.text
    repo = r.json()
    stored = [{"name": "Not A Name", "command": ["true"]}]
    async with t.stack.crew.store.session() as s:
        await s.execute(update(Repository).where(Repository.id == repo["id"]).values(checks=stored))
    async with t.stack.client(t.stack.alpha) as c:
        one = await c.get(f"/v1/repositories/{repo['id']}")
        assert one.status_code == 200, one.text
        assert one.json()["checks"] == stored
        listed = await c.get("/v1/repositories")
        assert listed.status_code == 200 and any(x["checks"] == stored for x in listed.json()["items"]), listed.text
        refused = await c.post("/v1/work-items", json=change({"id": repo["id"]}))
        assert refused.status_code == 422, refused.text
        # The same for an environment stored under other rules (a key this release does not know).
        env = {"python": "python3", "retired_option": True}
        async with t.stack.crew.store.session() as s:
            await s.execute(update(Repository).where(Repository.id == repo["id"]).values(checks=None, environment=env))
        one = await c.get(f"/v1/repositories/{repo['id']}")
        assert one.status_code == 200 and one.json()["environment"] == env, one.text
        refused = await c.post("/v1/work-items", json=change({"id": repo["id"]}))
        assert refused.status_code == 422 and "register the repository again" in refused.text, refused.text
        assert refused.json()["errors"][0]["field"] == "environment", refused.text
