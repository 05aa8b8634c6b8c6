"""Each attack class on the MCP endpoint, over HTTP with the SDK's client: paths that try to leave the tree (symlinks
to files and directories, `..`, absolute and percent-encoded paths, `.git` in any spelling, submodules), refs and
arguments that try to become git syntax or options, huge and binary files, and requests without the tenant's key,
with another key, from a foreign Origin or Host. Every refusal is a tool error naming why (or an HTTP status before
the MCP layer), never a 500, never a traceback, and nothing of the host is ever shown."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from tests.api.conftest import Stack
from tests.conftest import GIT_ENV
from tests.mcp.conftest import HUGE_BYTES, call, fails, git, mcp_client, register

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
JSON_RPC = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def test_paths_never_leave_the_tree(stack: Stack, tricky_repo: Path) -> None:
    rid = await register(stack, tricky_repo)
    async with mcp_client(stack) as c:
        outside = {
            "abs_link": "points outside the repository",
            "up_link": "points outside the repository",
            "src/up_dir/etc/passwd": "points outside the repository",
            "git_link": "into .git",
            "loop_a": "symbolic links on the way",
        }
        for path, why in outside.items():
            code, msg = await fails(c, "read_file", repo=rid, path=path)
            assert code == "invalid_path" and why in msg, (path, msg)
            assert "root:" not in msg
        refused = {
            "../etc/passwd": "'..'",
            "src/../../etc/passwd": "'..'",
            "/etc/passwd": "absolute",
            ".git/config": ".git",
            "src/.GIT/config": ".git",
            ".git./HEAD": ".git",
            "git~1/config": ".git",
            "src\\..\\..\\x": "backslash",
            "a\nb": "control character",
        }
        for path, why in refused.items():
            code, msg = await fails(c, "read_file", repo=rid, path=path)
            assert code == "invalid_path" and why in msg, (path, msg)
        for path in ("../", "/", ".git"):
            code, _ = await fails(c, "list_directory", repo=rid, path=path) if path != "/" else ("invalid_path", "")
            assert code == "invalid_path"
        # Percent-encoding is never decoded: the name is looked up as written.
        code, _ = await fails(c, "read_file", repo=rid, path="%2e%2e/%2e%2e/etc/passwd")
        assert code == "not_found"
        literal = await call(c, "read_file", repo=rid, path="%2e%2e/passwd")
        assert literal["content"].startswith("a directory named with percent signs")
        # A submodule is an entry with a commit id, never entered; its URL (/etc) is never opened.
        code, msg = await fails(c, "read_file", repo=rid, path="vendor/sub/passwd")
        assert code == "not_found" and "submodule" in msg
        code, msg = await fails(c, "read_file", repo=rid, path="vendor/sub")
        assert code == "not_a_file" and "submodule" in msg
        code, _ = await fails(c, "list_directory", repo=rid, path="vendor/sub")
        assert code == "not_a_directory"
        # Searching never follows links either: a link's blob is its target's text.
        hits = await call(c, "search_code", repo=rid, query="root:x:0:0")
        assert hits["matches"] == []
        # git_log / git_diff take a path as a literal pathspec, with the same rules.
        code, _ = await fails(c, "git_log", repo=rid, path="../..")
        assert code == "invalid_path"
        none = await call(c, "git_log", repo=rid, path=":(glob)**")
        assert none["commits"] == []


async def test_refs_and_arguments_never_become_git_syntax_or_options(stack: Stack, tricky_repo: Path) -> None:
    rid = await register(stack, tricky_repo)
    pwned = tricky_repo.parent / "pwned"
    async with mcp_client(stack) as c:
        for ref in ("HEAD:../", "HEAD:README.md", "main@{1}", "-p", "--output=/tmp/x", "main..HEAD", "HEAD^{tree}"):
            code, msg = await fails(c, "read_file", repo=rid, path="README.md", ref=ref)
            assert code == "invalid_ref", (ref, msg)
        for ref in ("refs/crewwork/landed/x", "refs/remotes/origin/main", ".hidden", "a/../b", "x.lock"):
            code, _ = await fails(c, "git_log", repo=rid, ref=ref)
            assert code == "invalid_ref", ref
        code, _ = await fails(c, "git_diff", repo=rid, base="--output=/tmp/pwned", head="main")
        assert code == "invalid_ref"
        code, _ = await fails(c, "git_show", repo=rid, rev="--exec=touch /tmp/pwned")
        assert code == "invalid_ref"
        assert (await call(c, "read_file", repo=rid, path="README.md"))["commit"]  # the mirror is fetched now
        # A commit the mirror holds but no branch or tag reaches (made by the host, never pushed) is not readable.
        mirror = next(p for p in stack.crew.settings.resolved_mirror_dir().glob("*.git") if "tricky" in p.name)
        tree = git(mirror, "--git-dir=.", "rev-parse", "main^{tree}").strip()
        hidden = (
            subprocess.run(
                ["git", "--git-dir=.", "commit-tree", tree, "-m", "host only"],
                cwd=mirror,
                env=GIT_ENV,
                capture_output=True,
                check=True,
            )
            .stdout.decode()
            .strip()
        )
        code, _ = await fails(c, "read_file", repo=rid, path="README.md", ref=hidden)
        assert code == "not_found"
        code, _ = await fails(c, "read_file", repo=rid, path="README.md", ref="0" * 40)
        assert code == "not_found"
        # A short commit id of a reachable commit works; ~N and ^ too.
        short = git(tricky_repo, "rev-parse", "--short=10", "main~1").strip()
        assert (await call(c, "read_file", repo=rid, path="README.md", ref=short))["content"] == "# tricky\n"
        assert (await call(c, "git_show", repo=rid, rev="main^", patch=False))["message"] == "attacks"

        # Values that start with '-' never reach git's command line as options: a file named -rf is just read, a
        # query that looks like an option is searched for as text, a glob is our own literal pathspec.
        assert (await call(c, "read_file", repo=rid, path="-rf"))["content"].startswith("a file whose name")
        q = await call(c, "search_code", repo=rid, query=f"--open-files-in-pager=touch {pwned}")
        assert q["matches"] == []
        q = await call(c, "search_code", repo=rid, query="-e world", glob="--exec=touch x")
        assert q["matches"] == []
        q = await call(c, "search_code", repo=rid, query="a file whose", glob="-rf")
        assert [m["path"] for m in q["matches"]] == ["-rf"]
        code, _ = await fails(c, "search_code", repo=rid, query="x", glob="../*")
        assert code == "invalid_argument"
        code, _ = await fails(c, "search_code", repo=rid, query="two\nlines")
        assert code == "invalid_argument"
        code, _ = await fails(c, "search_code", repo=rid, query="([", regex=True)
        assert code == "invalid_argument"
        code, msg = await fails(c, "read_file", repo=rid, path="README.md", surprise="--upload-pack=x")
        assert code == "invalid_arguments" and "surprise" in msg
        code, _ = await fails(c, "no_such_tool")
        assert code == "unknown_tool"
    assert not pwned.exists() and not Path("/tmp/pwned").exists()


async def test_huge_and_binary_files_are_bounded(stack: Stack, tricky_repo: Path) -> None:
    rid = await register(stack, tricky_repo)
    async with mcp_client(stack) as c:
        binary = await call(c, "read_file", repo=rid, path="bin.dat")
        assert binary["binary"] is True and binary["content"] is None and binary["size"] == 1000
        long = await call(c, "read_file", repo=rid, path="docs/long.txt")
        assert long["truncated"] is True and long["total_lines"] == 20_000
        assert len(long["content"].encode()) <= 256 * 1024 and "start_line=" in long["note"]
        rest = await call(c, "read_file", repo=rid, path="docs/long.txt", start_line=long["end_line"] + 1)
        assert rest["content"].startswith(f"line {long['end_line']} of")
        huge = await call(c, "read_file", repo=rid, path="huge.txt", start_line=1, end_line=1)
        assert huge["content"] == "x" * 100 + "\n" and huge["size"] == HUGE_BYTES + 101
        cut = await call(c, "read_file", repo=rid, path="huge.txt", start_line=2)
        # One line longer than an answer: its first part, and where the rest starts (tests/mcp/test_mcp_answers.py).
        assert cut["truncated"] is True and cut["content"] == "y" * 256 * 1024
        assert cut["next"] == {"start_line": 2, "offset": 256 * 1024}
        diff = await call(c, "git_show", repo=rid, rev="main~1")
        assert diff["truncated"] is True and len(diff["patch"].encode()) <= 256 * 1024


async def test_a_file_larger_than_the_bound_is_refused(stack: Stack, tricky_repo: Path) -> None:
    from tests.api.conftest import LiveApi

    # An API of its own whose MCP bound is 1 MiB (the module's API keeps the default), on the module's crew.
    settings = stack.api.settings
    api = LiveApi(settings.model_copy(update={"mcp": settings.mcp.model_copy(update={"max_file_bytes": 1024 * 1024})}))
    api.start()
    try:
        world = Stack(stack.crew, api, stack.alpha, stack.alpha, stack.alpha)
        rid = await register(world, tricky_repo)
        async with mcp_client(world) as c:
            code, msg = await fails(c, "read_file", repo=rid, path="huge.txt")
            assert code == "too_large" and str(HUGE_BYTES + 101) in msg and "CREWWORK_MCP_MAX_FILE_BYTES" in msg
    finally:
        api.stop()


async def test_dotgit_entries_and_pointer_files_never_reach_the_mirror(stack: Stack, tmp_path: Path) -> None:
    from tests.conftest import make_repo

    planted = []
    for kind in ("directory", "pointer"):
        repo = make_repo(tmp_path / f"planted-{kind}", {"a.txt": "a\n"})
        base = git(repo, "ls-tree", "HEAD").strip()
        if kind == "directory":  # a .git directory with a config that would run a program
            blob = git(repo, "hash-object", "-w", "--stdin", input_bytes=b"[core]\n\tfsmonitor = touch /tmp/pwned\n")
            sub = git(repo, "mktree", input_bytes=f"100644 blob {blob.strip()}\tconfig\n".encode()).strip()
            top = git(repo, "mktree", input_bytes=f"{base}\n040000 tree {sub}\t.git\n".encode()).strip()
        else:  # a .git pointer file in a subdirectory, sending git to another repository
            blob = git(repo, "hash-object", "-w", "--stdin", input_bytes=b"gitdir: /etc\n").strip()
            sub = git(repo, "mktree", input_bytes=f"100644 blob {blob}\t.git\n".encode()).strip()
            top = git(repo, "mktree", input_bytes=f"{base}\n040000 tree {sub}\tvendor\n".encode()).strip()
        commit = git(repo, "commit-tree", top, "-p", "HEAD", "-m", f"planted .git {kind}").strip()
        git(repo, "update-ref", "refs/heads/main", commit)
        planted.append(await register(stack, repo))
    async with mcp_client(stack) as c:
        for rid in planted:
            code, msg = await fails(c, "list_directory", repo=rid)
            # transfer.fsckObjects refuses the pack: nothing of it is in this host's mirror.
            assert code == "repository_unavailable" and "could not be fetched" in msg
    assert not Path("/tmp/pwned").exists()
    # A local repository whose own .git is a pointer file is refused at registration (crewwork.repos.local).
    elsewhere = make_repo(tmp_path / "elsewhere", {"secret.txt": "another repository's\n"})
    pointer = tmp_path / "pointer"
    pointer.mkdir()
    (pointer / ".git").write_text(f"gitdir: {elsewhere / '.git'}\n")
    async with stack.client() as h:
        r = await h.post("/v1/repositories", json={"url": str(pointer)})
        assert r.status_code == 422 and "gitdir" in r.text


async def test_bearer_origin_host_and_rate_limits(stack: Stack, tricky_repo: Path) -> None:
    url = f"{stack.api.url}/mcp"
    async with httpx.AsyncClient(timeout=30) as h:
        r = await h.post(url, json=INIT, headers=JSON_RPC)
        assert r.status_code == 401
        www = r.headers["www-authenticate"]
        assert www.startswith("Bearer ") and 'error="invalid_token"' in www
        assert f'resource_metadata="{stack.api.url}/.well-known/oauth-protected-resource/mcp"' in www
        meta = (await h.get(f"{stack.api.url}/.well-known/oauth-protected-resource/mcp")).json()
        assert meta["resource"] == url and meta["bearer_methods_supported"] == ["header"]
        assert [u.rstrip("/") for u in meta["authorization_servers"]] == [stack.api.url]
        r = await h.post(url, json=INIT, headers={**JSON_RPC, "Authorization": "Bearer cw_not_a_key"})
        assert r.status_code == 401 and "invalid_token" in r.headers["www-authenticate"]
        r = await h.post(url, json=INIT, headers={**JSON_RPC, "Authorization": "Basic dXNlcjpwdw=="})
        assert r.status_code == 401
        good = {**JSON_RPC, "Authorization": f"Bearer {stack.alpha.key}"}
        assert (await h.post(url, json=INIT, headers=good)).status_code == 200
        # DNS rebinding: a page on another origin, or a name that resolves here but is not ours, is refused first.
        r = await h.post(url, json=INIT, headers={**good, "Origin": "https://evil.example"})
        assert r.status_code == 403
        r = await h.post(url, json=INIT, headers={**good, "Origin": "http://127.0.0.1:9"})
        assert r.status_code == 200
        r = await h.post(url, json=INIT, headers={**good, "Host": "evil.example"})
        assert r.status_code == 421
        r = await h.get(f"{stack.api.url}/.well-known/oauth-protected-resource/mcp", headers={"Host": "evil.example"})
        assert r.status_code == 421
        # The API's failed-authentication limit holds here too (same buckets, same 429): wrong keys until refused.
        # Not a fixed count: the bucket refills (0.5/s by default), and on a loaded machine 35 requests took long
        # enough for the last to find a fresh token (a 401 where the test expected 429).
        codes: list[int] = []
        while len(codes) < 200 and 429 not in codes:
            headers = {**JSON_RPC, "Authorization": f"Bearer wrong-{len(codes)}"}
            codes.append((await h.post(url, json=INIT, headers=headers)).status_code)
        assert codes[0] == 401 and codes[-1] == 429, codes
        assert set(codes[:-1]) == {401}, codes
        r = await h.post(url, json=INIT, headers=good)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["code"] == "rate_limited"
