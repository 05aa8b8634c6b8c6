"""The MCP tools: each an arguments model (its JSON schema is what `tools/list` shows) and an async function of a
`ToolContext` (the caller's tenant, the store, the service) returning a JSON-able dict.

Repository tools read the tenant's registration through this host's mirror at a commit (crewwork.mcp.repos,
crewwork.repos.trees); nothing reads the host filesystem or a work tree. Work-item tools call the HTTP API's own
route functions (crewwork.api.work_items), so submission, policy, idempotency, tenancy and the response shapes are
exactly the API's. Every answer is bounded (CREWWORK_MCP_*; docs/mcp.md lists the bounds).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from crewwork.api.problems import ProblemError
from crewwork.api.work_items import evidence, get_item, owned, review, submit
from crewwork.config import Settings
from crewwork.mcp.repos import McpToolError, OpenRepo, TenantRepositories
from crewwork.models import ReviewDecision, WorkItemSpec
from crewwork.repos.service import Repositories
from crewwork.repos.trees import TreeError, parse_path, read_blob, read_link, resolve, run_bounded
from crewwork.service import WorkItemService, refuse_unstorable
from crewwork.store.store import Principal, Store
from crewwork.store.views import StoredWorkItem

BINARY_SNIFF_BYTES = 8000
MAX_LINE_CHARS = 500


@dataclass
class ToolContext:
    principal: Principal
    store: Store
    service: WorkItemService
    settings: Settings
    repositories: Repositories
    request: Request

    @property
    def repos(self) -> TenantRepositories:
        return TenantRepositories(self.store, self.settings, self.repositories, self.principal.tenant_id)


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


RepoField = Field(
    description="A repository this tenant registered: its id (repo_…) or its URL as registered.",
    min_length=1,
    max_length=4096,
)
RefField = Field(
    default=None,
    description="Branch, tag, HEAD or commit id, optionally with ~N / ^N (default: the repository's default ref).",
    max_length=256,
)


def _bad(exc: TreeError) -> McpToolError:
    return McpToolError(exc.code, str(exc))


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _is_binary(data: bytes) -> bool:
    return b"\x00" in data[:BINARY_SNIFF_BYTES]


def _where(repo: OpenRepo) -> dict[str, Any]:
    return {"repository": repo.registration.id, "ref": repo.ref, "commit": repo.commit}


# ---------------------------------------------------------------------------------------------- repositories


class ListRepositoriesArgs(Args):
    pass


async def list_repositories(ctx: ToolContext, args: ListRepositoriesArgs) -> dict[str, Any]:
    rows = await ctx.repos.list()
    return {
        "repositories": [
            {"id": r.id, "url": r.url, "default_ref": r.default_ref, "created_at": r.created_at} for r in rows
        ]
    }


class ReadFileArgs(Args):
    repo: str = RepoField
    path: str = Field(description="Path of a file, relative to the repository's root.", min_length=1, max_length=4096)
    ref: str | None = RefField
    start_line: int | None = Field(default=None, ge=1, description="First line to return (1-based).")
    end_line: int | None = Field(default=None, ge=1, description="Last line to return (inclusive).")


async def read_file(ctx: ToolContext, args: ReadFileArgs) -> dict[str, Any]:
    m = ctx.settings.mcp
    try:
        parts = parse_path(args.path)
    except TreeError as exc:
        raise _bad(exc) from None
    async with ctx.repos.open(args.repo, args.ref) as repo:
        index = await repo.index()
        try:
            entry = await resolve(repo.git_dir, index, parts, timeout_s=m.git_timeout_s)
            if entry is None or entry.is_dir:
                raise McpToolError("not_a_file", f"{args.path} is a directory; use list_directory")
            if entry.is_submodule:
                raise McpToolError(
                    "not_a_file",
                    f"{args.path} is a submodule at commit {entry.sha}; its files are not in this repository",
                )
            if entry.size is not None and entry.size > m.max_file_bytes:
                raise McpToolError(
                    "too_large",
                    f"{entry.path} is {entry.size} bytes; files larger than {m.max_file_bytes} bytes are not read "
                    "(CREWWORK_MCP_MAX_FILE_BYTES); search it with search_code instead",
                )
            data = await read_blob(repo.git_dir, entry.sha, max_bytes=m.max_file_bytes, timeout_s=m.git_timeout_s)
        except TreeError as exc:
            raise _bad(exc) from None
        out: dict[str, Any] = {**_where(repo), "path": entry.path, "size": len(data), "sha": entry.sha}
        if entry.path != "/".join(parts):
            out["resolved_from"] = "/".join(parts)
        if _is_binary(data):
            return {**out, "binary": True, "content": None, "note": f"binary file of {len(data)} bytes, not shown"}
        lines = _text(data).splitlines(keepends=True)
        first = args.start_line or 1
        last = min(args.end_line or len(lines), len(lines))
        if args.end_line is not None and args.start_line is not None and args.end_line < args.start_line:
            raise McpToolError("invalid_argument", "end_line is before start_line")
        shown: list[str] = []
        used = 0
        line_no = first - 1
        for line_no in range(first - 1, last):
            line = lines[line_no]
            if used + len(line.encode()) > m.max_answer_bytes:
                line_no -= 1
                break
            shown.append(line)
            used += len(line.encode())
        else:
            line_no = last - 1
        returned_last = first + len(shown) - 1
        out.update(
            binary=False,
            total_lines=len(lines),
            start_line=first,
            end_line=returned_last,
            truncated=returned_last < last,
            content="".join(shown),
        )
        if returned_last < last:
            out["note"] = (
                f"cut at {m.max_answer_bytes} bytes (CREWWORK_MCP_MAX_ANSWER_BYTES); ask for start_line="
                f"{returned_last + 1} to go on"
            )
        return out


class ListDirectoryArgs(Args):
    repo: str = RepoField
    path: str = Field(
        default="", description="Directory relative to the root ('' or '.' for the root).", max_length=4096
    )
    ref: str | None = RefField


async def list_directory(ctx: ToolContext, args: ListDirectoryArgs) -> dict[str, Any]:
    m = ctx.settings.mcp
    try:
        parts = parse_path(args.path, allow_root=True)
    except TreeError as exc:
        raise _bad(exc) from None
    async with ctx.repos.open(args.repo, args.ref) as repo:
        index = await repo.index()
        try:
            entry = await resolve(repo.git_dir, index, parts, timeout_s=m.git_timeout_s) if parts else None
        except TreeError as exc:
            raise _bad(exc) from None
        if entry is not None and not entry.is_dir:
            raise McpToolError("not_a_directory", f"{args.path} is a {entry.type}, not a directory")
        base = entry.path if entry is not None else ""
        names = sorted(index.children.get(base, []))
        listed = []
        for path in names[: m.max_directory_entries]:
            e = index.entries[path]
            item: dict[str, Any] = {"name": path.rsplit("/", 1)[-1], "path": path, "type": e.type}
            if e.is_file:
                item["size"] = e.size
            if e.is_symlink:
                try:
                    item["target"] = (await read_link(repo.git_dir, e, timeout_s=m.git_timeout_s))[:1024]
                except TreeError:
                    item["target"] = None
            if e.is_submodule:
                item["commit"] = e.sha
            listed.append(item)
        return {
            **_where(repo),
            "path": base,
            "entries": listed,
            "total": len(names),
            "truncated": len(names) > len(listed),
        }


# ---------------------------------------------------------------------------------------------- search


class SearchCodeArgs(Args):
    repo: str = RepoField
    query: str = Field(
        description="Text to find (a literal string, or a POSIX extended regular expression when `regex`).",
        min_length=1,
        max_length=1000,
    )
    ref: str | None = RefField
    regex: bool = Field(default=False, description="Treat `query` as an extended regular expression.")
    glob: str | None = Field(
        default=None,
        description="Only files matching this glob (`**` crosses directories; a glob without '/' matches the file "
        "name anywhere, e.g. '*.py').",
        max_length=512,
    )
    ignore_case: bool = Field(default=False, description="Match case-insensitively.")
    max_results: int = Field(default=50, ge=1, le=1000, description="Most matching lines to return.")


def _pathspec(glob: str) -> str:
    if any(ord(c) < 0x20 for c in glob):
        raise McpToolError("invalid_argument", "glob contains a control character")
    body = glob.strip()
    if not body or body.startswith("/"):
        raise McpToolError("invalid_argument", "glob must be relative to the repository root")
    parts = body.split("/")
    if ".." in parts:
        raise McpToolError("invalid_argument", "glob must not contain '..'")
    if "/" not in body:
        body = f"**/{body}"
    # Our own magic prefix: whatever the glob holds (':', '!', '-') is a literal pattern after it, never an option
    # or another pathspec magic.
    return f":(top,glob){body}"


async def search_code(ctx: ToolContext, args: SearchCodeArgs) -> dict[str, Any]:
    m = ctx.settings.mcp
    if "\n" in args.query or "\r" in args.query or "\x00" in args.query:
        raise McpToolError("invalid_argument", "query must be one line")
    limit = min(args.max_results, m.max_search_results)
    pathspecs = [_pathspec(args.glob)] if args.glob else []
    async with ctx.repos.open(args.repo, args.ref) as repo:
        argv = ["grep", "-z", "-n", "-I", "--no-color", "--full-name", "-E" if args.regex else "-F"]
        if args.ignore_case:
            argv.append("-i")
        # The query travels on stdin (`-f -`): it never reaches git's command line, whatever it starts with.
        argv += ["-f", "-", repo.commit, "--", *pathspecs]
        try:
            res = await run_bounded(
                repo.git_dir,
                *argv,
                stdin=args.query.encode() + b"\n",
                max_bytes=(limit + 1) * (MAX_LINE_CHARS + 600),
                timeout_s=m.search_timeout_s,
            )
        except TreeError as exc:
            if args.regex:
                raise McpToolError(
                    "invalid_argument", f"the regular expression was refused: {args.query[:200]!r}"
                ) from exc
            raise _bad(exc) from None
        matches = []
        prefix = f"{repo.commit}:".encode()
        for rec in res.data.split(b"\n"):
            fields = rec.split(b"\x00", 2)
            if len(fields) != 3 or not fields[0].startswith(prefix) or not fields[1].isdigit():
                continue
            text = _text(fields[2])
            matches.append(
                {
                    "path": _text(fields[0][len(prefix) :]),
                    "line": int(fields[1]),
                    "text": text[:MAX_LINE_CHARS] + ("…" if len(text) > MAX_LINE_CHARS else ""),
                }
            )
            if len(matches) > limit:
                break
        truncated = res.truncated or len(matches) > limit
        return {
            **_where(repo),
            "query": args.query,
            "engine": "git grep (bare mirror, at the commit)",
            "matches": matches[:limit],
            "truncated": truncated,
            "timed_out": res.timed_out,
        }


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
        commits = []
        for rec in res.data.split(b"\x1e"):
            fields = rec.strip(b"\n").split(b"\x00")
            if len(fields) < 6 or not fields[0]:
                continue
            commits.append(
                {
                    "commit": _text(fields[0]),
                    "parents": _text(fields[1]).split(),
                    "author": _text(fields[2]),
                    "email": _text(fields[3]),
                    "time": int(fields[4]) if fields[4].isdigit() else None,
                    "subject": _text(fields[5])[:1000],
                }
            )
        return {**_where(repo), "commits": commits, "truncated": res.truncated or res.timed_out}


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


# ---------------------------------------------------------------------------------------------- work items

ItemId = Field(description="A work item of this tenant (wi_…).", min_length=1, max_length=64)


class WorkItemArgs(Args):
    work_item_id: str = ItemId


async def _problem(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except ProblemError as exc:
        raise McpToolError(exc.code, exc.detail) from None


async def _owned(ctx: ToolContext, work_item_id: str) -> StoredWorkItem:
    # MCP is tenant-scoped even for admin keys: an admin reads other tenants' items through the HTTP API.
    return await _problem(owned(ctx.store, _tenant_only(ctx.principal), work_item_id))


def _tenant_only(p: Principal) -> Principal:
    return Principal(tenant_id=p.tenant_id, key_id=p.key_id, scopes=frozenset(s for s in p.scopes if s != "admin"))


_STATUS = {"new file mode": "added", "deleted file mode": "deleted", "rename from": "renamed"}


def diff_status(diff: str) -> list[dict[str, str]]:
    """Each file a unified git diff changes, with how (added, deleted, renamed, modified)."""
    out: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            m = re.match(r'diff --git "?a/(.*?)"? "?b/(.*?)"?$', line)
            current = {"path": m.group(2) if m else line[11:], "status": "modified"}
            out.append(current)
        elif current is not None and not line.startswith(("+", "-", " ", "@")):
            for prefix, status in _STATUS.items():
                if line.startswith(prefix):
                    current["status"] = status
            if line.startswith("rename from "):
                current["from"] = line[len("rename from ") :]
    return out


async def git_status(ctx: ToolContext, args: WorkItemArgs) -> dict[str, Any]:
    """The change a work item's workspace holds, as the platform captured it (no git runs in a workspace: the
    workspace of a running attempt lives on an agent host, and its captured diff is what every step uses)."""
    row = await _owned(ctx, args.work_item_id)
    attempts = await ctx.store.list_attempts(row.id)
    chosen = None
    for a in reversed(attempts):
        ref = (a.agent or {}).get("diff_ref") if isinstance(a.agent, dict) else None
        if isinstance(ref, dict) and ref.get("id"):
            chosen = (a.number, str(ref["id"]))
            break
    out: dict[str, Any] = {
        "work_item_id": row.id,
        "state": row.state,
        "repository": (row.spec or {}).get("repo", {}).get("id") if isinstance(row.spec, dict) else None,
        "base_commit": row.base_commit,
        "delivery_branch": row.delivery_branch,
        "landed_commit": row.landed_commit,
        "attempt": None,
        "changes": [],
        "clean": True,
    }
    if chosen is not None:
        art = await ctx.store.work_item_artifact(row.id, chosen[1], with_content=True)
        if art is not None:
            diff = art.content_bytes[: ctx.settings.mcp.max_answer_bytes * 8].decode("utf-8", "replace")
            out.update(attempt=chosen[0], changes=diff_status(diff))
            out["clean"] = not out["changes"]
    return out


async def get_work_item(ctx: ToolContext, args: WorkItemArgs) -> dict[str, Any]:
    row = await _owned(ctx, args.work_item_id)
    view = await _problem(get_item(ctx.request, row.id, _tenant_only(ctx.principal), ctx.store, ctx.service, True))
    doc: dict[str, Any] = view.model_dump(mode="json")
    return doc


async def get_evidence(ctx: ToolContext, args: WorkItemArgs) -> dict[str, Any]:
    rows = await _problem(evidence(args.work_item_id, _tenant_only(ctx.principal), ctx.store))
    return {"work_item_id": args.work_item_id, "attempts": [r.model_dump(mode="json") for r in rows]}


class SubmitArgs(Args):
    work_item: dict[str, Any] = Field(
        description="The work item, exactly as POST /v1/work-items takes it (docs/api.md): kind, repo, instruction, "
        "validation, agent, budget, labels, ..."
    )
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Retrying with the same key and submission returns the same item (as the Idempotency-Key header).",
    )


async def submit_work_item(ctx: ToolContext, args: SubmitArgs) -> dict[str, Any]:
    from pydantic import ValidationError

    try:
        refuse_unstorable(args.work_item, "work_item.")
        spec = WorkItemSpec.model_validate(args.work_item)
    except ValidationError as exc:
        errs = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        raise McpToolError("invalid_work_item", errs) from None
    except ValueError as exc:
        raise McpToolError(getattr(exc, "code", "invalid_work_item"), str(exc)) from None
    response = Response()
    res = await _problem(
        submit(ctx.request, response, spec, _tenant_only(ctx.principal), ctx.service, args.idempotency_key)
    )
    doc: dict[str, Any] = res.model_dump(mode="json")
    return doc


class ReviewArgs(Args):
    work_item_id: str = ItemId
    action: Literal["approve", "reject", "request_changes"] = Field(description="The review decision.")
    comment: str | None = Field(default=None, max_length=20_000, description="Required to request changes.")
    reviewer: str | None = Field(default=None, max_length=200, description="Who reviews (shown in the events).")


async def review_work_item(ctx: ToolContext, args: ReviewArgs) -> dict[str, Any]:
    decision = ReviewDecision(action=args.action, comment=args.comment, reviewer=args.reviewer)
    res = await _problem(review(args.work_item_id, decision, _tenant_only(ctx.principal), ctx.store, ctx.service))
    doc: dict[str, Any] = res.model_dump(mode="json")
    return doc


# ---------------------------------------------------------------------------------------------- code intelligence


class RepoMapArgs(Args):
    repo: str = RepoField
    ref: str | None = RefField
    max_tokens: int = Field(default=1024, ge=64, le=16_384, description="Size budget of the map (~4 characters each).")
    focus: list[str] = Field(
        default_factory=list, max_length=50, description="Files to rank around (those being worked on)."
    )


async def _index(ctx: ToolContext, repo: OpenRepo) -> tuple[Any, bool]:
    from crewwork.codeintel.repomap import IndexCache, IndexError_, cached_index

    tree = await repo.index()
    cache = IndexCache(ctx.settings.resolved_codeintel_dir(), ctx.settings.codeintel.cache_max_bytes)
    try:
        return await cached_index(cache, repo.scope, repo.git_dir, repo.commit, tree.files, ctx.settings.codeintel)
    except IndexError_ as exc:
        raise McpToolError("index_failed", str(exc)) from None


async def repo_map(ctx: ToolContext, args: RepoMapArgs) -> dict[str, Any]:
    from crewwork.codeintel.repomap import rank, render

    async with ctx.repos.open(args.repo, args.ref) as repo:
        index, cached = await _index(ctx, repo)
        rendered = render(rank(index, focus=args.focus), args.max_tokens)
        return {
            **_where(repo),
            "map": rendered.text,
            "tokens": rendered.tokens,
            "files": rendered.files,
            "definitions": rendered.definitions,
            "total_definitions": rendered.total_definitions,
            "indexed_files": len(index.files),
            "skipped": index.skipped,
            "cached": cached,
        }


class FindSymbolArgs(Args):
    repo: str = RepoField
    name: str = Field(description="The symbol's name (case-sensitive).", min_length=1, max_length=200)
    ref: str | None = RefField
    prefix: bool = Field(default=False, description="Also names that start with `name`.")
    max_results: int = Field(default=50, ge=1, le=500)


async def find_symbol(ctx: ToolContext, args: FindSymbolArgs) -> dict[str, Any]:
    from crewwork.codeintel.repomap import find

    async with ctx.repos.open(args.repo, args.ref) as repo:
        index, cached = await _index(ctx, repo)
        defs, refs = find(index, args.name, prefix=args.prefix, limit=args.max_results)
        return {**_where(repo), "name": args.name, "definitions": defs, "referenced_in": refs, "cached": cached}


# ---------------------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Tool:
    name: str
    args: type[Args]
    run: Callable[[ToolContext, Any], Awaitable[dict[str, Any]]]
    description: str
    read_only: bool = True


TOOLS: tuple[Tool, ...] = (
    Tool("list_repositories", ListRepositoriesArgs, list_repositories, "The repositories this tenant registered."),
    Tool(
        "read_file",
        ReadFileArgs,
        read_file,
        "A file of a repository at a ref (optionally a line range). Symbolic links inside the repository are "
        "followed; ones that leave it are refused. Binary files are described, not shown.",
    ),
    Tool("list_directory", ListDirectoryArgs, list_directory, "A directory of a repository at a ref."),
    Tool(
        "search_code",
        SearchCodeArgs,
        search_code,
        "Search a repository's files at a ref for a literal string or a regular expression (git grep over the "
        "mirror at that commit), optionally only files matching a glob. Results are bounded and say when cut.",
    ),
    Tool("git_log", GitLogArgs, git_log, "Commits reachable from a ref, newest first, optionally touching a path."),
    Tool("git_show", GitShowArgs, git_show, "One commit: author, message, files changed and (bounded) patch."),
    Tool("git_diff", GitDiffArgs, git_diff, "The diff between two commits (bounded), or only the files changed."),
    Tool(
        "git_status",
        WorkItemArgs,
        git_status,
        "The change a work item's workspace holds (files added, modified, deleted), as the platform captured it.",
    ),
    Tool(
        "repo_map",
        RepoMapArgs,
        repo_map,
        "A map of a repository's most important definitions (tree-sitter, ranked by a reference graph), within a "
        "token budget; `focus` ranks around the files being worked on.",
    ),
    Tool("find_symbol", FindSymbolArgs, find_symbol, "Where a symbol is defined, and which files reference it."),
    Tool(
        "submit_work_item",
        SubmitArgs,
        submit_work_item,
        "Hand off work: submit a work item, exactly as POST /v1/work-items (same checks, policy and idempotency).",
        read_only=False,
    ),
    Tool("get_work_item", WorkItemArgs, get_work_item, "A work item of this tenant: state, attempts, result."),
    Tool(
        "get_evidence", WorkItemArgs, get_evidence, "A work item's evidence per attempt (what the platform measured)."
    ),
    Tool(
        "review_work_item",
        ReviewArgs,
        review_work_item,
        "Approve, reject or request changes on a work item awaiting review.",
        read_only=False,
    ),
)
BY_NAME = {t.name: t for t in TOOLS}
