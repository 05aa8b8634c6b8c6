"""What a contained workspace costs next to the old `git worktree` one, interleaved in one run.

- `worktree`: the old way, `git worktree add` + `git add -A` + `git diff --cached` + `git worktree remove`
  (host git in an agent-writable work tree);
- `workspace`: `crewwork.workspace.tree.Workspace` without a disk cap: private git dir, blobs written by the host,
  capture by a no-follow walk + fast-import, removal;
- `workspace+loop`: the same on its own loopback ext4 image (the disk cap; needs root).

Each round changes one file of a repository of N small files and captures the diff.

    .venv/bin/python bench/workspace.py [--runs 20] [--files 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from crewwork.sandbox.disk import loop_available
from crewwork.workspace.tree import CaptureLimits, Workspace, gitops

ENV = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
LIMITS = CaptureLimits(max_diff_bytes=16 << 20, max_file_bytes=16 << 20)


def git(*args: str, cwd: Path) -> bytes:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True).stdout


def make_repo(root: Path, files: int) -> tuple[Path, str]:
    repo = root / "repo"
    for i in range(files):
        p = repo / f"pkg{i % 10}" / f"m{i}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x = 1\n" * 40)
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=b", "-c", "user.email=b@x", "commit", "-qm", "base", cwd=repo)
    return repo, git("rev-parse", "HEAD", cwd=repo).decode().strip()


async def worktree_round(repo: Path, commit: str, path: Path) -> float:
    t = time.perf_counter()
    git("worktree", "add", "--detach", "--force", str(path), commit, cwd=repo)
    (path / "pkg0" / "m0.py").write_text("x = 2\n")
    git("add", "-A", cwd=path)
    git("diff", "--cached", "--binary", commit, cwd=path)
    git("worktree", "remove", "--force", str(path), cwd=repo)
    return time.perf_counter() - t


async def workspace_round(repo: Path, commit: str, home: Path, disk_mb: int | None) -> float:
    t = time.perf_counter()
    ws = await Workspace.create(git_dir=gitops.git_dir_of(repo), home=home, commit=commit, disk_mb=disk_mb, owner=None)
    (ws.path / "pkg0" / "m0.py").write_text("x = 2\n")
    cap = await ws.capture(LIMITS)
    assert cap.stats.files == ["pkg0/m0.py"], cap.stats
    await ws.remove()
    return time.perf_counter() - t


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--files", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="crewwork-bench-ws-") as tmp:
        root = Path(tmp)
        repo, commit = make_repo(root, args.files)
        kinds = {"worktree": [], "workspace": []}  # type: dict[str, list[float]]
        if loop_available()[0]:
            kinds["workspace+loop"] = []
        for i in range(args.runs):
            kinds["worktree"].append(await worktree_round(repo, commit, root / f"wt{i}"))
            kinds["workspace"].append(await workspace_round(repo, commit, root / f"ws{i}", None))
            if "workspace+loop" in kinds:
                kinds["workspace+loop"].append(await workspace_round(repo, commit, root / f"wl{i}", 256))
    base = statistics.median(kinds["worktree"])
    print(f"make + change one file + capture + remove, {args.files} files, median of {args.runs} (interleaved)")
    print(f"{'kind':<16} {'median ms':>10} {'p90 ms':>8} {'x worktree':>11}")
    for kind, xs in kinds.items():
        xs.sort()
        p90 = xs[int(0.9 * (len(xs) - 1))]
        print(
            f"{kind:<16} {statistics.median(xs) * 1000:>10.1f} {p90 * 1000:>8.1f} {statistics.median(xs) / base:>11.2f}"
        )


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    asyncio.run(main())
