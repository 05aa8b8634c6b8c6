"""Fixtures for the MCP tests: the real API over HTTP (tests/api/conftest.py's stack: real PostgreSQL, a real Temporal
dev server, in-process worker pools, tenants alpha and beta), the MCP SDK's own client, and repositories built with
real git holding what the attacks need (symlinks out of and inside the tree, a submodule, binary and huge files)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.api.conftest import Stack, Tenant, api_crew, api_settings, shared_api, stack  # noqa: F401  (the fixtures these tests run on)
from tests.conftest import GIT_ENV, make_repo


@contextlib.asynccontextmanager
async def mcp_client(
    world: Stack, who: Tenant | None = None, *, mode: str = "auto", headers: dict[str, str] | None = None
) -> AsyncIterator[Client]:
    """The SDK's Client over Streamable HTTP to the running API's /mcp, with the tenant's key as bearer."""
    who = who or world.alpha
    hc = httpx2.AsyncClient(headers={"Authorization": f"Bearer {who.key}", **(headers or {})}, timeout=120)
    async with hc, Client(streamable_http_client(f"{world.api.url}/mcp", http_client=hc), mode=mode) as client:
        yield client


async def call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    """A tool's structured answer; fails the test on a tool error."""
    res = await client.call_tool(tool, args)
    assert not res.is_error, f"{tool} failed: {res.content}"
    assert isinstance(res.structured_content, dict)
    return res.structured_content


async def fails(client: Client, tool: str, **args: Any) -> tuple[str, str]:
    """(code, message) of a tool's error answer; fails the test when the tool answered normally."""
    res = await client.call_tool(tool, args)
    assert res.is_error, f"{tool} answered instead of failing: {res.structured_content}"
    err = (res.structured_content or {}).get("error", {})
    text = res.content[0].text if res.content else ""  # type: ignore[union-attr]
    assert "Traceback" not in text
    return err.get("code", ""), err.get("message", text)


def git(repo: Path, *args: str, input_bytes: bytes | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, env=GIT_ENV, capture_output=True, input=input_bytes
    ).stdout.decode()


HUGE_BYTES = 3 * 1024 * 1024


@pytest.fixture
def tricky_repo(tmp_path: Path) -> Path:
    """A repository whose tree holds every attack the path rules are for."""
    repo = make_repo(
        tmp_path / "tricky",
        {
            "README.md": "# tricky\n",
            "src/app.py": "from src.util import helper\n\n\nclass App:\n    def run(self):\n        return helper(1)\n",
            "src/util.py": "def helper(x):\n    return x + 1\n\n\ndef unused_thing():\n    return helper(2)\n",
            "-rf": "a file whose name starts with a dash\n",
            "%2e%2e/passwd": "a directory named with percent signs, read literally\n",
            "docs/long.txt": "".join(f"line {i} of a long text file\n" for i in range(20_000)),
        },
    )
    (repo / "bin.dat").write_bytes(b"\x00\x01\x02binary\x00" * 100)
    (repo / "huge.txt").write_bytes(b"x" * 100 + b"\n" + b"y" * HUGE_BYTES)
    links = {
        "abs_link": "/etc/passwd",
        "up_link": "../../../../etc/passwd",
        "src/up_dir": "../..",
        "in_link": "src/util.py",
        "dir_link": "src",
        "git_link": ".git/config",
        "loop_a": "loop_b",
        "loop_b": "loop_a",
    }
    for name, target in links.items():
        os.symlink(target, repo / name)
    git(repo, "add", "-A")
    # A submodule: a gitlink entry naming a commit of some other repository (never entered).
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},vendor/sub")
    (repo / ".gitmodules").write_text('[submodule "vendor/sub"]\n\tpath = vendor/sub\n\turl = /etc\n')
    git(repo, "add", ".gitmodules")
    git(repo, "commit", "-qm", "attacks")
    (repo / "README.md").write_text("# tricky\n\nsecond commit\n")
    git(repo, "commit", "-qm", "second", "README.md")
    return repo


async def register(world: Stack, repo: Path, who: Tenant | None = None) -> str:
    async with world.client(who) as c:
        r = await c.post("/v1/repositories", json={"url": str(repo), "default_ref": "main"})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])
