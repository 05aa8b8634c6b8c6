"""One tenant cannot exhaust the host through the MCP endpoint: a regular expression whose automaton explodes is
refused before git sees it, a git process that still grows past its memory bound fails alone with a clear error, one
tenant's calls beyond its slots are refused at once, and a source file whose parse would run for minutes is parsed
(and stopped) in a worker process, never in the API's. In each case another tenant's request, made while the bound is
being hit, completes and is answered correctly; its latencies are printed as figures (`pytest -s`), never asserted."""

from __future__ import annotations

import asyncio
import contextlib
import random
import string
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from tests.api.conftest import LiveApi, Stack
from tests.conftest import make_repo
from tests.mcp.conftest import call, fails, mcp_client, register

# 800 lines of 100 unclosed brackets: tree-sitter's error recovery spends ~20 s on it (the depth bound refuses it
# by default; these tests lift that bound to hit the per-file wall clock instead).
# 160,000 unclosed brackets: tree-sitter takes ~20 s on a quiet 2-core machine (time grows with the square of the
# depth; 80,000 took 5 s, under the test's 8 s bound), so the per-file clock is what stops it, loaded or not.
DEEP = "x = " + ("(" * 100 + "\n") * 1600


def _text(mib: int) -> str:
    rng = random.Random(41)
    line = string.ascii_letters + "      "
    return "\n".join("".join(rng.choices(line, k=100)) for _ in range(mib * 10_000)) + "\n"


@contextlib.contextmanager
def _own_api(stack: Stack, **changes: Any) -> Any:
    """An API of its own on the module's crew, with settings changed: a section by a dict of its fields (mcp={...}),
    a top-level field by its value."""
    s = stack.api.settings
    update = {
        name: getattr(s, name).model_copy(update=value) if isinstance(value, dict) else value
        for name, value in changes.items()
    }
    api = LiveApi(s.model_copy(update=update)).start()
    try:
        yield Stack(stack.crew, api, stack.alpha, stack.beta, stack.admin)
    finally:
        api.stop()
        from crewwork.boundary import hostproc

        hostproc.configure_from(stack.api.settings)  # the module's API's bounds again (they are per process)


def _running(*needles: str) -> bool:
    """Whether a process whose command line holds every needle runs on this host."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if all(n in argv for n in needles):
                return True
    return False


async def _until(what: Callable[[], bool], why: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, why
        await asyncio.sleep(0.02)


async def _timed(step: Awaitable[Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = await step
    return result, time.perf_counter() - start


@contextlib.asynccontextmanager
async def _beta_checks(world: Stack, beta_repo: str) -> AsyncIterator[Callable[[], Awaitable[list[float]]]]:
    """Tenant beta's requests, each checked for its answer; returns their latencies (seconds). The first round (which
    fetches beta's mirror) is made before the caller starts its load, and is not counted."""
    async with mcp_client(world, world.beta) as b:

        async def run(rounds: int = 3) -> list[float]:
            took = []
            for _ in range(rounds):
                listed, s1 = await _timed(call(b, "list_repositories"))
                assert [r["id"] for r in listed["repositories"]] == [beta_repo]
                read, s2 = await _timed(call(b, "read_file", repo=beta_repo, path="README.md"))
                assert read["content"] == "# beta's own\n"
                took += [s1, s2]
            return took

        await run(1)
        yield run


def _figures(label: str, took: list[float], idle: list[float]) -> None:
    ms = sorted(round(t * 1000, 1) for t in took)
    base = sorted(round(t * 1000, 1) for t in idle)
    med, idle_med = ms[len(ms) // 2], base[len(base) // 2]
    print(
        f"\n[bounds] {label}: another tenant's MCP calls answered in {ms} ms (median {med} ms); the same calls with "
        f"no load, just before: median {idle_med} ms; ratio {med / idle_med:.1f}"
    )


async def test_an_exploding_regular_expression_is_refused_before_git_runs(stack: Stack, tmp_path: Path) -> None:
    rid = await register(stack, make_repo(tmp_path / "big", {"big.txt": _text(1)}))
    async with mcp_client(stack) as c:
        code, msg = await fails(c, "search_code", repo=rid, query="[[:alpha:]]{0,32767}b", regex=True)
        assert code == "invalid_argument" and "invalid repetition size" in msg
        code, msg = await fails(c, "search_code", repo=rid, query="(x|xx|xxx|xxxx){0,1000}", regex=True)
        assert code == "invalid_argument" and "CREWWORK_MCP_MAX_REGEX_PROGRAM_SIZE" in msg and "10004" in msg
        code, msg = await fails(c, "search_code", repo=rid, query="(a)\\1", regex=True)
        assert code == "invalid_argument" and "\\1" in msg  # back-references are not linear-time: refused
        # Ordinary patterns still search (POSIX classes, \b, \w, alternation, a modest count).
        hits = await call(c, "search_code", repo=rid, query="\\b[[:upper:]]{3}\\w{0,50}(ab|cd)", regex=True)
        assert hits["matches"] and not hits["timed_out"]


async def test_a_git_process_past_its_memory_bound_fails_alone(stack: Stack, tmp_path: Path) -> None:
    # The pattern check lifted and the memory bound lowered, so the bound itself is what stops git.
    with _own_api(stack, mcp={"max_regex_program_size": 1_000_000}, git_query_memory_mb=64) as world:
        rid = await register(world, make_repo(tmp_path / "big", {"big.txt": _text(1)}))
        beta_repo = await register(world, make_repo(tmp_path / "beta", {"README.md": "# beta's own\n"}), world.beta)
        async with mcp_client(world) as a, _beta_checks(world, beta_repo) as beta:
            idle = await beta()
            search = asyncio.ensure_future(
                fails(a, "search_code", repo=rid, query="(x|xx|xxx|xxxx){0,1000}", regex=True)
            )
            took = await beta()
            code, msg = await search
        assert code == "limit_exceeded" and "CREWWORK_GIT_QUERY_MEMORY_MB" in msg and "64 MiB" in msg
        _figures("git grep past its 64 MiB bound", took, idle)


async def test_one_tenant_cannot_hold_every_slot(stack: Stack, tmp_path: Path) -> None:
    with _own_api(
        stack,
        mcp={"max_concurrent_calls_per_tenant": 1, "max_regex_program_size": 1_000_000, "search_timeout_s": 60},
    ) as world:
        rid = await register(world, make_repo(tmp_path / "big", {"big.txt": _text(3)}))
        beta_repo = await register(world, make_repo(tmp_path / "beta", {"README.md": "# beta's own\n"}), world.beta)
        async with mcp_client(world) as a, mcp_client(world) as a2, _beta_checks(world, beta_repo) as beta:
            idle = await beta()
            mirrors = f"--git-dir={world.api.settings.resolved_mirror_dir()}"
            held = []
            # On a loaded machine alpha's search can end before beta's answer comes back, which proves nothing either
            # way: such a round is tried again (at most five), and one round must show beta answered while held.
            # Beta asks one round (two calls) while held, so a slow machine's answer still fits in the search.
            for _ in range(5):
                slow = asyncio.ensure_future(
                    call(a, "search_code", repo=rid, query="(\\w{0,100}\\s{0,100}){0,10}", regex=True)
                )
                await _until(lambda: _running(mirrors, "grep", "-E"), "the slow search never started git grep")
                code, msg = await fails(a2, "read_file", repo=rid, path="big.txt", start_line=1, end_line=1)
                assert code == "busy" and "CREWWORK_MCP_MAX_CONCURRENT_CALLS_PER_TENANT" in msg
                took = await beta(1)
                held.append(not slow.done())
                await slow
                if held[-1]:
                    break
            assert held[-1], "beta was never answered while alpha's search held alpha's one slot"
        _figures("another tenant's search holding its slot", took, idle)


async def test_a_pathological_source_file_never_stalls_the_api(stack: Stack, tmp_path: Path) -> None:
    # The depth and line bounds lifted: the file reaches tree-sitter, in a worker, and the per-file clock stops it.
    with _own_api(
        stack,
        codeintel={"parse_max_depth": 10**6, "parse_max_line_chars": 10**7, "parse_file_timeout_s": 8.0},
    ) as world:
        rid = await register(world, make_repo(tmp_path / "deep", {"a_deep.py": DEEP, "b_ok.py": "def ok():\n  1\n"}))
        beta_repo = await register(world, make_repo(tmp_path / "beta", {"README.md": "# beta's own\n"}), world.beta)
        async with mcp_client(world) as a, _beta_checks(world, beta_repo) as beta:
            idle = await beta()
            mapping = asyncio.ensure_future(call(a, "repo_map", repo=rid))
            await _until(lambda: _running(sys.executable, "crewwork.codeintel.parseworker"), "no parse worker started")
            took = await beta()
            assert not mapping.done()  # beta was answered while alpha's file was still being parsed
            answer = await mapping
        assert answer["skipped"] == {"parse_timeout": 1} and answer["indexed_files"] == 1
        assert "ok" in answer["map"]
        _figures("a file parsing for 8 s in a worker", took, idle)
