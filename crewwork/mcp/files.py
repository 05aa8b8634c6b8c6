"""MCP repository tools: list the tenant's repositories, read a file, list a directory, search code -- each read
through this host's mirror at a commit (crewwork.mcp.repos, crewwork.repos.trees), never from a work tree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from crewwork.mcp.context import (
    MAX_LINE_CHARS,
    Args,
    RefField,
    RepoField,
    ToolContext,
    _bad,
    _is_binary,
    _text,
    _where,
)
from crewwork.mcp.repos import McpToolError
from crewwork.repos.gitproc import run_bounded
from crewwork.repos.trees import TreeError, parse_path, read_blob, read_link, resolve

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
    offset: int = Field(
        default=0,
        ge=0,
        description="Characters of start_line to skip: where a line longer than one answer was cut (the answer's "
        "`next`).",
    )


async def read_file(ctx: ToolContext, args: ReadFileArgs) -> dict[str, Any]:
    m = ctx.settings.mcp
    if args.end_line is not None and args.start_line is not None and args.end_line < args.start_line:
        raise McpToolError("invalid_argument", "end_line is before start_line")
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
        text = _text(data)
        total = count_lines(text)
        first = args.start_line or 1
        last = min(args.end_line or total, total)
        start = line_start(text, first, total)
        if args.offset and (start is None or args.offset >= line_end(text, start) - start):
            raise McpToolError("invalid_argument", f"offset {args.offset} is past the end of line {first}")
        page = text_page(text, start, first, last, args.offset, m.max_answer_bytes)
        out.update(
            binary=False,
            total_lines=total,
            start_line=first,
            offset=args.offset,
            end_line=page.end_line,
            truncated=page.next is not None,
            content=page.content,
        )
        if page.next is not None:
            line, offset = page.next
            out["next"] = {"start_line": line, "offset": offset}
            out["note"] = (
                f"cut at {m.max_answer_bytes} bytes (CREWWORK_MCP_MAX_ANSWER_BYTES); ask for start_line={line}"
                + (f", offset={offset} (line {line} is longer than one answer)" if offset else "")
                + " to go on"
            )
        return out


def count_lines(text: str) -> int:
    """Lines as git counts them (and `search_code` numbers them): ended by LF, the last one perhaps not."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def line_start(text: str, line: int, total: int) -> int | None:
    """Where 1-based `line` starts in `text` (None past the last line), found by bisecting C-speed counts of LF: no
    list of every line is made (a 16 MiB file of short lines was ~400 MB of them, for each page)."""
    if line > total:
        return None
    lo, hi = 0, len(text)
    while lo < hi:  # the first position after line - 1 LFs
        mid = (lo + hi) // 2
        if text.count("\n", 0, mid) >= line - 1:
            hi = mid
        else:
            lo = mid + 1
    return lo


def line_end(text: str, start: int) -> int:
    """Where the line starting at `start` ends, its LF included."""
    nl = text.find("\n", start)
    return len(text) if nl < 0 else nl + 1


@dataclass(frozen=True)
class TextPage:
    content: str
    end_line: int
    """The last line any of whose text is in `content` (first - 1 when there is none)."""
    next: tuple[int, int] | None
    """(start_line, offset) of the next page, or None when `content` reaches `last`."""


def text_page(text: str, start: int | None, first: int, last: int, offset: int, max_bytes: int) -> TextPage:
    """Lines `first`..`last` of `text` (1-based, `first` starting at `start`, from its character `offset`) within
    `max_bytes` of UTF-8. Cut at a line boundary where one fits, else inside the line: a page is never empty while
    text is left (max_bytes holds at least one character), so a client that follows `next` always gets to the end."""
    shown: list[str] = []
    used = 0
    line_no = first
    pos = (start or 0) + offset
    skip = offset
    while start is not None and line_no <= last:
        end = line_end(text, pos)
        piece = text[pos:end]
        size = len(piece.encode())
        if used + size <= max_bytes:
            shown.append(piece)
            used += size
            line_no, pos, skip = line_no + 1, end, 0
            continue
        if shown and not skip and size <= max_bytes:
            break  # the whole line fits on the next page: cut at the line boundary
        part = piece.encode()[: max_bytes - used].decode("utf-8", "ignore")
        if not part:  # the page is full to the byte (so not empty): the line starts the next one
            return TextPage("".join(shown), line_no - 1, (line_no, skip))
        shown.append(part)
        return TextPage("".join(shown), line_no, (line_no, skip + len(part)))
    return TextPage("".join(shown), line_no - 1, None if line_no > last or start is None else (line_no, 0))


class ListDirectoryArgs(Args):
    repo: str = RepoField
    path: str = Field(
        default="", description="Directory relative to the root ('' or '.' for the root).", max_length=4096
    )
    ref: str | None = RefField
    offset: int = Field(default=0, ge=0, description="Entries to skip (the answer's `next_offset`).")


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
        names = index.children.get(base, [])  # sorted once, when the listing was parsed (off the event loop)
        listed = []
        page = names[args.offset : args.offset + m.max_directory_entries]
        for path in page:
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
        end = args.offset + len(page)
        return {
            **_where(repo),
            "path": base,
            "entries": listed,
            "offset": args.offset,
            "total": len(names),
            "truncated": end < len(names),
            "next_offset": end if end < len(names) else None,
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


def check_regex(query: str, *, ignore_case: bool, max_program_size: int) -> int:
    """The compiled size of `query` as git grep will run it (POSIX extended syntax on bytes, the C locale), measured
    by RE2; McpToolError(`invalid_argument`) when RE2 cannot compile it (back-references, counted repetitions over
    1000, syntax errors) or it is larger than `max_program_size`. A counted repetition is expanded by glibc's engine
    inside git into an automaton whose size grows with the count (`[[:alpha:]]{0,32767}b` took git past 3 GiB), so
    the pattern is refused before git sees it; the query profile's memory bound is the backstop."""
    import re2  # google-re2

    options = re2.Options()
    options.log_errors = False
    options.posix_syntax = True
    options.perl_classes = True
    options.word_boundary = True
    options.case_sensitive = not ignore_case
    options.encoding = re2.Options.Encoding.LATIN1
    try:
        size = int(re2.compile(query.encode(), options).programsize)
    except Exception as exc:  # re2.error is not an Exception subclass in every version
        raw = exc.args[0] if exc.args else exc
        why = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        raise McpToolError(
            "invalid_argument",
            f"the regular expression cannot be searched: {why[:200]} (POSIX extended syntax; no back-references, "
            "counted repetitions up to {1000})",
        ) from None
    if size > max_program_size:
        raise McpToolError(
            "invalid_argument",
            f"the regular expression compiles to {size} instructions, more than the {max_program_size} allowed "
            "(CREWWORK_MCP_MAX_REGEX_PROGRAM_SIZE): use smaller counted repetitions such as {0,100}",
        )
    return size


async def search_code(ctx: ToolContext, args: SearchCodeArgs) -> dict[str, Any]:
    m = ctx.settings.mcp
    if "\n" in args.query or "\r" in args.query or "\x00" in args.query:
        raise McpToolError("invalid_argument", "query must be one line")
    if args.regex:
        check_regex(args.query, ignore_case=args.ignore_case, max_program_size=m.max_regex_program_size)
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
            if exc.code == "limit_exceeded":
                raise _bad(exc) from None
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
