"""Fetch, resolve and push with compare-and-swap against real git servers: git daemon, smart HTTP with basic auth,
sshd with a key; and the errors of an unreachable remote, a missing ref, bad credentials."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crewwork.boundary.urls import parse_repo_url
from crewwork.config.repos import RepoCredential
from crewwork.repos.credentials import Credentials
from crewwork.repos.git import PushRejected, RemoteAccessDenied, RemoteNotFound, RemoteUnavailable
from crewwork.repos.landing import LandingConflictError, land_by_push, push_for_review, review_message
from crewwork.repos.mirror import MirrorCache
from crewwork.repos.remote import Remote
from crewwork.temporal.devserver import free_port
from tests.repos.conftest import Served
from tests.repos.servers import LOOPBACK, GitDaemon, SmartHttp, Sshd, git

RIGHT_DIFF = (
    "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
    "-    return a - b\n+    return a + b\n"
)


def _http_remote(smart_http: SmartHttp, secret_dir: Path, password: str, name: str = "acme/calc.git") -> Remote:
    token = secret_dir / "http-token"
    token.write_text(password + "\n")
    url = parse_repo_url(smart_http.url(name))
    creds = Credentials(
        {
            "http": RepoCredential(
                kind="https_token", match=[f"http://127.0.0.1:{smart_http.port}/"], secret_file=token, username="crew"
            )
        }
    )
    return Remote(address=LOOPBACK, url=url, auth=creds.auth_for(url))


def _ssh_remote(sshd: Sshd, bare: Path) -> Remote:
    url = parse_repo_url(sshd.url(bare))
    creds = Credentials(
        {
            "deploy": RepoCredential(
                kind="ssh_key", match=[f"ssh://root@127.0.0.1:{sshd.port}/"], secret_file=sshd.client_key
            )
        },
        known_hosts=sshd.known_hosts,
    )
    return Remote(address=LOOPBACK, url=url, auth=creds.auth_for(url))


@pytest.fixture
def cache(tmp_path: Path) -> MirrorCache:
    return MirrorCache(tmp_path / "data" / "mirrors")


async def _roundtrip(remote: Remote, served: Served, cache: MirrorCache, tmp_path: Path) -> None:
    main = git(served.bare, "rev-parse", "main")
    assert await remote.resolve("main") == main
    assert await remote.resolve("HEAD") == main
    gitdir, stats = await cache.ensure(remote, main)
    assert stats.cloned and gitdir.is_dir()
    _again, stats2 = await cache.ensure(remote, main)
    assert not stats2.fetched, "a mirror that has the commit must not fetch again"
    landed = await land_by_push(
        cache,
        remote,
        work_item_id="wi1",
        base_commit=main,
        diff=RIGHT_DIFF,
        message="fix add\n",
        scratch=tmp_path / "scratch",
    )
    assert landed.created
    assert git(served.bare, "rev-parse", "refs/heads/crewwork/wi1") == landed.commit
    assert git(served.bare, "rev-parse", "main") == main, "the target branch never moves"
    assert "return a + b" in git(served.bare, "show", f"{landed.commit}:calc.py")
    again = await land_by_push(
        cache,
        remote,
        work_item_id="wi1",
        base_commit=main,
        diff=RIGHT_DIFF,
        message="fix add\n",
        scratch=tmp_path / "scratch",
    )
    assert (again.commit, again.created) == (landed.commit, False), "a retried landing recognises its own commit"


async def test_git_daemon_fetch_and_push_with_cas(
    daemon: GitDaemon, served: Served, cache: MirrorCache, tmp_path: Path
):
    await _roundtrip(Remote(address=LOOPBACK, url=parse_repo_url(daemon.url(served.name))), served, cache, tmp_path)


async def test_smart_http_with_basic_auth(
    smart_http: SmartHttp, served: Served, cache: MirrorCache, tmp_path: Path, secret_dir: Path, http_password: str
):
    remote = _http_remote(smart_http, secret_dir, http_password)
    await _roundtrip(remote, served, cache, tmp_path)
    assert smart_http.requests and all(r.authorization for r in smart_http.requests[1:])
    # The header went over the wire, but never into the mirror's files.
    for p in cache.root.rglob("*"):
        if p.is_file():
            assert http_password.encode() not in p.read_bytes(), p


async def test_sshd_with_key(sshd: Sshd, served: Served, cache: MirrorCache, tmp_path: Path):
    await _roundtrip(_ssh_remote(sshd, served.bare), served, cache, tmp_path)


async def test_scp_style_url_reaches_the_same_repository(sshd: Sshd, served: Served):
    # scp-style paths are relative to the login's home; an absolute path works the same.
    url = parse_repo_url(f"root@127.0.0.1:{served.bare}")
    assert url.scp
    remote = _ssh_remote(sshd, served.bare)
    scp = Remote(address=LOOPBACK, url=url, auth=remote.auth)
    # The port is not expressible in scp-style syntax: reach the test server through ssh's own -p.
    env = dict(scp.auth.env)
    env["GIT_SSH_COMMAND"] += f" -p {sshd.port}"
    kh = sshd.known_hosts.read_text().replace(f"[127.0.0.1]:{sshd.port}", f"[127.0.0.1]:{sshd.port},127.0.0.1")
    sshd.known_hosts.write_text(kh)
    from crewwork.repos.credentials import GitAuth

    scp = Remote(address=LOOPBACK, url=url, auth=GitAuth(env=env, secrets=remote.auth.secrets))
    assert await scp.resolve("main") == git(served.bare, "rev-parse", "main")


async def test_concurrent_writer_is_detected_never_overwritten(
    daemon: GitDaemon, served: Served, cache: MirrorCache, tmp_path: Path
):
    remote = Remote(address=LOOPBACK, url=parse_repo_url(daemon.url(served.name)))
    main = git(served.bare, "rev-parse", "main")
    gitdir, _ = await cache.ensure(remote, main)
    # Someone else pushes the delivery branch between our look and our push: CAS against "absent" must lose.
    other = tmp_path / "other"
    git(tmp_path, "clone", "--quiet", str(served.bare), str(other))
    (other / "calc.py").write_text("def add(a, b):\n    return 42\n")
    git(other, "commit", "-qam", "someone else")
    git(other, "push", "--quiet", "origin", "HEAD:refs/heads/crewwork/wi2")
    theirs = git(served.bare, "rev-parse", "refs/heads/crewwork/wi2")
    mine = git(gitdir, "commit-tree", f"{main}^{{tree}}", "-p", main, "-m", "mine")
    with pytest.raises(PushRejected) as err:
        await remote.push_branch(gitdir, mine, "crewwork/wi2", expected_old=None)
    assert "stale info" in str(err.value) or "rejected" in str(err.value)
    assert git(served.bare, "rev-parse", "refs/heads/crewwork/wi2") == theirs, "the other writer's commit stays"
    # With the right expected value the swap goes through; with a stale one it is refused again.
    await remote.push_branch(gitdir, mine, "crewwork/wi2", expected_old=theirs)
    assert git(served.bare, "rev-parse", "refs/heads/crewwork/wi2") == mine
    with pytest.raises(PushRejected):
        await remote.push_branch(gitdir, main, "crewwork/wi2", expected_old=theirs)
    # And a landing of that item refuses to move a branch holding someone else's change.
    with pytest.raises(LandingConflictError, match="different content"):
        await land_by_push(
            cache,
            remote,
            work_item_id="wi2",
            base_commit=main,
            diff=RIGHT_DIFF,
            message="x\n",
            scratch=tmp_path / "s2",
        )


async def test_unreachable_remote_is_a_retryable_error_naming_it(cache: MirrorCache):
    port = free_port()
    remote = Remote(address=LOOPBACK, url=parse_repo_url(f"git://127.0.0.1:{port}/calc.git"), timeout_s=20)
    with pytest.raises(RemoteUnavailable, match=f"git://127.0.0.1:{port}/calc.git"):
        await remote.resolve("main")
    with pytest.raises(RemoteUnavailable):
        await cache.ensure(remote, "a" * 40)
    assert not any(cache.root.glob("*.git")), "a failed first clone leaves no mirror behind"


async def test_missing_ref_and_missing_commit_are_not_found(daemon: GitDaemon, served: Served, cache: MirrorCache):
    remote = Remote(address=LOOPBACK, url=parse_repo_url(daemon.url(served.name)))
    with pytest.raises(RemoteNotFound, match="no-such-branch"):
        await remote.resolve("no-such-branch")
    with pytest.raises(RemoteNotFound, match="is not in"):
        await cache.ensure(remote, "b" * 40)
    missing = Remote(address=LOOPBACK, url=parse_repo_url(daemon.url("acme/nope.git")))
    with pytest.raises(RemoteNotFound):
        await missing.resolve("main")


async def test_bad_credential_is_access_denied_and_redacted(
    smart_http: SmartHttp, secret_dir: Path, http_password: str
):
    wrong = "wrong-" + http_password[::-1]
    remote = _http_remote(smart_http, secret_dir, wrong)
    with pytest.raises(RemoteAccessDenied) as err:
        await remote.resolve("main")
    assert wrong not in str(err.value) and http_password not in str(err.value)
    none = Remote(address=LOOPBACK, url=parse_repo_url(smart_http.url("acme/calc.git")))
    with pytest.raises(RemoteAccessDenied):
        await none.resolve("main")


async def test_ssh_refuses_a_server_whose_host_key_is_unknown(sshd: Sshd, served: Served):
    remote = _ssh_remote(sshd, served.bare)
    sshd.known_hosts.write_text("")
    with pytest.raises(RemoteAccessDenied, match=r"[Hh]ost key verification failed"):
        await remote.resolve("main")


async def test_mirror_meta_holds_no_secret_and_names_the_url(
    smart_http: SmartHttp, served: Served, cache: MirrorCache, secret_dir: Path, http_password: str
):
    remote = _http_remote(smart_http, secret_dir, http_password)
    gitdir, _ = await cache.ensure(remote, None)
    meta = json.loads((gitdir / "crewwork-mirror.json").read_text())
    assert meta["url"] == smart_http.url("acme/calc.git")
    config = (gitdir / "config").read_text()
    assert "hooksPath" in config and http_password not in config and "url" not in config.lower()


async def test_a_commit_with_the_same_tree_is_not_taken_for_the_landings_own_unless_crewwork_wrote_it(
    daemon: GitDaemon, served: Served, cache: MirrorCache, tmp_path: Path
):
    """Whoever can push to the repository knows the validated change (the diff is on the API) and the delivery branch
    (`crewwork/<id>`) before the item lands. Before, a commit they pushed there with the same tree on the same parent
    was "recognised" as the landing's own: the item succeeded on it, and its evidence bundle signed, as the landed
    commit, a commit whose author and message they chose (`Audited by the security team`, a `Crewwork-Work-Item`
    trailer naming another item). Only crewwork's own commit (its identity, the landing's message, nothing else; a
    retry's clock may differ) is recognised; anything else on the branch is a conflict."""
    remote = Remote(address=LOOPBACK, url=parse_repo_url(daemon.url(served.name)))
    main = git(served.bare, "rev-parse", "main")
    message = "fix add\n\ncrewwork work item wi3, validated on attempt 1.\nCrewwork-Work-Item: wi3\n"
    other = tmp_path / "other"
    git(tmp_path, "clone", "--quiet", str(served.bare), str(other))
    (other / "calc.py").write_text((other / "calc.py").read_text().replace("return a - b", "return a + b"))
    git(other, "add", "-A")
    tree = git(other, "write-tree")
    forged = {
        "GIT_AUTHOR_NAME": "Security Team",
        "GIT_AUTHOR_EMAIL": "sec@example.com",
        "GIT_COMMITTER_NAME": "Security Team",
        "GIT_COMMITTER_EMAIL": "sec@example.com",
    }
    theirs = git_env(other, forged, "commit-tree", tree, "-p", main, "-m", "Audited by the security team")
    git(other, "push", "--quiet", "origin", f"{theirs}:refs/heads/crewwork/wi3")
    with pytest.raises(LandingConflictError, match="different content"):
        await land_by_push(
            cache, remote, work_item_id="wi3", base_commit=main, diff=RIGHT_DIFF, message=message,
            scratch=tmp_path / "s3",
        )  # fmt: skip
    assert git(served.bare, "rev-parse", "refs/heads/crewwork/wi3") == theirs, "refused, not moved"
    # crewwork's message under another identity, or crewwork's identity with another message: refused too.
    ident = {
        "GIT_AUTHOR_NAME": "crewwork",
        "GIT_AUTHOR_EMAIL": "crewwork@localhost",
        "GIT_COMMITTER_NAME": "crewwork",
        "GIT_COMMITTER_EMAIL": "crewwork@localhost",
    }
    for n, (env, msg) in enumerate([(forged, message), (ident, message + "Reviewed-by: sec@example.com\n")]):
        c = git_env(
            other, {**env, "GIT_COMMITTER_DATE": "1700000000 +0000"}, "commit-tree", tree, "-p", main, input_=msg
        )
        git(other, "push", "--quiet", "origin", f"{c}:refs/heads/crewwork/wi4{n}")
        with pytest.raises(LandingConflictError, match="different content"):
            await land_by_push(
                cache, remote, work_item_id=f"wi4{n}", base_commit=main, diff=RIGHT_DIFF, message=message,
                scratch=tmp_path / f"s4{n}",
            )  # fmt: skip
    # crewwork's own commit from an earlier try (another second on the clock) is recognised.
    ours = git_env(
        other, {**ident, "GIT_COMMITTER_DATE": "1700000000 +0000", "GIT_AUTHOR_DATE": "1700000000 +0000"},
        "commit-tree", tree, "-p", main, input_=message,
    )  # fmt: skip
    git(other, "push", "--quiet", "origin", f"{ours}:refs/heads/crewwork/wi5")
    again = await land_by_push(
        cache, remote, work_item_id="wi5", base_commit=main, diff=RIGHT_DIFF, message=message, scratch=tmp_path / "s5"
    )
    assert (again.commit, again.created) == (ours, False)


def git_env(cwd: Path, env: dict[str, str], *args: str, input_: str | None = None) -> str:
    import os
    import subprocess

    return subprocess.run(
        ["git", *args], cwd=cwd, env={**os.environ, **env}, input=input_, capture_output=True, text=True, check=True
    ).stdout.strip()


async def test_a_change_shown_for_review_moves_only_from_crewworks_own_review_commit_to_the_landed_one(
    daemon: GitDaemon, served: Served, cache: MirrorCache, tmp_path: Path
):
    """Review on the forge: the attempt awaiting review is pushed to `crewwork/<id>` as a review commit, attempt 2
    replaces attempt 1's, and the landing moves the branch from it to the landed commit, each by compare-and-swap.
    A commit that only looks like a review commit (its message, someone else's identity) is never moved."""
    remote = Remote(address=LOOPBACK, url=parse_repo_url(daemon.url(served.name)))
    main = git(served.bare, "rev-parse", "main")
    branch = "refs/heads/crewwork/wr1"
    first = await push_for_review(
        cache, remote, work_item_id="wr1", base_commit=main, diff=RIGHT_DIFF, attempt=1, scratch=tmp_path / "r1"
    )
    assert first.created and git(served.bare, "rev-parse", branch) == first.commit
    assert git(served.bare, "log", "-1", "--format=%B", first.commit).strip() == review_message("wr1", 1).strip()
    assert git(served.bare, "rev-parse", "main") == main, "the target branch never moves"
    again = await push_for_review(
        cache, remote, work_item_id="wr1", base_commit=main, diff=RIGHT_DIFF, attempt=1, scratch=tmp_path / "r1"
    )
    assert (again.commit, again.created) == (first.commit, False), "shown once per attempt"
    second = await push_for_review(
        cache, remote, work_item_id="wr1", base_commit=main, diff=RIGHT_DIFF, attempt=2, scratch=tmp_path / "r2"
    )
    assert second.created and git(served.bare, "rev-parse", f"{second.commit}^") == main
    # A late push of attempt 1 (a stale intake loop waking up) never puts it back over attempt 2.
    with pytest.raises(LandingConflictError, match="shows attempt 2"):
        await push_for_review(
            cache, remote, work_item_id="wr1", base_commit=main, diff=RIGHT_DIFF, attempt=1, scratch=tmp_path / "r1b"
        )
    assert git(served.bare, "rev-parse", branch) == second.commit
    landed = await land_by_push(
        cache, remote, work_item_id="wr1", base_commit=main, diff=RIGHT_DIFF, message="fix add\n",
        scratch=tmp_path / "l1",
    )  # fmt: skip
    assert landed.created and git(served.bare, "rev-parse", branch) == landed.commit
    # Once landed, showing an attempt for review again does not move the branch.
    with pytest.raises(LandingConflictError, match="not a review commit"):
        await push_for_review(
            cache, remote, work_item_id="wr1", base_commit=main, diff=RIGHT_DIFF, attempt=3, scratch=tmp_path / "r3"
        )
    assert git(served.bare, "rev-parse", branch) == landed.commit
    # Someone else's commit carrying a review commit's message is theirs: neither shown over nor landed over.
    other = tmp_path / "other"
    git(tmp_path, "clone", "--quiet", str(served.bare), str(other))
    forged = {
        "GIT_AUTHOR_NAME": "Mallory",
        "GIT_AUTHOR_EMAIL": "m@example.com",
        "GIT_COMMITTER_NAME": "Mallory",
        "GIT_COMMITTER_EMAIL": "m@example.com",
    }
    theirs = git_env(other, forged, "commit-tree", f"{main}^{{tree}}", "-p", main, input_=review_message("wr2", 1))
    git(other, "push", "--quiet", "origin", f"{theirs}:refs/heads/crewwork/wr2")
    with pytest.raises(LandingConflictError, match="not a review commit"):
        await push_for_review(
            cache, remote, work_item_id="wr2", base_commit=main, diff=RIGHT_DIFF, attempt=2, scratch=tmp_path / "r4"
        )
    with pytest.raises(LandingConflictError, match="different content"):
        await land_by_push(
            cache, remote, work_item_id="wr2", base_commit=main, diff=RIGHT_DIFF, message="fix add\n",
            scratch=tmp_path / "l2",
        )  # fmt: skip
    assert git(served.bare, "rev-parse", "refs/heads/crewwork/wr2") == theirs
