"""The model agent's edit format: SEARCH/REPLACE blocks, their parser and a safe applier.

The format, exactly::

    path/to/file.py
    <<<<<<< SEARCH
    lines copied exactly from the current file
    =======
    the lines that replace them
    >>>>>>> REPLACE

- The file path is alone on the last non-blank line before ``<<<<<<< SEARCH``, relative to the repository
  root, forward slashes. Surrounding backticks or a leading ``File:``/``###`` are tolerated; markdown code
  fences (```` ``` ````) around a block are ignored.
- The three marker lines are exactly ``<<<<<<< SEARCH``, ``=======`` and ``>>>>>>> REPLACE`` (seven
  characters each, trailing spaces ignored).
- The SEARCH lines must occur **exactly once** in the file as it is at that point (earlier blocks of the same
  response already applied), as whole lines: exact, whitespace and indentation included, starting at the
  beginning of a line. A file's missing final newline does not prevent a match of its last line.
- An empty SEARCH section creates a new file; it is refused when the file already exists.
- An empty REPLACE section deletes the SEARCH text.
- Text outside blocks is the model's commentary; it is kept in the transcript and otherwise ignored.

Application is all-or-nothing per response: every block is checked against in-memory copies first, and files
are written only when all of them apply. A refused response therefore leaves the workspace as it was, and the
error message (which block, which file, why) goes back to the model.

Paths are refused when absolute, when they leave the workspace (``..`` or a symlink pointing out), or when
they touch ``.git``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from crewwork.boundary import safefs
from crewwork.boundary.paths import is_dotgit

SEARCH_MARK = "<<<<<<< SEARCH"
DIVIDER_MARK = "======="
REPLACE_MARK = ">>>>>>> REPLACE"

MAX_EDIT_FILE_BYTES = 2 * 1024 * 1024


class EditError(ValueError):
    """An edit response the applier refused; the message is written for the model to act on."""


class EditFormatError(EditError):
    """The response does not follow the SEARCH/REPLACE format."""


class EditApplyError(EditError):
    """A block is well-formed but cannot be applied to the workspace."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class EditBlock:
    path: str
    search: str
    replace: str
    index: int
    """1-based position of the block in the response (for error messages)."""


def _clean_path_line(line: str) -> str:
    s = line.strip()
    for prefix in ("File:", "file:", "Path:", "path:"):
        if s.startswith(prefix):
            s = s[len(prefix) :].strip()
    s = s.lstrip("#").strip()
    s = s.strip("`*\"'").strip()
    return s


def _is_fence(line: str) -> bool:
    return line.strip().startswith("```") or line.strip().startswith("~~~")


def parse_edits(text: str) -> list[EditBlock]:
    """Parse every SEARCH/REPLACE block in `text`. Raises `EditFormatError` with a precise reason."""
    lines = text.replace("\r\n", "\n").split("\n")
    blocks: list[EditBlock] = []
    i = 0
    last_text_line: str | None = None
    while i < len(lines):
        line = lines[i]
        stripped = line.rstrip()
        if stripped == SEARCH_MARK:
            n = len(blocks) + 1
            if not last_text_line:
                raise EditFormatError(
                    f"block {n}: no file path on the line before {SEARCH_MARK!r}; put the path alone on that line"
                )
            path = _clean_path_line(last_text_line)
            if not path or (" " in path and not Path(path).suffix):
                raise EditFormatError(f"block {n}: {last_text_line.strip()!r} does not look like a file path")
            search: list[str] = []
            i += 1
            while i < len(lines) and lines[i].rstrip() != DIVIDER_MARK:
                if lines[i].rstrip() in (SEARCH_MARK, REPLACE_MARK):
                    raise EditFormatError(f"block {n} ({path}): expected {DIVIDER_MARK!r} before {lines[i]!r}")
                search.append(lines[i])
                i += 1
            if i >= len(lines):
                raise EditFormatError(f"block {n} ({path}): missing {DIVIDER_MARK!r} line")
            replace: list[str] = []
            i += 1
            while i < len(lines) and lines[i].rstrip() != REPLACE_MARK:
                if lines[i].rstrip() in (SEARCH_MARK, DIVIDER_MARK):
                    raise EditFormatError(f"block {n} ({path}): expected {REPLACE_MARK!r} before {lines[i]!r}")
                replace.append(lines[i])
                i += 1
            if i >= len(lines):
                raise EditFormatError(f"block {n} ({path}): missing {REPLACE_MARK!r} line")
            blocks.append(EditBlock(path=path, search=_join(search), replace=_join(replace), index=n))
            last_text_line = None
            i += 1
            continue
        if stripped in (DIVIDER_MARK, REPLACE_MARK):
            raise EditFormatError(f"{stripped!r} without a preceding {SEARCH_MARK!r} line")
        if stripped.strip() and not _is_fence(stripped):
            last_text_line = stripped
        i += 1
    if not blocks:
        raise EditFormatError(
            f"no edit blocks found; answer with one or more blocks: a path line, {SEARCH_MARK!r}, the exact "
            f"current lines, {DIVIDER_MARK!r}, the new lines, {REPLACE_MARK!r}"
        )
    return blocks


def _join(lines: list[str]) -> str:
    # Lines inside a block are whole lines of the file, so the text carries its final newline.
    return "".join(line + "\n" for line in lines)


def resolve_in_workspace(workspace: Path, rel: str) -> Path:
    """The absolute path of `rel` inside `workspace`, or `EditApplyError` if it would leave it."""
    if "\x00" in rel:
        raise EditApplyError(f"{rel!r}: NUL in path", path=rel)
    pure = PurePosixPath(rel.replace("\\", "/"))
    if pure.is_absolute() or (pure.parts and pure.parts[0].endswith(":")):
        raise EditApplyError(f"{rel}: absolute paths are not allowed; use a repo-relative path", path=rel)
    if any(p == ".." for p in pure.parts):
        raise EditApplyError(f"{rel}: '..' is not allowed in paths", path=rel)
    if any(is_dotgit(p) for p in pure.parts):
        raise EditApplyError(f"{rel}: the .git directory is not editable", path=rel)
    root = workspace.resolve()
    target = (root / Path(*pure.parts)).resolve()
    if target != root and not target.is_relative_to(root):
        raise EditApplyError(f"{rel}: resolves outside the workspace (symlink?)", path=rel)
    if target == root:
        raise EditApplyError(f"{rel!r} is not a file path", path=rel)
    return target


def apply_edits(workspace: Path, blocks: list[EditBlock]) -> list[str]:
    """Apply `blocks` all-or-nothing; return the relative paths written (in first-touched order)."""
    staged: dict[Path, str | None] = {}  # None: file does not exist yet
    order: list[tuple[Path, str]] = []
    for block in blocks:
        target = resolve_in_workspace(workspace, block.path)
        where = f"block {block.index} ({block.path})"
        if target not in staged:
            staged[target] = _read(target, where)
            order.append((target, block.path))
        current = staged[target]
        if block.search == "":
            if current is not None:
                raise EditApplyError(
                    f"{where}: the SEARCH section is empty, which creates a new file, but the file exists; "
                    "copy the lines to change into SEARCH",
                    path=block.path,
                )
            staged[target] = block.replace
            continue
        if current is None:
            raise EditApplyError(
                f"{where}: the file does not exist; to create it, leave the SEARCH section empty",
                path=block.path,
            )
        # A file without a final newline still matches a SEARCH of whole lines; the newline comes off again.
        work = current if current.endswith("\n") else current + "\n"
        starts = _line_matches(work, block.search)
        count = len(starts)
        if count == 0:
            raise EditApplyError(f"{where}: {_not_found_hint(current, block.search)}", path=block.path)
        if count > 1:
            raise EditApplyError(
                f"{where}: the SEARCH text occurs {count} times; include more surrounding lines so it is unique",
                path=block.path,
            )
        at = starts[0]
        new = work[:at] + block.replace + work[at + len(block.search) :]
        staged[target] = new if current.endswith("\n") or not new.endswith("\n") else new[:-1]
    root = workspace.resolve()
    root_fd = safefs.open_root(root)
    try:
        for target, rel in order:
            content = staged[target]
            assert content is not None
            # Written beneath the workspace without following any link (the path was resolved above).
            try:
                safefs.write_file(root_fd, str(target.relative_to(root)), [content.encode("utf-8")])
            except safefs.Refused as exc:
                raise EditApplyError(f"{rel}: {exc.reason}", path=rel) from None
    finally:
        os.close(root_fd)
    return [rel for _, rel in order]


def _line_matches(text: str, search: str) -> list[int]:
    """Offsets where `search` occurs as whole lines (starting at a line start; it ends with a newline)."""
    found, at = [], text.find(search)
    while at != -1:
        if at == 0 or text[at - 1] == "\n":
            found.append(at)
        at = text.find(search, at + 1)
    return found


def _read(target: Path, where: str) -> str | None:
    if not target.exists() and not target.is_symlink():
        return None
    try:
        data = safefs.read_bytes(target.parent, target.name, max_bytes=MAX_EDIT_FILE_BYTES)
    except safefs.TooLarge:
        raise EditApplyError(f"{where}: file is larger than {MAX_EDIT_FILE_BYTES} bytes; not editable here") from None
    except safefs.Refused as exc:
        raise EditApplyError(f"{where}: {exc.reason}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise EditApplyError(f"{where}: not a UTF-8 text file") from None


def _not_found_hint(current: str, search: str) -> str:
    msg = "the SEARCH text was not found; it must match the current file exactly, including indentation"
    if "\r\n" in current and "\r\n" not in search:
        return msg + " (the file uses CRLF line endings)"
    stripped = [ln.strip() for ln in search.splitlines() if ln.strip()]
    file_lines = [ln.strip() for ln in current.splitlines()]
    if stripped and all(s in file_lines for s in stripped):
        return msg + " (the lines exist but their whitespace or order differs)"
    return msg


def apply_edit_text(workspace: Path, text: str) -> list[str]:
    """Parse and apply a model response; raises `EditError` with a message for the model."""
    return apply_edits(workspace, parse_edits(text))
