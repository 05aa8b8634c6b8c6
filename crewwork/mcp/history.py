"""MCP git history tools: log, show and diff of a tenant's repository at commits it names, with git's external
diff and text conversion switched off."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from crewwork.mcp.context import Args, RefField, RepoField, ToolContext, _bad, _text, _where
from crewwork.mcp.repos import McpToolError, OpenRepo
from crewwork.repos.gitproc import run_bounded
from crewwork.repos.trees import TreeError, parse_path

# ---------------------------------------------------------------------------------------------- git history

_LOG_FORMAT = "%H%x00%P%x00%an%x00%ae%x00%at%x00%s%x00%x1e"
_GIT_SAFE = ("--no-color", "--no-ext-diff", "--no-textconv")


class GitLogArgs(Args):
    repo: str = RepoField
    ref: str | None = RefField
    path: str | None = Field(default=None, description="Only commits that touch this path.", max_length=4096)
    max_count: int = Field(default=20, ge=1, le=1000, description="Most commits to return.")
    skip: int = Field(default=0, ge=0, le=1_000_000, description="Commits to skip first (paging).")


def _literal(parts: tuple[str, ...]) -> list[str]:
    return [":(top,literal)" + "/".join(parts)] if parts else []


async def git_log(ctx: ToolContext, args: GitLogArgs) -> dict[str, Any]:
    m = ctx.settings.mcp
    try:
        parts = parse_path(args.path, allow_root=True) if args.path is not None else ()
    except TreeError as exc:
        raise _bad(exc) from None
    count = min(args.max_count, m.max_log_entries)
    async with ctx.repos.open(args.repo, args.ref) as repo:
        res = await run_bounded(
            repo.git_dir,
            "log",
            *_GIT_SAFE,
            "--no-mailmap",
            "--no-show-signature",
            "--no-decorate",
            f"--format={_LOG_FORMAT}",
            f"--max-count={count}",
            f"--skip={args.skip}",
            repo.commit,
            "--",
            *_literal(parts),
            max_bytes=m.max_answer_bytes,
            timeout_s=m.git_timeout_s,
        )
        # Each record ends with NUL + RS: git writes no NUL from a commit's text, so a subject holding RS (or
        # anything else) cannot end a record early and make up one.
        records = res.data.split(b"\x00\x1e")
        commits = [c for rec in records[:-1] if (c := _commit(rec)) is not None]
        tail = records[-1].strip(b"\n")
        if not commits and tail and (c := _commit(tail, cut=True)) is not None:
            # One commit's record is longer than an answer (a huge subject, author or parent list): it is given cut,
            # so that a page is never empty while commits are left, and `skip` moves past it.
            commits.append(c)
        more = res.truncated or res.timed_out or len(commits) == count
        return {
            **_where(repo),
            "commits": commits,
            "truncated": res.truncated or res.timed_out,
            # Where the next page starts; None at the end, or when this page found nothing in time (no progress to
            # offer: a narrower `path`, or later, may do better).
            "next_skip": args.skip + len(commits) if more and commits else None,
        }


def _commit(rec: bytes, *, cut: bool = False) -> dict[str, Any] | None:
    """One `_LOG_FORMAT` record; with `cut`, a record the answer's bound ended (its missing fields are None)."""
    fields = rec.strip(b"\n").split(b"\x00")
    if not re.fullmatch(rb"[0-9a-f]{40}|[0-9a-f]{64}", fields[0]) or (len(fields) != 6 and not cut):
        return None
    fields += [b""] * (6 - len(fields))
    out: dict[str, Any] = {
        "commit": _text(fields[0]),
        "parents": _text(fields[1]).split()[:100],
        "author": _text(fields[2])[:1000],
        "email": _text(fields[3])[:1000],
        "time": int(fields[4]) if fields[4].isdigit() else None,
        "subject": _text(fields[5])[:1000],
    }
    if cut:
        out["cut"] = True
    return out


class GitShowArgs(Args):
    repo: str = RepoField
    rev: str = Field(description="The commit to show (branch, tag, HEAD or commit id, with ~N / ^N).", max_length=256)
    patch: bool = Field(default=True, description="Include the patch (else only the files changed).")


async def _stat(repo: OpenRepo, base: str, head: str, m: Any, parts: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    res = await run_bounded(
        repo.git_dir,
        *("diff", *_GIT_SAFE, "--numstat", "-z", "--no-renames", base, head, "--", *_literal(parts)),
        max_bytes=m.max_answer_bytes,
        timeout_s=m.git_timeout_s,
    )
    files = []
    for rec in res.data.split(b"\x00"):
        fields = rec.strip(b"\n").split(b"\t", 2)
        if len(fields) == 3:
            files.append(
                {
                    "path": _text(fields[2]),
                    "added": int(fields[0]) if fields[0].isdigit() else None,
                    "deleted": int(fields[1]) if fields[1].isdigit() else None,
                }
            )
    return files


async def git_show(ctx: ToolContext, args: GitShowArgs) -> dict[str, Any]:
    m = ctx.settings.mcp
    async with ctx.repos.open(args.repo, args.rev) as repo:
        head = await run_bounded(
            repo.git_dir,
            "show",
            *_GIT_SAFE,
            "--no-mailmap",
            "--no-show-signature",
            "-s",
            "--format=%H%x00%P%x00%an%x00%ae%x00%at%x00%B",
            repo.commit,
            max_bytes=64 * 1024,
            timeout_s=m.git_timeout_s,
        )
        fields = head.data.split(b"\x00", 5)
        if len(fields) < 6:
            raise McpToolError("not_found", f"commit {repo.commit[:12]} cannot be shown")
        out: dict[str, Any] = {
            **_where(repo),
            "parents": _text(fields[1]).split(),
            "author": _text(fields[2]),
            "email": _text(fields[3]),
            "time": int(fields[4]) if fields[4].isdigit() else None,
            "message": _text(fields[5]).strip()[:16_000],
        }
        parents = out["parents"]
        base = parents[0] if parents else None
        diff_base = base or "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # the empty tree: a root commit's whole tree
        out["files"] = await _stat(repo, diff_base, repo.commit, m)
        if args.patch:
            p = await run_bounded(
                repo.git_dir,
                "diff",
                *_GIT_SAFE,
                "--no-renames",
                diff_base,
                repo.commit,
                "--",
                max_bytes=m.max_answer_bytes,
                timeout_s=m.git_timeout_s,
            )
            out["patch"] = _text(p.data)
            out["truncated"] = p.truncated or p.timed_out
        return out


class GitDiffArgs(Args):
    repo: str = RepoField
    base: str = Field(
        description="The commit to diff from (branch, tag, HEAD or commit id, with ~N / ^N).", max_length=256
    )
    head: str = Field(description="The commit to diff to.", max_length=256)
    path: str | None = Field(default=None, description="Only this file or directory.", max_length=4096)
    stat_only: bool = Field(default=False, description="Only the files changed and their line counts.")


async def git_diff(ctx: ToolContext, args: GitDiffArgs) -> dict[str, Any]:
    m = ctx.settings.mcp
    try:
        parts = parse_path(args.path, allow_root=True) if args.path is not None else ()
    except TreeError as exc:
        raise _bad(exc) from None
    async with ctx.repos.open(args.repo, args.base) as base, ctx.repos.open(args.repo, args.head) as head:
        out: dict[str, Any] = {
            "repository": base.registration.id,
            "base": base.commit,
            "head": head.commit,
            "files": await _stat(head, base.commit, head.commit, m, parts),
        }
        if not args.stat_only:
            p = await run_bounded(
                head.git_dir,
                "diff",
                *_GIT_SAFE,
                "--no-renames",
                base.commit,
                head.commit,
                "--",
                *_literal(parts),
                max_bytes=m.max_answer_bytes,
                timeout_s=m.git_timeout_s,
            )
            out["patch"] = _text(p.data)
            out["truncated"] = p.truncated or p.timed_out
        return out
