"""search_code and repo_map on real repositories, cold and cached, side by side with ripgrep run bare.

Two repositories: toolz 1.0.0 rebuilt from its sdist (tests/repos/pkgindex.py), and one of ~100k lines of Python the
benchmark generates (modules of functions and classes that call each other; made at run time, never committed).
Each is cloned into a bare mirror the way a host's mirror cache holds it. Measured, interleaved round by round so
every engine sees the same machine noise:

- **search_code engine**: what the tool runs under the MCP layer (crewwork.repos.trees: the ref resolved in the
  mirror, `git grep -F -f - <commit>` on the bare mirror with the bounds of the tool), for a common literal (cut at
  50 matches), a rare literal and a regular expression;
- **rg bare**: `rg -n --no-heading` (`-F` for literals) over a plain checkout of the same commit, the same query, no
  bound (what a developer's ripgrep does on their own disk);
- **repo_map**: cold (a fresh index cache: tree listing, every source blob read through one `git cat-file --batch`,
  tree-sitter tags, ranking, rendering 1024 tokens) and cached (the index from the cache, ranked and rendered again).

The MCP HTTP layer (authentication, rate-limit charge, JSON-RPC) adds the same few milliseconds to every call and is
not part of these figures (bench/api.py measures the API's request overhead). Prerequisites are checked first.

    .venv/bin/python bench/mcp.py [--rounds 9] [--lines 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import machine, table, write_results  # noqa: E402
from crewwork.codeintel.repomap import IndexCache, cached_index, rank, render  # noqa: E402
from crewwork.config.codeintel import CodeIntelSettings  # noqa: E402
from crewwork.repos.gitproc import run_bounded  # noqa: E402
from crewwork.repos.trees import load_index, resolve_commit  # noqa: E402

GIT_ENV = {
    "GIT_AUTHOR_NAME": "b",
    "GIT_AUTHOR_EMAIL": "b@x",
    "GIT_COMMITTER_NAME": "b",
    "GIT_COMMITTER_EMAIL": "b@x",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "PATH": "/usr/bin:/bin",
}


def prerequisites() -> None:
    missing = [tool for tool in ("git", "rg") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"missing: {', '.join(missing)} (apt-get install -y git ripgrep; scripts/test-env.sh installs both)")


def generate(dest: Path, lines: int) -> Path:
    """A repository of ~`lines` lines of Python: packages of modules whose functions call functions of other modules."""
    dest.mkdir(parents=True)
    per_module = 400
    modules = max(1, lines // per_module)
    for m in range(modules):
        pkg = dest / f"pkg{m // 25}"
        pkg.mkdir(exist_ok=True)
        (pkg / "__init__.py").touch()
        body = [
            f'"""Module {m}."""',
            "",
            f"from pkg{(m * 7 + 3) % modules // 25} import mod{(m * 7 + 3) % modules}",
            "",
        ]
        funcs = 0
        while len(body) < per_module:
            other = (m * 31 + funcs * 17) % modules
            body += [
                f"def compute_{m}_{funcs}(value, factor=2):",
                f'    """Compute step {funcs} of module {m}."""',
                "    total = 0",
                "    for i in range(value):",
                f"        total += mod{other}.helper_{other}_{funcs % 5}(i) * factor",
                "    return total",
                "",
                "",
            ]
            funcs += 1
        for k in range(5):
            body += [f"def helper_{m}_{k}(x):", f"    return x + {k}", "", ""]
        body += [f"class Service{m}:", "    def run(self):", f"        return compute_{m}_0(10)", ""]
        (pkg / f"mod{m}.py").write_text("\n".join(body) + "\n")
    _commit(dest)
    return dest


def toolz(dest: Path) -> Path:
    from tests.repos.pkgindex import toolz_repo

    try:
        repo, _ = toolz_repo(dest)
    except StopIteration:
        sys.exit("toolz's sdist is not in .cache/test-packages (make install, then run tests/repos once)")
    return repo


def _commit(repo: Path) -> None:
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-qm", "generated"]):
        subprocess.run(cmd, cwd=repo, check=True, env=GIT_ENV)


def mirror_of(repo: Path, dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(dest)], check=True, env=GIT_ENV)
    return dest


def count_lines(repo: Path) -> int:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True, env=GIT_ENV).stdout
    total = 0
    for name in out.split(b"\0"):
        if name.endswith(b".py"):
            total += (repo / name.decode()).read_bytes().count(b"\n")
    return total


async def search(mirror: Path, query: str, regex: bool) -> int:
    commit = await resolve_commit(mirror, "main", scope="bench")
    argv = ["grep", "-z", "-n", "-I", "--no-color", "--full-name", "-E" if regex else "-F", "-f", "-", commit, "--"]
    res = await run_bounded(mirror, *argv, stdin=query.encode() + b"\n", max_bytes=51 * 1100, timeout_s=10)
    return min(50, res.data.count(b"\n"))


def rg(checkout: Path, query: str, regex: bool) -> int:
    argv = ["rg", "-n", "--no-heading", *([] if regex else ["-F"]), "-e", query, str(checkout)]
    out = subprocess.run(argv, capture_output=True, check=False).stdout
    return out.count(b"\n")


async def repo_map(mirror: Path, cache: IndexCache, scope: str) -> tuple[int, bool]:
    commit = await resolve_commit(mirror, "main", scope=scope)
    tree = await load_index(mirror, commit, scope=scope + str(time.monotonic()))  # no listing cache: like a cold call
    index, hit = await cached_index(cache, scope, mirror, commit, tree.files, CodeIntelSettings())
    return render(rank(index), 1024).definitions, hit


def timed_sync(fn: Any, *args: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*args)
    return (time.perf_counter() - t0) * 1000, out


async def timed(coro: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = await coro
    return (time.perf_counter() - t0) * 1000, out


async def run(rounds: int, lines: int) -> dict[str, Any]:
    prerequisites()
    tmp = Path(tempfile.mkdtemp(prefix="crewwork-bench-mcp-"))
    try:
        repos = {"toolz": toolz(tmp / "toolz"), f"generated ({lines // 1000}k lines)": generate(tmp / "gen", lines)}
        rows: list[list[Any]] = []
        results: dict[str, Any] = {}
        for name, repo in repos.items():
            mirror = mirror_of(repo, tmp / f"{repo.name}.git")
            size = count_lines(repo)
            queries = [
                ("common literal 'return'", "return", False),
                ("rare literal", "helper_3_4(" if "generated" in name else "def merge_sorted", False),
                ("regex 'def [a-z_]+\\('", r"def [a-z_]+\(", True),
            ]
            # Warm the page cache once for every engine, then interleave.
            for _, q, rx in queries:
                await search(mirror, q, rx)
                rg(repo, q, rx)
            samples: dict[str, list[float]] = {}
            counts: dict[str, Any] = {}
            cold_maps: list[float] = []
            cached_maps: list[float] = []
            for r in range(rounds):
                for label, q, rx in queries:
                    ms, n = await timed(search(mirror, q, rx))
                    samples.setdefault(f"search {label}", []).append(ms)
                    counts[f"search {label}"] = n
                    ms, n = timed_sync(rg, repo, q, rx)
                    samples.setdefault(f"rg {label}", []).append(ms)
                    counts[f"rg {label}"] = n
                cache = IndexCache(tmp / f"cache-{name[:5]}-{r}", 1024**3)
                ms, (defs, hit) = await timed(repo_map(mirror, cache, f"bench{r}"))
                assert not hit
                cold_maps.append(ms)
                ms, (defs, hit) = await timed(repo_map(mirror, cache, f"bench{r}"))
                assert hit
                cached_maps.append(ms)
                counts["repo_map definitions"] = defs
            med = {k: statistics.median(v) for k, v in samples.items()}
            for label, _, _ in queries:
                ours, bare = med[f"search {label}"], med[f"rg {label}"]
                rows.append(
                    [
                        name,
                        f"search_code {label}",
                        ours,
                        bare,
                        ours / bare,
                        counts[f"search {label}"],
                        counts[f"rg {label}"],
                    ]
                )
            rows.append([name, "repo_map cold (1024 tokens)", statistics.median(cold_maps), "", "", "", ""])
            rows.append([name, "repo_map cached", statistics.median(cached_maps), "", "", "", ""])
            results[name] = {
                "python_lines": size,
                "median_ms": med,
                "repo_map_cold_ms": cold_maps,
                "repo_map_cached_ms": cached_maps,
                "counts": counts,
            }
            print(f"{name}: {size} lines of Python")
        print(
            table(
                ["repository", "what", "crewwork p50 ms", "rg bare p50 ms", "ratio", "lines shown", "rg lines"],
                rows,
            )
        )
        return {"rounds": rounds, "results": results, "table": rows}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--lines", type=int, default=100_000)
    args = parser.parse_args()
    print(machine())
    data = asyncio.run(run(args.rounds, args.lines))
    write_results("mcp", data)


if __name__ == "__main__":
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    main()
