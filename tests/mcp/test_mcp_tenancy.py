"""Two tenants on one MCP endpoint: B never sees A's repositories, files, symbols or work items, and an index is
never shared between them, even for the same repository (docs/sandbox.md, "Caches and tenants")."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from tests.api.conftest import Stack, task_item
from tests.mcp.conftest import call, fails, mcp_client, register


async def test_tenant_b_never_sees_tenant_a(stack: Stack, tricky_repo: Path, calc_repo: Path) -> None:
    a_repo = await register(stack, tricky_repo, stack.alpha)
    async with mcp_client(stack, stack.alpha) as a:
        item = await call(a, "submit_work_item", work_item=task_item({"n": 1}))
        await call(a, "repo_map", repo=a_repo)

    async with mcp_client(stack, stack.beta) as b:
        assert (await call(b, "list_repositories"))["repositories"] == []
        missing_code, missing = await fails(b, "read_file", repo="repo_doesnotexist", path="README.md")
        for tool, args in (
            ("read_file", {"path": "README.md"}),
            ("list_directory", {}),
            ("search_code", {"query": "helper"}),
            ("git_log", {}),
            ("git_show", {"rev": "main"}),
            ("repo_map", {}),
            ("find_symbol", {"name": "helper"}),
        ):
            for name in (a_repo, str(tricky_repo)):
                code, msg = await fails(b, tool, repo=name, **args)
                # Exactly what a missing repository gets, with the name B used: nothing says A has it.
                assert code == missing_code == "not_found", (tool, msg)
                assert msg == missing.replace("repo_doesnotexist", name), (tool, msg)
        assert (await b.list_resources()).resources == []
        for uri in (f"crewwork://repositories/{a_repo}", f"crewwork://repositories/{a_repo}/files/README.md"):
            with pytest.raises(MCPError, match="not_found"):
                await b.read_resource(uri)
        with pytest.raises(MCPError, match="not_found"):
            await b.read_resource(f"crewwork://work-items/{item['id']}")
        code, _ = await fails(b, "git_diff", repo=a_repo, base="main~1", head="main")
        assert code == "not_found"
        missing_item = await fails(b, "get_work_item", work_item_id="wi_doesnotexist")
        for tool in ("get_work_item", "get_evidence", "git_status"):
            code, msg = await fails(b, tool, work_item_id=item["id"])
            assert code == missing_item[0] == "not_found" and item["id"] in msg
        code, _ = await fails(b, "review_work_item", work_item_id=item["id"], action="approve")
        assert code == "not_found"
        # B names A's repository in a submission: the same 404 the HTTP API gives.
        spec = {
            "kind": "code_change",
            "repo": {"id": a_repo},
            "instruction": "x",
            "validation": {"command": ["python", "-m", "pytest"]},
            "agent": {"name": "scripted", "config": {}},
        }
        code, msg = await fails(b, "submit_work_item", work_item=spec)
        assert code == "not_found", msg

        # B registers the same repository itself: it reads it through its own registration, and builds its own index.
        b_repo = await register(stack, tricky_repo, stack.beta)
        assert b_repo != a_repo
        first = await call(b, "repo_map", repo=b_repo)
        assert first["cached"] is False and first["repository"] == b_repo
    cache = stack.crew.settings.resolved_codeintel_dir()
    assert {p.name for p in cache.iterdir()} == {a_repo, b_repo}
