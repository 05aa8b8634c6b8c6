"""Repository-relative paths from untrusted places (a submission, an agent's config, a diff), parsed once at the edge.

A `RelPath` can only be made by `RelPath.parse`, which normalises (``./a//b/`` -> ``a/b``) and refuses everything
that could leave a workspace or reach a git directory: absolute paths, ``..``, NUL and control characters
(newlines included), backslashes, and ``.git`` in any spelling a filesystem might fold to it (``.GIT``,
``.git.``, ``.git::$INDEX_ALLOCATION``, ``git~1``, ``.g\\u200cit``). The rest of the code receives values that
cannot hold a bad path. Pydantic models use the types directly, so a bad field is a 422 naming the field.

`PathPattern` is the same for the protected-path patterns of a validation spec (fnmatch wildcards allowed).
"""

from __future__ import annotations

import fnmatch
import unicodedata
from typing import Any, ClassVar

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

PLATFORM_DIR = ".crewwork"
"""The platform's own directory at a workspace's root (reports, logs): never part of a change."""
MAX_PATH_BYTES = 1024

# Code points HFS+ ignores when comparing names (git's is_hfs_dotgit list): ".g\u200cit" is ".git" there.
_HFS_IGNORABLE = frozenset(
    "\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u206a\u206b\u206c\u206d\u206e\u206f\ufeff"
)


class PathRefused(ValueError):
    """A path that is not a plain repository-relative path; the message says which rule it broke."""


def is_dotgit(component: str | bytes) -> bool:
    """True if a file system could treat this one path component as ``.git`` (case, HFS+ and NTFS folding)."""
    if isinstance(component, bytes):
        component = component.decode("utf-8", "surrogateescape")
    name = "".join(ch for ch in component if ch not in _HFS_IGNORABLE)
    name = unicodedata.normalize("NFC", name).casefold()
    # NTFS: alternate data streams (".git::$INDEX_ALLOCATION"), trailing dots and spaces, the 8.3 short name.
    name = name.split(":", 1)[0].rstrip(" .")
    return name in (".git", "git~1")


def _parts(raw: object, what: str) -> tuple[str, ...]:
    if not isinstance(raw, str):
        raise PathRefused(f"{what} must be a string")
    try:
        size = len(raw.encode("utf-8"))
    except UnicodeEncodeError:
        raise PathRefused(f"{what} {raw!r} is not valid UTF-8") from None
    if size == 0:
        raise PathRefused(f"{what} is empty")
    if size > MAX_PATH_BYTES:
        raise PathRefused(f"{what} is longer than {MAX_PATH_BYTES} bytes")
    bad = next((ch for ch in raw if ord(ch) < 0x20 or ord(ch) == 0x7F), None)
    if bad is not None:
        raise PathRefused(f"{what} {raw!r} contains the control character {bad!r}")
    if "\\" in raw:
        raise PathRefused(f"{what} {raw!r} contains a backslash; use '/' between directories")
    if raw.startswith("/"):
        raise PathRefused(f"{what} {raw!r} is absolute; give a path relative to the repository root")
    parts = tuple(p for p in raw.split("/") if p not in ("", "."))
    if not parts:
        raise PathRefused(f"{what} {raw!r} names the repository root, not a file")
    for p in parts:
        if p == "..":
            raise PathRefused(f"{what} {raw!r} contains '..'; paths must stay inside the repository")
        if is_dotgit(p):
            raise PathRefused(f"{what} {raw!r} reaches a .git directory, which no change may touch")
    return parts


def _parsed_str_schema(cls: Any) -> core_schema.CoreSchema:
    """A pydantic schema for a str subclass built by `cls.parse` (a refusal is a validation error), serialised as a
    plain string, at most MAX_PATH_BYTES long in the JSON schema."""

    def validate(value: object) -> Any:
        if isinstance(value, cls):
            return value
        try:
            return cls.parse(value)
        except PathRefused as exc:
            raise ValueError(str(exc)) from None

    return core_schema.no_info_plain_validator_function(
        validate,
        json_schema_input_schema=core_schema.str_schema(max_length=MAX_PATH_BYTES),
        serialization=core_schema.plain_serializer_function_ser_schema(str, return_schema=core_schema.str_schema()),
    )


class RelPath(str):
    """A normalised path inside a repository, outside ``.git`` and outside the platform directory."""

    allow_platform: ClassVar[bool] = False
    what: ClassVar[str] = "path"

    parts: tuple[str, ...]

    def __new__(cls, value: object) -> RelPath:
        return cls.parse(value)

    @classmethod
    def parse(cls, raw: object, what: str | None = None) -> RelPath:
        """The normalised path, or PathRefused saying which rule `raw` broke (`what` names it in the message)."""
        what = what or cls.what
        parts = _parts(raw, what)
        if parts[0] == PLATFORM_DIR and not cls.allow_platform:
            raise PathRefused(f"{what} {raw!r} is inside {PLATFORM_DIR}/, which belongs to the platform")
        obj = str.__new__(cls, "/".join(parts))
        obj.parts = parts
        return obj

    @classmethod
    def __get_pydantic_core_schema__(cls, _source: Any, _handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return _parsed_str_schema(cls)


class ReportPath(RelPath):
    """A path the test command writes its report to: may (and usually does) lie under ``.crewwork/``."""

    allow_platform: ClassVar[bool] = True
    what: ClassVar[str] = "report path"


class PathPattern(str):
    """A protected-path pattern: an exact path, ``dir/`` for a whole directory, or an fnmatch pattern over the
    repository-relative path (``*`` also matches ``/``). Same refusals as `RelPath`."""

    is_dir: bool

    def __new__(cls, value: object) -> PathPattern:
        return cls.parse(value)

    @classmethod
    def parse(cls, raw: object, what: str = "pattern") -> PathPattern:
        parts = _parts(raw, what)
        text = "/".join(parts)
        is_dir = isinstance(raw, str) and raw.endswith("/")
        obj = str.__new__(cls, text + ("/" if is_dir else ""))
        obj.is_dir = is_dir
        return obj

    def matches(self, path: str) -> bool:
        body = self[:-1] if self.is_dir else str(self)
        if self.is_dir:
            return path == body or path.startswith(body + "/") or fnmatch.fnmatchcase(path, body + "/*")
        return path == body or fnmatch.fnmatchcase(path, body)

    @classmethod
    def __get_pydantic_core_schema__(cls, _source: Any, _handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return _parsed_str_schema(cls)


def refused_component(path: bytes) -> str | None:
    """Why a path found in a workspace or a tree can never be part of a change (None: it can)."""
    if not path or path.startswith(b"/") or b"\x00" in path:
        return "not a relative path"
    for part in path.split(b"/"):
        if part in (b"", b".", b".."):
            return "empty, '.' or '..' component"
        if is_dotgit(part):
            return ".git in some spelling"
    return None


def _unquote_c(raw: str) -> str:
    """Git's C-style quoted path ("a\\tb", octal escapes) back to the name it stands for."""
    if not (len(raw) >= 2 and raw[0] == raw[-1] == '"'):
        return raw
    body = raw[1:-1]
    out = bytearray()
    i = 0
    simple = {"n": 10, "t": 9, "r": 13, "a": 7, "b": 8, "f": 12, "v": 11, '"': 34, "\\": 92}
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            n = body[i + 1]
            if n in simple:
                out.append(simple[n])
                i += 2
                continue
            if n.isdigit() and i + 3 < len(body) + 1:
                out.append(int(body[i + 1 : i + 4], 8) & 0xFF)
                i += 4
                continue
        out.extend(c.encode("utf-8"))
        i += 1
    return out.decode("utf-8", "surrogateescape")


def diff_paths(diff: str) -> list[str]:
    """Every path a unified git diff names (both sides of renames and copies), unquoted, in order of appearance."""
    out: list[str] = []
    for line in diff.splitlines():
        for prefix in ("--- ", "+++ "):
            if line.startswith(prefix):
                name = _unquote_c(line[len(prefix) :].split("\t", 1)[0].strip())
                if name != "/dev/null":
                    out.append(name[2:] if name[:2] in ("a/", "b/") else name)
        for prefix in ("rename from ", "rename to ", "copy from ", "copy to "):
            if line.startswith(prefix):
                out.append(_unquote_c(line[len(prefix) :]))
    return out
