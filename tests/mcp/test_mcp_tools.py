"""Every MCP tool, called with the SDK's own client over HTTP against the running API, on a real repository in this
host's mirror, and a work item handed off from an MCP client through review to landing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from crewwork.cli.demo import RIGHT, WRONG
from tests.api.conftest import Stack
from tests.mcp.conftest import call, fails, git, mcp_client, register

VALIDATION = {
    "command": ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml=.crewwork/junit.xml"],
    "junit_path": ".crewwork/junit.xml",
    "timeout_s": 60,
    "test_files": ["tests/test_calc.py"],
}


async def test_repository_tools_answer_over_streamable_http(stack: Stack, tricky_repo: Path) -> None:
    rid = await register(stack, tricky_repo)
    head = git(tricky_repo, "rev-parse", "main").strip()
    for mode in ("legacy", "auto"):  # the initialize handshake, and the stateless 2026 protocol
        async with mcp_client(stack, mode=mode) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert {"read_file", "search_code", "git_diff", "repo_map", "submit_work_item"} <= names
            listed = await call(c, "list_repositories")
            assert [r["id"] for r in listed["repositories"]] == [rid]

    async with mcp_client(stack) as c:
        f = await call(c, "read_file", repo=rid, path="src/util.py")
        assert (f["commit"], f["content"].splitlines()[0], f["total_lines"]) == (head, "def helper(x):", 6)
        part = await call(c, "read_file", repo=rid, path="docs/long.txt", start_line=10, end_line=12)
        assert (
            part["content"] == "line 9 of a long text file\nline 10 of a long text file\nline 11 of a long text file\n"
        )
        # By URL, at the previous commit, through an in-tree symlink and a symlinked directory.
        old = await call(c, "read_file", repo=str(tricky_repo), path="README.md", ref="main~1")
        assert old["content"] == "# tricky\n"
        via = await call(c, "read_file", repo=rid, path="dir_link/util.py")
        assert via["path"] == "src/util.py" and via["resolved_from"] == "dir_link/util.py"
        assert (await call(c, "read_file", repo=rid, path="in_link"))["path"] == "src/util.py"

        root = await call(c, "list_directory", repo=rid)
        types = {e["name"]: e["type"] for e in root["entries"]}
        assert types["src"] == "dir" and types["abs_link"] == "symlink" and types["README.md"] == "file"
        vendor = await call(c, "list_directory", repo=rid, path="vendor")
        assert vendor["entries"] == [{"name": "sub", "path": "vendor/sub", "type": "submodule", "commit": "1" * 40}]

        found = await call(c, "search_code", repo=rid, query="helper(")
        assert {(m["path"], m["line"]) for m in found["matches"]} == {
            ("src/app.py", 6),
            ("src/util.py", 1),
            ("src/util.py", 6),
        }
        regex = await call(c, "search_code", repo=rid, query=r"^def [a-z_]+\(", regex=True, glob="*.py")
        assert {m["text"] for m in regex["matches"]} == {"def helper(x):", "def unused_thing():"}
        cut = await call(c, "search_code", repo=rid, query="long text", max_results=5)
        assert len(cut["matches"]) == 5 and cut["truncated"] is True
        loud = await call(c, "search_code", repo=rid, query="CLASS APP", ignore_case=True)
        assert [m["path"] for m in loud["matches"]] == ["src/app.py"]

        log = await call(c, "git_log", repo=rid)
        assert [x["subject"] for x in log["commits"]] == ["second", "attacks", "base"]
        only = await call(c, "git_log", repo=rid, path="README.md", max_count=1)
        assert [x["commit"] for x in only["commits"]] == [head]
        show = await call(c, "git_show", repo=rid, rev="main")
        assert show["message"] == "second" and show["files"] == [{"path": "README.md", "added": 2, "deleted": 0}]
        assert "+second commit" in show["patch"]
        diff = await call(c, "git_diff", repo=rid, base="main~2", head="main", stat_only=True)
        assert {"README.md", "bin.dat", "abs_link", "vendor/sub"} <= {x["path"] for x in diff["files"]}
        diff = await call(c, "git_diff", repo=rid, base="main~1", head="main", path="README.md")
        assert "+second commit" in diff["patch"] and diff["truncated"] is False

        # The same through resources: the repository, a file by URI (any ref), and the templates that name them.
        uris = {r.uri for r in (await c.list_resources()).resources}
        assert f"crewwork://repositories/{rid}" in uris
        templates = {t.uri_template for t in (await c.list_resource_templates()).resource_templates}
        assert "crewwork://repositories/{id}/files/{+path}{?ref}" in templates
        text = (await c.read_resource(f"crewwork://repositories/{rid}/files/src/util.py")).contents[0]
        assert text.text.startswith("def helper(x):")  # type: ignore[union-attr]
        old = (await c.read_resource(f"crewwork://repositories/{rid}/files/README.md?ref=main~1")).contents[0]
        assert old.text == "# tricky\n"  # type: ignore[union-attr]
        with pytest.raises(MCPError, match="invalid_path"):
            await c.read_resource(f"crewwork://repositories/{rid}/files/abs_link")

        first = await call(c, "repo_map", repo=rid, max_tokens=256)
        assert first["cached"] is False and "src/util.py:" in first["map"] and "def helper(x):" in first["map"]
        again = await call(c, "repo_map", repo=rid, max_tokens=256, focus=["src/app.py"])
        # Focused on app.py, what app.py uses ranks first.
        assert again["cached"] is True and again["map"].startswith("src/util.py:\n    1│def helper(x):")
        sym = await call(c, "find_symbol", repo=rid, name="helper")
        assert sym["definitions"] == [
            {"name": "helper", "kind": "function", "path": "src/util.py", "line": 1, "text": "def helper(x):"}
        ]
        assert {r["path"] for r in sym["referenced_in"]} == {"src/app.py", "src/util.py"}


async def test_a_work_item_handed_off_from_mcp_lands(stack: Stack, calc_repo: Path) -> None:
    rid = await register(stack, calc_repo)
    spec = {
        "kind": "code_change",
        "repo": {"id": rid, "ref": "main"},
        "instruction": "Fix add() in calc.py",
        "validation": VALIDATION,
        "agent": {
            "name": "scripted",
            "config": {"attempts": [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": RIGHT}}]},
        },
        "review": {"required": True},
    }
    async with mcp_client(stack) as c:
        sub = await call(c, "submit_work_item", work_item=spec, idempotency_key="mcp-handoff-1")
        wid = sub["id"]
        # Admission is decided in the submission's request (crewwork/admission/starts.py).
        assert sub["created"] is True and sub["state"] == "admitted", sub
        again = await call(c, "submit_work_item", work_item=spec, idempotency_key="mcp-handoff-1")
        assert (again["id"], again["created"]) == (wid, False)
        other = {**spec, "instruction": "something else"}
        code, _ = await fails(c, "submit_work_item", work_item=other, idempotency_key="mcp-handoff-1")
        assert code == "idempotency_conflict"
        code, msg = await fails(c, "submit_work_item", work_item={**spec, "surprise": 1})
        assert code == "invalid_work_item" and "surprise" in msg

        deadline = time.monotonic() + 180
        item = await call(c, "get_work_item", work_item_id=wid)
        while item["state"] != "awaiting_review" and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            item = await call(c, "get_work_item", work_item_id=wid)
        assert item["state"] == "awaiting_review", item["reason"]
        ev = await call(c, "get_evidence", work_item_id=wid)
        assert [a["verdict"] for a in ev["attempts"]] == ["failed", "passed"]
        assert all("rank" not in (a["validation"] or {}) for a in ev["attempts"])
        status = await call(c, "git_status", work_item_id=wid)
        assert status["changes"] == [{"path": "calc.py", "status": "modified"}] and status["attempt"] == 2

        reviewed = await call(c, "review_work_item", work_item_id=wid, action="approve", comment="ok via MCP")
        assert reviewed["id"] == wid
        while item["state"] != "succeeded" and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            item = await call(c, "get_work_item", work_item_id=wid)
        assert item["state"] == "succeeded" and item["delivery_branch"] == f"crewwork/{wid}"
        # The landed branch is on the remote: the MCP client reads it through the mirror like any branch.
        landed = await call(c, "git_log", repo=rid, ref=item["delivery_branch"], max_count=1)
        assert landed["commits"][0]["commit"] == item["landed_commit"]
        fixed = await call(c, "read_file", repo=rid, path="calc.py", ref=item["delivery_branch"])
        assert fixed["content"] == RIGHT
        code, _ = await fails(c, "review_work_item", work_item_id=wid, action="approve")
        assert code == "review_not_allowed"
