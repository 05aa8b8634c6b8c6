"""A unified diff as data: files (paths, status, +/- counts), hunks and lines with their old and new line numbers.

What the console's diff view draws, what a reviewer's line comment points at (`path`, `side`, `line`) and what
anything else that marks lines of a change (a scanner's finding) can be placed on (`DiffModel.locate`). Parsed from
the attempt's diff artifact, git's output for a tree an agent wrote: untrusted text, read in one linear pass within
`DiffLimits` (what is cut is marked `truncated`, never silently dropped); git's C-quoted path names are decoded.

Pure: no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field


@dataclass(frozen=True)
class DiffLimits:
    max_bytes: int = 16 * 1024 * 1024
    """The most diff text parsed (an attempt's diff artifact is at most CREWWORK_MAX_ARTIFACT_BYTES, 16 MiB)."""
    max_files: int = 3_000
    max_lines: int = 200_000
    """Diff lines kept over all files; past it, files keep their counts and are marked `truncated`."""
    max_line_chars: int = 10_000
    """One line's text is cut here (a minified file's single line)."""


class DiffTooLarge(ValueError):
    """The diff is larger than `DiffLimits.max_bytes`."""


class DiffLine(BaseModel):
    kind: Literal["context", "add", "del", "note"]
    """`note`: git's `\\ No newline at end of file`."""
    old: int | None = None
    """The line's number in the old file (context and removed lines)."""
    new: int | None = None
    """The line's number in the new file (context and added lines)."""
    text: str


class DiffHunk(BaseModel):
    header: str
    old_start: int
    old_lines: int
    new_start: int
    new_lines: int
    section: str = ""
    """What git printed after the second `@@` (the enclosing function, where it found one)."""
    lines: list[DiffLine] = Field(default_factory=list)


class DiffFile(BaseModel):
    path: str
    """The file's path after the change (before it, for a deleted file): what a line comment names."""
    old_path: str | None = None
    new_path: str | None = None
    status: Literal["added", "deleted", "modified", "renamed", "copied"] = "modified"
    binary: bool = False
    mode_change: str | None = None
    additions: int = 0
    deletions: int = 0
    hunks: list[DiffHunk] = Field(default_factory=list)
    truncated: bool = False
    """Lines of this file were not kept (DiffLimits); the counts still count them."""


class DiffModel(BaseModel):
    files: list[DiffFile] = Field(default_factory=list)
    additions: int = 0
    deletions: int = 0
    truncated: bool = False
    note: str | None = None
    """What was cut and why, when something was."""

    def file(self, path: str) -> DiffFile | None:
        return next((f for f in self.files if f.path == path), None)

    def locate(self, path: str, line: int, side: Literal["new", "old"] = "new") -> DiffLine | None:
        """The diff line at `line` of `path` on `side` (`new`: added or context lines; `old`: removed or context), or
        None when the diff does not show that line."""
        f = self.file(path)
        if f is None:
            return None
        for h in f.hunks:
            for ln in h.lines:
                if (ln.new if side == "new" else ln.old) == line and ln.kind != "note":
                    return ln
        return None


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", '"': '"', "\\": "\\"}


def git_path(raw: str) -> str:
    """A path as git prints it: C-quoted (`"a/t\\303\\251st"`) when it holds special characters, else plain."""
    raw = raw.rstrip("\t")
    if not (len(raw) >= 2 and raw.startswith('"') and raw.endswith('"')):
        return raw
    body, out, i = raw[1:-1], bytearray(), 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if re.fullmatch(r"[0-7]{3}", body[i + 1 : i + 4]):
                out.append(int(body[i + 1 : i + 4], 8) & 0xFF)
                i += 4
                continue
            out += _ESCAPES.get(nxt, nxt).encode()
            i += 2
            continue
        out += ch.encode()
        i += 1
    return out.decode("utf-8", errors="replace")


def _strip_prefix(path: str) -> str | None:
    if path == "/dev/null":
        return None
    return path[2:] if path[:2] in ("a/", "b/") else path


def _header_paths(rest: str) -> tuple[str, str]:
    """`a/X b/Y` of a `diff --git` line: exact when quoted or when X and Y are the same path (the common case)."""
    if rest.startswith('"'):
        end = rest.find('" ', 1)
        while end > 0 and rest[end - 1] == "\\":
            end = rest.find('" ', end + 1)
        if end > 0:
            return git_path(rest[: end + 1]), git_path(rest[end + 2 :])
    half = (len(rest) - 1) // 2
    if len(rest) % 2 == 1 and rest[half] == " " and rest[2:half] == rest[half + 3 :]:
        return rest[:half], rest[half + 1 :]
    a, sep, b = rest.partition(" b/")
    return (a, "b/" + b) if sep else (rest, rest)


def parse_unified_diff(text: str, limits: DiffLimits | None = None) -> DiffModel:
    """The diff as files, hunks and numbered lines (git's `diff --git` format; a plain unified diff works too)."""
    limits = limits or DiffLimits()
    if len(text) > limits.max_bytes:
        raise DiffTooLarge(f"the diff is {len(text)} characters; at most {limits.max_bytes} are shown")
    model = DiffModel()
    cur: DiffFile | None = None
    hunk: DiffHunk | None = None
    old_no = new_no = 0
    kept = 0

    def start_file(old: str | None, new: str | None) -> DiffFile:
        nonlocal hunk
        hunk = None
        f = DiffFile(path=new or old or "", old_path=old, new_path=new)
        if len(model.files) >= limits.max_files:
            model.truncated = True
            model.note = f"only the first {limits.max_files} files are shown"
            f.truncated = True
            return f
        model.files.append(f)
        return f

    for raw in text.split("\n"):
        if raw.startswith("diff --git "):
            a, b = _header_paths(raw[len("diff --git ") :])
            cur = start_file(_strip_prefix(a), _strip_prefix(b))
            continue
        if cur is None:
            if raw.startswith("--- "):
                cur = start_file(_strip_prefix(git_path(raw[4:])), None)
            continue
        in_hunk = hunk is not None and not _hunk_done(hunk, old_no, new_no)
        if hunk is not None and (raw.startswith("\\") or (in_hunk and (raw[:1] in (" ", "+", "-") or raw == ""))):
            if raw == "":
                raw = " "  # an empty context line whose space an editor stripped
            kind = {" ": "context", "+": "add", "-": "del", "\\": "note"}[raw[0]]
            body = raw[1:] if kind != "note" else raw
            line = DiffLine(kind=kind, text=body[: limits.max_line_chars])  # type: ignore[arg-type]
            if kind in ("context", "del"):
                line.old = old_no
                old_no += 1
            if kind in ("context", "add"):
                line.new = new_no
                new_no += 1
            if kind == "add":
                cur.additions += 1
            elif kind == "del":
                cur.deletions += 1
            if kept < limits.max_lines:
                hunk.lines.append(line)
                kept += 1
            else:
                cur.truncated = model.truncated = True
                model.note = model.note or f"only the first {limits.max_lines} diff lines are shown"
            continue
        m = _HUNK.match(raw)
        if m is not None:
            o, ol, n, nl = int(m[1]), int(m[2] or 1), int(m[3]), int(m[4] or 1)
            hunk = DiffHunk(header=raw[:500], old_start=o, old_lines=ol, new_start=n, new_lines=nl, section=m[5][:200])
            old_no, new_no = o if ol else o + 1, n if nl else n + 1
            if not cur.truncated:
                cur.hunks.append(hunk)
            continue
        hunk = None
        if raw.startswith("--- "):
            cur.old_path = _strip_prefix(git_path(raw[4:]))
        elif raw.startswith("+++ "):
            cur.new_path = _strip_prefix(git_path(raw[4:]))
            cur.path = cur.new_path or cur.old_path or cur.path
        elif raw.startswith("new file mode"):
            cur.status = "added"
        elif raw.startswith("deleted file mode"):
            cur.status = "deleted"
        elif raw.startswith("rename from "):
            cur.status, cur.old_path = "renamed", git_path(raw[len("rename from ") :])
        elif raw.startswith("rename to "):
            cur.new_path = cur.path = git_path(raw[len("rename to ") :])
        elif raw.startswith("copy from "):
            cur.status, cur.old_path = "copied", git_path(raw[len("copy from ") :])
        elif raw.startswith("copy to "):
            cur.new_path = cur.path = git_path(raw[len("copy to ") :])
        elif raw.startswith("old mode "):
            cur.mode_change = raw[len("old mode ") :][:20]
        elif raw.startswith("new mode ") and cur.mode_change:
            cur.mode_change = f"{cur.mode_change} → {raw[len('new mode ') :][:20]}"
        elif raw.startswith("Binary files ") or raw.startswith("GIT binary patch"):
            cur.binary = True
    for f in model.files:
        if f.status == "modified" and f.old_path is None and f.new_path is not None and _added(f):
            f.status = "added"
        if f.status == "modified" and f.new_path is None and f.old_path is not None:
            f.status, f.path = "deleted", f.old_path
        model.additions += f.additions
        model.deletions += f.deletions
    return model


def _added(f: DiffFile) -> bool:
    return f.deletions == 0 and all(h.old_start == 0 for h in f.hunks) and bool(f.hunks)


def _hunk_done(h: DiffHunk, old_no: int, new_no: int) -> bool:
    """Every line the hunk's header announced has been read (what follows is the next header)."""
    old_end = h.old_start + h.old_lines if h.old_lines else h.old_start + 1
    new_end = h.new_start + h.new_lines if h.new_lines else h.new_start + 1
    return old_no >= old_end and new_no >= new_end
