"""Parsing a tenant's source is bounded and never happens in the process that asked: a file nested too deep or with a
line too long is refused before tree-sitter sees it, a parse past its wall clock is killed with its worker (the next
file gets a fresh one), every refusal is remembered per registration and blob, and each worker runs under its memory
bound (read back from the kernel)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from crewwork.boundary import hostproc
from crewwork.codeintel import parsepool
from crewwork.codeintel.parseworker import bracket_depth, precheck
from crewwork.codeintel.repomap import build_index
from crewwork.config.codeintel import CodeIntelSettings
from crewwork.repos.trees import load_index
from tests.conftest import make_repo

GOOD = "def helper(x):\n    return x + 1\n"
# One line of 80,000 unclosed brackets: tree-sitter's error recovery spent ~29 s on it in the serving process. The
# same brackets on 800 lines of 100 pass the line bound; the depth bound refuses them.
DEEP_LINE = "x = " + "(" * 80_000 + "\n"
DEEP = "x = " + ("(" * 100 + "\n") * 800


async def _tree(tmp_path: Path, files: dict[str, str]):  # type: ignore[no-untyped-def]
    repo = make_repo(tmp_path / "repo", files)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, check=True).stdout.decode()
    return repo / ".git", await load_index(repo / ".git", commit.strip(), scope="repo_parse")


def _sha(tree, path: str) -> str:  # type: ignore[no-untyped-def]
    return str(tree.entries[path].sha)


def test_depth_counts_mismatched_closers_as_no_closers() -> None:
    assert bracket_depth(b"f(a[1], {b: (2)})") == 3
    assert bracket_depth(b"(]" * 1000) == 1000  # a `]` never closes a `(`
    assert bracket_depth(b"'((((' + ')'") == 4  # strings count: a bound, not a parse
    assert precheck(DEEP_LINE.encode(), max_depth=256, max_line_chars=10**6) == (
        "too_deep",
        "brackets nested 80000 deep, more than 256",
    )
    assert precheck(b"x" * 5000, max_depth=256, max_line_chars=4096)[0] == "line_too_long"  # type: ignore[index]
    assert precheck(GOOD.encode(), max_depth=256, max_line_chars=4096) is None


async def test_a_pathological_file_is_refused_before_parsing_and_remembered(tmp_path: Path) -> None:
    git_dir, tree = await _tree(tmp_path, {"deep.py": DEEP, "one_line.py": DEEP_LINE, "ok.py": GOOD})
    index = await build_index(git_dir, tree.commit, tree.files, CodeIntelSettings(), scope="repo_a")
    assert [f.path for f in index.files] == ["ok.py"]
    assert index.skipped == {"too_deep": 1, "line_too_long": 1}
    assert parsepool.refused("repo_a", _sha(tree, "deep.py")) == parsepool.Refusal(
        "too_deep", "brackets nested 80000 deep, more than 256"
    )
    assert parsepool.refused("repo_b", _sha(tree, "deep.py")) is None  # per registration, like every cache


async def test_a_parse_past_its_wall_clock_is_killed_and_the_index_goes_on(tmp_path: Path) -> None:
    # With the depth bound lifted the same file reaches tree-sitter; the per-file wall clock stops it instead.
    settings = CodeIntelSettings(parse_max_depth=10**6, parse_max_line_chars=10**6, parse_file_timeout_s=1.0)
    git_dir, tree = await _tree(tmp_path, {"a_deep.py": DEEP, "b_ok.py": GOOD})
    index = await build_index(git_dir, tree.commit, tree.files, settings, scope="repo_t")
    assert [f.path for f in index.files] == ["b_ok.py"]  # parsed by a fresh worker after the kill
    assert index.skipped == {"parse_timeout": 1}
    refusal = parsepool.refused("repo_t", _sha(tree, "a_deep.py"))
    assert refusal is not None and "CREWWORK_CODEINTEL_PARSE_FILE_TIMEOUT_S" in refusal.detail
    # Remembered: the same blob at another commit is not parsed again (no worker is even asked).
    again = await build_index(git_dir, tree.commit, tree.files, settings, scope="repo_t")
    assert again.skipped == {"parse_timeout": 1}


async def test_parse_workers_run_under_their_memory_bound_and_share_a_few_slots(tmp_path: Path) -> None:
    settings = CodeIntelSettings(parse_workers=1, parse_memory_mb=300)
    hostproc.configure(git_memory_mb=2048, query_memory_mb=512, parse_memory_mb=300)
    try:
        async with parsepool.ParseSession(settings) as session:
            assert await session.parse("repo_m", "1" * 40, "ok.py", GOOD.encode()) is not None
            assert session.worker is not None
            limits = Path(f"/proc/{session.worker.proc.pid}/limits").read_text()
            data = next(line for line in limits.splitlines() if line.startswith("Max data size"))
            assert data.split()[3:5] == [str(300 * 1024 * 1024), str(300 * 1024 * 1024)], data
            # The one slot is held: a second session waits until the first ends.
            second = asyncio.ensure_future(parsepool.ParseSession(settings).__aenter__())
            await asyncio.sleep(0.2)
            assert not second.done()
        await asyncio.wait_for(second, 10)
        await second.result().__aexit__(None, None, None)
    finally:
        hostproc.configure(git_memory_mb=2048, query_memory_mb=512, parse_memory_mb=512)
