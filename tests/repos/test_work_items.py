"""Work items on remote repositories end to end (real Temporal, PostgreSQL, bwrap, git servers on loopback): served
over git://, http:// with basic auth and ssh:// with a key, landed by a compare-and-swap push, a pull request opened
on a local forge, clear `failed` causes for unreachable remotes and conflicting writers, and a credential that
never appears in the store, the events, the artifacts, Temporal's history, the logs or any error message."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from crewwork.cli.demo import RIGHT, WRONG
from crewwork.config.repos import ForgeConfig, RepoCredential
from crewwork.models import ReviewDecision
from crewwork.temporal.devserver import DevServer, free_port
from tests.conftest import ApiServer, Crew, make_settings, running_crew
from tests.fakes.github_server import FakeGitHub
from tests.integration.test_lifecycle import VALIDATION
from tests.repos.conftest import Served
from tests.repos.servers import GitDaemon, SmartHttp, Sshd, git

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


def item(url: str, steps: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": "code_change",
        "repo": {"url": url, "ref": "main"},
        "instruction": "Fix add() so the tests pass",
        "validation": VALIDATION,
        "agent": {"name": "scripted", "config": {"attempts": steps}},
        "budget": {"max_attempts": 3},
    }
    spec.update(kw)
    return spec


@pytest.fixture
def forge_token(secret_dir: Path) -> str:
    return "ghp_" + "f0" * 18


@pytest.fixture
def forge(served: Served, forge_token: str) -> Iterator[FakeGitHub]:
    def exists(owner: str, repo: str, branch: str) -> bool:
        bare = served.root / owner / f"{repo}.git"
        return bare.is_dir() and bool(
            git(bare, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False)
        )

    with FakeGitHub(token=forge_token, branch_exists=exists) as f:
        yield f


@pytest.fixture
async def remote_crew(
    tmp_path: Path,
    temporal_server: DevServer,
    pg_url: str,
    sandbox_backend: str,
    secret_dir: Path,
    http_password: str,
    smart_http: SmartHttp,
    forge: FakeGitHub,
    forge_token: str,
) -> AsyncIterator[Crew]:
    (secret_dir / "http-token").write_text(http_password + "\n")
    (secret_dir / "forge-token").write_text(forge_token + "\n")
    http_scope = f"http://127.0.0.1:{smart_http.port}/"
    settings = make_settings(
        tmp_path / "data",
        temporal_server,
        pg_url,
        sandbox_backend=sandbox_backend,
        repo_credentials={
            "served-http": RepoCredential(
                kind="https_token", match=[http_scope], secret_file=secret_dir / "http-token", username="crew"
            ),
            "forge": RepoCredential(
                kind="https_token", match=[forge.api_url + "/"], secret_file=secret_dir / "forge-token"
            ),
        },
        forges=[ForgeConfig(match=[http_scope + "acme/"], api_url=forge.api_url, credential="forge")],
    )
    async with running_crew(settings) as c:
        yield c


async def test_work_item_over_git_daemon_lands_by_push(remote_crew: Crew, daemon: GitDaemon, served: Served) -> None:
    main = git(served.bare, "rev-parse", "main")
    wid = await remote_crew.submit(
        item(daemon.url(served.name), [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": RIGHT}}])
    )
    result = await remote_crew.result(wid)
    assert result.state == "succeeded", result.reason
    assert [a.verdict for a in result.attempts] == ["failed", "passed"]
    branch = f"crewwork/{wid}"
    assert git(served.bare, "rev-parse", f"refs/heads/{branch}") == result.landed_commit
    assert git(served.bare, "show", f"{branch}:calc.py") == RIGHT.strip()
    assert git(served.bare, "rev-parse", f"{branch}^") == main
    assert git(served.bare, "rev-parse", "main") == main
    row = await remote_crew.store.get_work_item(wid)
    assert row is not None and row.repo_url == daemon.url(served.name)
    mirrors = list(remote_crew.settings.resolved_mirror_dir().glob("*.git"))
    assert len(mirrors) == 1, "every pool on this host shares one mirror per repository"
    assert not list((mirrors[0] / "worktrees").glob("*")) if (mirrors[0] / "worktrees").exists() else True
    assert result.pull_request_url is None, "no forge is configured for git://"


async def test_work_item_over_smart_http_opens_a_pull_request_and_never_leaks_the_credential(
    remote_crew: Crew,
    smart_http: SmartHttp,
    served: Served,
    forge: FakeGitHub,
    http_password: str,
    forge_token: str,
    pg_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from crewwork.store.outbox import OutboxStore

    caplog.set_level(logging.DEBUG)
    _kid, key = await remote_crew.store.create_api_key("pr-tenant")
    remote_crew.tenant_id = await remote_crew.store.ensure_tenant("pr-tenant")
    hook = await OutboxStore(remote_crew.store).create_webhook(
        remote_crew.tenant_id, "http://127.0.0.1:9/hook", ["work_item.state_changed"]
    )
    url = smart_http.url(served.name)
    spec = item(url, [{"files": {"calc.py": RIGHT}}], repo={"url": url, "ref": "main", "pull_request": {"draft": True}})
    wid = await remote_crew.submit(spec)
    result = await remote_crew.result(wid)
    assert result.state == "succeeded", result.reason
    branch = f"crewwork/{wid}"
    assert git(served.bare, "rev-parse", f"refs/heads/{branch}") == result.landed_commit
    # The pull request: opened once, as a draft, from the delivery branch onto the item's ref.
    prs = forge.pulls[("acme", "calc")]
    assert len(prs) == 1 and prs[0]["draft"] and prs[0]["head"]["ref"] == branch and prs[0]["base"]["ref"] == "main"
    assert result.pull_request_url == prs[0]["html_url"]
    assert prs[0]["html_url"] in result.reason
    landed = [e for e in await remote_crew.store.list_events(wid) if e.type == "landed"]
    assert len(landed) == 1 and landed[0].data["pull_request_url"] == prs[0]["html_url"]
    row = await remote_crew.store.get_work_item(wid)
    assert row is not None and (row.result or {}).get("pull_request_url") == prs[0]["html_url"]
    # The webhook of the final state change names the pull request, and so does the API's view of the item.
    deliveries = await OutboxStore(remote_crew.store).deliveries(remote_crew.tenant_id, hook.id)
    succeeded = [d.payload for d in deliveries if d.payload.get("state") == "succeeded"]
    assert succeeded and succeeded[0]["pull_request_url"] == prs[0]["html_url"]
    assert succeeded[0]["delivery_branch"] == branch and succeeded[0]["landed_commit"] == result.landed_commit
    async with ApiServer(remote_crew.settings) as api, api.client(key) as c:
        view = (await c.get(f"/v1/work-items/{wid}")).json()
    assert view["pull_request_url"] == prs[0]["html_url"]
    # Every HTTP request to the git server carried the credential; nothing else did.
    assert any(r.authorization for r in smart_http.requests)
    await _assert_nowhere(remote_crew, wid, pg_url, caplog, [http_password, forge_token], result)


async def _assert_nowhere(
    crew: Crew, wid: str, pg_url: str, caplog: pytest.LogCaptureFixture, secrets: list[str], result: Any
) -> None:
    """The secrets appear in no stored row (a full pg_dump), no event, no artifact, no Temporal history event, no
    log record, no file under the data directory, and not in the result."""
    import base64

    needles = [*secrets, *(base64.b64encode(f"crew:{s}".encode()).decode() for s in secrets)]
    dump = subprocess.run(["pg_dump", "--data-only", pg_url.replace("+asyncpg", "")], capture_output=True, text=True)
    assert dump.returncode == 0, dump.stderr
    haystacks = {"pg_dump": dump.stdout, "result": result.model_dump_json()}
    for e in await crew.store.list_events(wid):
        haystacks[f"event {e.type}"] = str(e.data)
    for a in await crew.store.list_artifacts(wid):
        haystacks[f"artifact {a.name}"] = ((await crew.store.artifact_content(a.id)) or b"").decode(errors="replace")
    row = await crew.store.get_work_item(wid)
    assert row is not None
    history = await crew.client.get_workflow_handle(row.workflow_id).fetch_history()
    haystacks["temporal history"] = history.to_json()
    haystacks["logs"] = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    for p in crew.settings.data_dir.rglob("*"):
        if p.is_file() and not p.is_symlink():
            haystacks[f"file {p}"] = p.read_bytes().decode(errors="replace")
    for name, text in haystacks.items():
        for needle in needles:
            assert needle not in text, f"a credential leaked into {name}"
    assert len(haystacks) > 10


async def test_credentials_pasted_into_the_url_are_refused_and_never_echoed(
    remote_crew: Crew, smart_http: SmartHttp, served: Served, http_password: str
) -> None:
    _kid, key = await remote_crew.store.create_api_key("paster")
    pasted = smart_http.url(served.name).replace("http://", f"http://crew:{http_password}@")
    async with ApiServer(remote_crew.settings) as api, api.client(key) as c:
        r = await c.post("/v1/work-items", json=item(pasted, [{"files": {"calc.py": RIGHT}}]))
    assert r.status_code == 422, r.text
    assert http_password not in r.text and "credentials" in r.text
    assert "***@" in r.text, "the message shows the URL with its user info masked"


async def test_work_item_over_ssh_with_an_operator_key(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, sshd: Sshd, served: Served
) -> None:
    settings = make_settings(
        tmp_path / "data-ssh",
        temporal_server,
        pg_url,
        sandbox_backend=sandbox_backend,
        ssh_known_hosts=sshd.known_hosts,
        repo_credentials={
            "deploy": RepoCredential(
                kind="ssh_key", match=[f"ssh://root@127.0.0.1:{sshd.port}/"], secret_file=sshd.client_key
            )
        },
    )
    async with running_crew(settings) as crew:
        wid = await crew.submit(item(sshd.url(served.bare), [{"files": {"calc.py": RIGHT}}]))
        result = await crew.result(wid)
        assert result.state == "succeeded", result.reason
        assert git(served.bare, "rev-parse", f"refs/heads/crewwork/{wid}") == result.landed_commit
        key_body = next(ln for ln in sshd.client_key.read_text().splitlines() if "PRIVATE" not in ln)
        for e in await crew.store.list_events(wid):
            assert key_body not in str(e.data)


async def test_unreachable_remote_and_missing_ref_are_rejected_at_submission(
    remote_crew: Crew, daemon: GitDaemon, served: Served
) -> None:
    from crewwork.api.service import SubmissionRejected

    port = free_port()
    with pytest.raises(SubmissionRejected, match=f"127.0.0.1:{port}") as err:
        await remote_crew.submit(item(f"git://127.0.0.1:{port}/acme/calc.git", [{"files": {"calc.py": RIGHT}}]))
    assert err.value.field == "repo"
    with pytest.raises(SubmissionRejected, match="no-such-branch") as err:
        spec = item(daemon.url(served.name), [{"files": {"calc.py": RIGHT}}])
        spec["repo"]["ref"] = "no-such-branch"
        await remote_crew.submit(spec)
    assert err.value.field == "repo"
    with pytest.raises(SubmissionRejected, match="no forge is configured") as err:
        spec = item(daemon.url(served.name), [{"files": {"calc.py": RIGHT}}])
        spec["repo"]["pull_request"] = {}
        await remote_crew.submit(spec)
    assert err.value.field == "repo.pull_request"


async def test_remote_gone_after_submission_fails_naming_it_never_dead(
    remote_crew: Crew, served: Served, tmp_path: Path
) -> None:
    with GitDaemon(served.root, tmp_path / "short-lived.log") as gone:
        url = gone.url(served.name)
        wid = await remote_crew.submit(item(url, [{"files": {"calc.py": RIGHT}}], review={"required": True}))
        await remote_crew.wait_state(wid, "awaiting_review", timeout_s=120)
    # The daemon is gone: landing cannot reach the remote. It retries, then fails naming the remote.
    row = await remote_crew.store.get_work_item(wid)
    assert row is not None
    await remote_crew.client.get_workflow_handle(row.workflow_id).execute_update(
        "review", ReviewDecision(action="approve")
    )
    result = await remote_crew.result(wid, timeout_s=180)
    assert result.state == "failed", result.reason
    assert url in result.reason and "RepositoryUnavailable" in result.reason


async def test_concurrent_writer_of_the_delivery_branch_is_detected_and_kept(
    remote_crew: Crew, daemon: GitDaemon, served: Served, tmp_path: Path
) -> None:
    wid = await remote_crew.submit(
        item(daemon.url(served.name), [{"files": {"calc.py": RIGHT}}], review={"required": True})
    )
    await remote_crew.wait_state(wid, "awaiting_review", timeout_s=120)
    other = tmp_path / "someone-else"
    git(tmp_path, "clone", "--quiet", str(served.bare), str(other))
    (other / "calc.py").write_text("def add(a, b):\n    return 7\n")
    git(other, "commit", "-qam", "a concurrent writer")
    git(other, "push", "--quiet", "origin", f"HEAD:refs/heads/crewwork/{wid}")
    theirs = git(served.bare, "rev-parse", f"refs/heads/crewwork/{wid}")
    row = await remote_crew.store.get_work_item(wid)
    assert row is not None
    await remote_crew.client.get_workflow_handle(row.workflow_id).execute_update(
        "review", ReviewDecision(action="approve")
    )
    result = await remote_crew.result(wid)
    assert result.state == "failed", result.reason
    assert "LandingConflict" in result.reason and daemon.url(served.name) in result.reason
    assert git(served.bare, "rev-parse", f"refs/heads/crewwork/{wid}") == theirs, "never overwritten"
    assert not [e for e in await remote_crew.store.list_events(wid) if e.type == "landed"]


async def test_a_commit_the_remote_does_not_have_fails_the_item_naming_it(
    remote_crew: Crew, daemon: GitDaemon, served: Served
) -> None:
    # A commit id cannot be checked at submission without fetching; the first activity finds it missing.
    spec = item(daemon.url(served.name), [{"files": {"calc.py": RIGHT}}])
    spec["repo"]["ref"] = "c0ffee" * 6 + "c0ff"
    wid = await remote_crew.submit(spec)
    result = await remote_crew.result(wid)
    assert result.state == "failed", result.reason
    assert "RepositoryError" in result.reason and "c0ffee" in result.reason and daemon.url(served.name) in result.reason
