"""The repository map: tags per language, ranking by the reference graph, the token budget, the per-registration
cache, and indexing that needs no network at all (tree-sitter-language-pack 0.13 ships its grammars in the wheel;
1.x would download them: proved by indexing with every socket refused, and again in a network namespace with no
interface but a downed loopback)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from crewwork.codeintel.repomap import IndexCache, build_index, cached_index, find, rank, render
from crewwork.codeintel.tags import DEFINITIONS, _compiled, extract
from crewwork.config.codeintel import CodeIntelSettings
from crewwork.repos.trees import load_index
from tests.conftest import make_repo

SOURCES = {
    "pkg/core.py": "class Engine:\n    def start(self):\n        return make_config()\n\n\ndef make_config():\n    return {}\n",
    "pkg/cli.py": "from pkg.core import Engine, make_config\n\n\ndef main():\n    Engine().start()\n    make_config()\n",
    "pkg/extra.py": "def rarely_used_helper():\n    return 1\n",
    "web/app.ts": "export interface Store { get(k: string): string }\nexport class MemoryStore implements Store {"
    " get(k: string) { return k } }\n",
    "svc/main.go": "package main\n\ntype Server struct{}\n\nfunc (s Server) Serve() {}\n\nfunc main() { Server{}.Serve() }\n",
    "lib/x.rs": "pub struct Point { x: i32 }\npub fn origin() -> Point { Point { x: 0 } }\n",
    "README.md": "not code\n",
}


def test_every_language_query_compiles() -> None:
    for language in DEFINITIONS:
        _compiled(language)


def test_definitions_and_references_per_language() -> None:
    ts = extract("web/app.ts", SOURCES["web/app.ts"].encode())
    assert ts is not None and {d.name for d in ts.definitions} == {"Store", "MemoryStore", "get"}
    go = extract("svc/main.go", SOURCES["svc/main.go"].encode())
    assert go is not None and {(d.name, d.kind) for d in go.definitions} == {
        ("Server", "type"),
        ("Serve", "method"),
        ("main", "function"),
    }
    assert extract("README.md", b"x") is None


async def _index(tmp_path: Path, files: dict[str, str] = SOURCES):  # type: ignore[no-untyped-def]
    repo = make_repo(tmp_path / "repo", files)
    git_dir = repo / ".git"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, check=True).stdout.decode()
    tree = await load_index(git_dir, commit.strip(), scope="repo_test")
    return git_dir, tree


async def test_the_map_ranks_what_is_referenced_and_fits_the_budget(tmp_path: Path) -> None:
    git_dir, tree = await _index(tmp_path)
    index = await build_index(git_dir, tree.commit, tree.files, CodeIntelSettings(), scope="t")
    assert {f.path for f in index.files} == {p for p in SOURCES if not p.endswith(".md")}
    ranked = rank(index)
    order = [r.definition.name for r in ranked]
    assert "make_config" in order[:3]  # referenced from two files, a specific name
    assert order.index("rarely_used_helper") > max(order.index("make_config"), order.index("Engine"))
    small = render(ranked, max_tokens=20)
    assert small.tokens <= 20 and small.definitions < small.total_definitions
    whole = render(ranked, max_tokens=4096)
    assert (
        whole.definitions == whole.total_definitions and "pkg/extra.py:\n    1│def rarely_used_helper():" in whole.text
    )
    defs, refs = find(index, "make_config")
    assert [(d["path"], d["line"]) for d in defs] == [("pkg/core.py", 6)]
    assert [r["path"] for r in refs] == ["pkg/cli.py", "pkg/core.py"]


async def test_indexes_are_cached_per_registration(tmp_path: Path) -> None:
    git_dir, tree = await _index(tmp_path)
    cache = IndexCache(tmp_path / "cache", 1024**3)
    settings = CodeIntelSettings()
    first, hit = await cached_index(cache, "repo_a", git_dir, tree.commit, tree.files, settings)
    assert hit is False
    again, hit = await cached_index(cache, "repo_a", git_dir, tree.commit, tree.files, settings)
    assert hit is True and again.to_json() == first.to_json()
    _, hit = await cached_index(cache, "repo_b", git_dir, tree.commit, tree.files, settings)
    assert hit is False  # another registration (another tenant's) never gets A's entry
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["repo_a", "repo_b"]
    with pytest.raises(ValueError):
        cache.path("../escape", tree.commit)


async def test_bounds_leave_files_out_and_say_so(tmp_path: Path) -> None:
    git_dir, tree = await _index(tmp_path)
    index = await build_index(git_dir, tree.commit, tree.files, CodeIntelSettings(max_files=10), scope="t")
    assert index.skipped == {}
    index = await build_index(git_dir, tree.commit, tree.files, CodeIntelSettings(max_files=2), scope="t")
    assert len(index.files) == 2 and index.skipped == {"over_max_files": 4}


OFFLINE = """
import asyncio, socket, sys
from pathlib import Path
def refuse(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.bind"):
        raise PermissionError(f"network use while indexing: {event} {args!r}")
sys.addaudithook(refuse)
from crewwork.codeintel.repomap import build_index, rank, render
from crewwork.config.codeintel import CodeIntelSettings
from crewwork.repos.trees import load_index
git_dir, commit = Path(sys.argv[1]), sys.argv[2]
async def main():
    tree = await load_index(git_dir, commit, scope="offline")
    index = await build_index(git_dir, commit, tree.files, CodeIntelSettings(), scope="t")
    print(len(index.files), render(rank(index), 512).definitions)
asyncio.run(main())
"""


@pytest.mark.parametrize("isolation", ["socket_guard", "network_namespace"])
async def test_indexing_needs_no_network(tmp_path: Path, isolation: str) -> None:
    git_dir, tree = await _index(tmp_path)
    argv = [sys.executable, "-c", OFFLINE, str(git_dir), tree.commit]
    if isolation == "network_namespace":
        if shutil.which("unshare") is None or os.geteuid() != 0:
            pytest.skip("needs root and util-linux's unshare")
        argv = ["unshare", "--net", *argv]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "empty-cache"), "HOME": str(tmp_path / "home")}
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=Path(__file__).resolve().parents[2]
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-2000:]
    files, definitions = (int(x) for x in out.split())
    assert files == 6 and definitions > 5
    assert not (tmp_path / "empty-cache").exists()  # nothing was downloaded into a cache either
