"""Git operations on the host: resolving repositories and refs, per-attempt worktrees, diffs and fenced landing.

Everything shells out to `git` with an explicit argv (never a shell), with a fixed identity and no user config,
so results do not depend on the operator's ~/.gitconfig.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from crewwork.models import DiffStats

ZERO_SHA = "0" * 40
DELIVERY_BRANCH_PREFIX = "crewwork/"
# Files the platform writes into a workspace (reports, logs) that never belong to a change.
PLATFORM_DIR = ".crewwork"

_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "crewwork",
    "GIT_AUTHOR_EMAIL": "crewwork@localhost",
    "GIT_COMMITTER_NAME": "crewwork",
    "GIT_COMMITTER_EMAIL": "crewwork@localhost",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}


class GitError(RuntimeError):
    pass


class RepoRejected(ValueError):
    """A submitted repository or ref is unusable; the message says why (shown to the submitter)."""


@dataclass
class GitResult:
    code: int
    out: str
    err: str


async def git(
    *args: str, cwd: Path | str, check: bool = True, input_bytes: bytes | None = None, timeout_s: float = 120
) -> GitResult:
    env = {**os.environ, **_GIT_ENV}
    proc = await asyncio.create_subprocess_exec(
        "git",
        *args,
        cwd=str(cwd),
        env=env,
        stdin=asyncio.subprocess.PIPE if input_bytes is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(input_bytes), timeout_s)
    except (TimeoutError, asyncio.CancelledError):
        proc.kill()
        await proc.wait()
        raise
    res = GitResult(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))
    if check and res.code != 0:
        raise GitError(f"git {' '.join(args)} failed ({res.code}): {res.err.strip() or res.out.strip()}")
    return res


def repo_path_from_url(url: str, roots: list[Path]) -> Path:
    """Turn a submitted repo URL into a local path that is checked against the allowed roots.

    Accepts absolute paths and file:// URLs; a relative path is resolved against each allowed root and must not
    escape it. Symlinks are resolved before the check, so a link cannot point out of a root."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise RepoRejected(f"repo.url {url!r}: file:// URLs must name a local path (file:///path)")
        raw = unquote(parsed.path)
    elif parsed.scheme in ("", None) or (len(parsed.scheme) == 1 and os.name == "nt"):
        raw = url
    else:
        raise RepoRejected(
            f"repo.url {url!r}: only local paths and file:// URLs are supported so far (got scheme {parsed.scheme!r})"
        )
    if "\x00" in raw:
        raise RepoRejected("repo.url contains a NUL byte")
    candidate = Path(raw)
    if not candidate.is_absolute():
        if not roots:
            raise RepoRejected(
                f"repo.url {url!r} is relative; use an absolute path (no CREWWORK_REPO_ROOTS is configured)"
            )
        for root in roots:
            resolved = (root / candidate).resolve()
            if resolved.is_relative_to(root) and resolved.exists():
                return _check_is_repo(resolved, url)
        raise RepoRejected(f"repo.url {url!r} is not a repository under any allowed root (or it escapes them)")
    resolved = candidate.resolve()
    if roots and not any(resolved.is_relative_to(r) for r in roots):
        allowed = ", ".join(str(r) for r in roots)
        raise RepoRejected(f"repo.url {url!r} is outside the allowed repository roots ({allowed})")
    return _check_is_repo(resolved, url)


def _check_is_repo(path: Path, url: str) -> Path:
    if not path.exists():
        raise RepoRejected(f"repo.url {url!r}: no such directory")
    if not path.is_dir():
        raise RepoRejected(f"repo.url {url!r}: not a directory")
    if not ((path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())):
        raise RepoRejected(f"repo.url {url!r}: not a git repository")
    return path


async def resolve_commit(repo: Path, ref: str) -> str:
    res = await git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}", cwd=repo, check=False)
    sha = res.out.strip()
    if res.code != 0 or not re.fullmatch(r"[0-9a-f]{40,64}", sha):
        raise RepoRejected(f"repo.ref {ref!r} does not exist in {repo}")
    return sha


async def add_worktree(repo: Path, path: Path, commit: str) -> Path:
    """A fresh, detached worktree at `commit`. Replaces whatever a previous (crashed) attempt left at `path`."""
    if path.exists():
        await remove_worktree(repo, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    await git("worktree", "add", "--detach", "--force", str(path), commit, cwd=repo)
    return path


async def remove_worktree(repo: Path, path: Path) -> None:
    await git("worktree", "remove", "--force", str(path), cwd=repo, check=False)
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
    await git("worktree", "prune", cwd=repo, check=False)


async def capture_diff(worktree: Path, base_commit: str) -> tuple[str, DiffStats]:
    """Everything the agent changed relative to the base commit, as a binary-safe unified diff."""
    await git("add", "-A", "--", ".", f":(exclude){PLATFORM_DIR}", cwd=worktree)
    diff = (await git("diff", "--cached", "--binary", "--no-color", "--no-ext-diff", base_commit, cwd=worktree)).out
    stats = DiffStats()
    numstat = (await git("diff", "--cached", "--numstat", base_commit, cwd=worktree)).out
    for line in numstat.splitlines():
        parts = line.split("\t", 2)
        if len(parts) != 3:
            continue
        ins, dels, name = parts
        stats.files_changed += 1
        stats.insertions += int(ins) if ins.isdigit() else 0
        stats.deletions += int(dels) if dels.isdigit() else 0
        stats.files.append(name)
    return diff, stats


async def apply_diff(worktree: Path, diff: str) -> tuple[bool, str]:
    if not diff.strip():
        return True, ""
    res = await git(
        "apply",
        "--index",
        "--whitespace=nowarn",
        "--binary",
        "-",
        cwd=worktree,
        check=False,
        input_bytes=diff.encode(),
    )
    return res.code == 0, res.err.strip()


async def reset_paths(worktree: Path, base_commit: str, paths: list[str]) -> list[str]:
    """Restore `paths` to their content at the base commit (the tests a change is judged by)."""
    restored: list[str] = []
    for p in paths:
        if (await git("cat-file", "-e", f"{base_commit}:{p}", cwd=worktree, check=False)).code == 0:
            await git("checkout", base_commit, "--", p, cwd=worktree)
            restored.append(p)
    return restored


def delivery_branch(work_item_id: str) -> str:
    return f"{DELIVERY_BRANCH_PREFIX}{work_item_id}"


async def land(
    repo: Path, *, work_item_id: str, base_commit: str, diff: str, message: str, scratch: Path
) -> tuple[str, str, bool]:
    """Commit `diff` on top of `base_commit` and point `crewwork/<id>` at it with compare-and-swap.

    Never touches the target branch or any checkout. Returns (branch, commit, created). Idempotent: if the branch
    already holds a commit with the same tree on the same parent (a retried landing), that commit is returned."""
    branch = delivery_branch(work_item_id)
    ref = f"refs/heads/{branch}"
    wt = await add_worktree(repo, scratch, base_commit)
    try:
        ok, err = await apply_diff(wt, diff)
        if not ok:
            raise GitError(f"the change no longer applies to {base_commit[:12]}: {err}")
        tree = (await git("write-tree", cwd=wt)).out.strip()
    finally:
        await remove_worktree(repo, scratch)
    existing = (await git("rev-parse", "--verify", "--quiet", ref, cwd=repo, check=False)).out.strip()
    if existing:
        same = await _commit_matches(repo, existing, tree, base_commit)
        if same:
            return branch, existing, False
        raise GitError(f"{branch} already exists at {existing[:12]} with different content; refusing to move it")
    commit = (await git("commit-tree", tree, "-p", base_commit, "-m", message, cwd=repo)).out.strip()
    res = await git("update-ref", "-m", f"crewwork land {work_item_id}", ref, commit, ZERO_SHA, cwd=repo, check=False)
    if res.code != 0:
        # Lost a race with another landing of the same item: accept it only if it is the same change.
        existing = (await git("rev-parse", "--verify", "--quiet", ref, cwd=repo, check=False)).out.strip()
        if existing and await _commit_matches(repo, existing, tree, base_commit):
            return branch, existing, False
        raise GitError(f"compare-and-swap of {ref} failed: {res.err.strip()}")
    return branch, commit, True


async def _commit_matches(repo: Path, commit: str, tree: str, parent: str) -> bool:
    info = (await git("show", "-s", "--format=%T %P", commit, cwd=repo)).out.split()
    return len(info) == 2 and info[0] == tree and info[1] == parent
