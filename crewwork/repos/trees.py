"""Read-only views of one commit's tree in a git directory the host made (a mirror, a workspace's private git
directory), for the MCP endpoint and the repository map.

What a tenant names is parsed here, once, before git sees anything:

- a **ref** is `HEAD`, a branch or tag name, `refs/heads/...`/`refs/tags/...`, or a hexadecimal object id, optionally
  followed by `~N`/`^N` (`parse_ref`). Nothing else: no `:` (so `HEAD:../x` is no path syntax), no `@{...}`, no
  leading `-`, no other `refs/` namespace (`refs/crewwork/...` holds the host's own bookkeeping). A name resolves only
  through `refs/heads/` and `refs/tags/`; an object id only to a commit reachable from them, that is, one the remote
  served (a commit the host made in the mirror and never pushed is not the tenant's to read). Git is then given the
  full commit id, never the tenant's text.
- a **path** is a `TreePath` (crewwork.boundary.paths rules: relative, no `..`, no `.git` in any spelling, no control
  characters) resolved against the commit's tree listing (`resolve`): a symlink *in the tree* is followed lexically
  when it stays inside the tree, refused when it leaves it (absolute, or `..` above the root) or reaches `.git`; a
  submodule is an entry with a commit id, never entered. The host filesystem is never consulted.

Every git command is `crewwork.workspace.gitops.run_git` (hardened config, `--git-dir`, no protocol allowed so nothing is
fetched lazily, the query profile's memory bound) with a bounded output and a timeout, or one of the two streaming
readers of crewwork.repos.gitproc with the same options.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from crewwork.boundary import hostproc
from crewwork.boundary.paths import PathRefused, RelPath, is_dotgit
from crewwork.workspace.gitops import WORKSPACE_CONFIG, GitOutputTooLarge, run_git

MAX_REF_CHARS = 256
MAX_SYMLINK_HOPS = 16
MAX_LINK_BYTES = 4096

_REF_BASE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/+-]*")
_REF_SUFFIX = re.compile(r"(?:~[0-9]{1,5}|\^[0-9]?)*")
_HEX = re.compile(r"[0-9a-f]{7,64}")
_CONTROL = re.compile(r"[\x00-\x1f]")
# A component that could be `.git` (crewwork.boundary.paths.is_dotgit: case, HFS+ ignorable code points between the
# letters, NTFS suffixes, `git~1`) holds g, i and t in this order with at most ignorable code points between them.
_MAYBE_DOTGIT = re.compile(
    "g[\u200c-\u200f\u202a-\u202e\u206a-\u206f\ufeff]*i[\u200c-\u200f\u202a-\u202e\u206a-\u206f\ufeff]*t",
    re.IGNORECASE,
)


class TreeError(ValueError):
    """A request about a tree that cannot be answered; the message is safe to show the tenant. `code` says which kind:
    `invalid_ref`, `invalid_path`, `invalid_argument`, `not_found`, `too_large`, `timeout`, `limit_exceeded` (git
    needed more memory or CPU than its bound, crewwork.boundary.hostproc)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class TreePath(RelPath):
    """A path inside a repository's tree, as a tenant names it (crewwork.boundary.paths.RelPath's rules; `.crewwork/` is an
    ordinary directory of a repository here)."""

    allow_platform: ClassVar[bool] = True
    what: ClassVar[str] = "path"


def parse_path(raw: str, *, allow_root: bool = False) -> tuple[str, ...]:
    """The components of a tenant's path; () for the root when `allow_root` (``""``, ``.``, ``/``)."""
    if allow_root and raw.strip("/") in ("", "."):
        return ()
    try:
        return TreePath.parse(raw).parts
    except PathRefused as exc:
        # crewwork.boundary.paths words its .git refusal for changes; here nothing is changed, only never read.
        why = str(exc).replace("reaches a .git directory, which no change may touch", "names .git, which is never read")
        raise TreeError(why, "invalid_path") from None


@dataclass(frozen=True)
class ParsedRef:
    base: str
    suffix: str

    @property
    def hex(self) -> bool:
        return bool(_HEX.fullmatch(self.base))


def parse_ref(raw: object) -> ParsedRef:
    """A ref as a tenant may write it, or TreeError(`invalid_ref`) saying why not (see the module's docstring)."""
    if not isinstance(raw, str) or not raw:
        raise TreeError("ref must be a non-empty string", "invalid_ref")
    if len(raw) > MAX_REF_CHARS:
        raise TreeError(f"ref is longer than {MAX_REF_CHARS} characters", "invalid_ref")
    if raw.startswith("-"):
        raise TreeError(f"ref {raw[:80]!r} starts with '-': refs are names or commit ids, never options", "invalid_ref")
    m = _REF_BASE.match(raw)
    suffix = raw[m.end() :] if m else raw
    if m is None or not _REF_SUFFIX.fullmatch(suffix):
        raise TreeError(
            f"ref {raw[:80]!r} is not a branch, tag, HEAD or commit id (optionally with ~N or ^N); "
            "characters such as ':', '@', '{' and spaces are not accepted",
            "invalid_ref",
        )
    base = m.group(0)
    parts = base.split("/")
    if (
        ".." in base
        or "//" in base
        or base.endswith(("/", ".", ".lock"))
        or any(p.startswith(".") or p.endswith(".lock") or not p for p in parts)
    ):
        raise TreeError(f"ref {raw[:80]!r} is not a valid ref name", "invalid_ref")
    if base.startswith("refs/") and not base.startswith(("refs/heads/", "refs/tags/")):
        raise TreeError(f"ref {raw[:80]!r}: only refs/heads/ and refs/tags/ can be named", "invalid_ref")
    return ParsedRef(base, suffix)


@dataclass(frozen=True)
class Entry:
    """One entry of a commit's tree."""

    path: str
    mode: str
    kind: str
    """`blob`, `tree` or `commit` (a submodule)."""
    sha: str
    size: int | None

    @property
    def is_dir(self) -> bool:
        return self.kind == "tree"

    @property
    def is_symlink(self) -> bool:
        return self.mode == "120000"

    @property
    def is_submodule(self) -> bool:
        return self.kind == "commit"

    @property
    def is_file(self) -> bool:
        return self.kind == "blob" and not self.is_symlink

    @property
    def type(self) -> str:
        return "submodule" if self.is_submodule else "symlink" if self.is_symlink else "dir" if self.is_dir else "file"


@dataclass
class TreeIndex:
    """The whole listing of one commit's tree: entries by path, and each directory's children."""

    commit: str
    entries: dict[str, Entry]
    children: dict[str, list[str]] = field(default_factory=dict)
    """Each directory's entries, sorted."""
    skipped: int = 0
    """Entries whose names are not UTF-8 or that crewwork.boundary.paths refuses (`.git` spellings): never shown."""

    @property
    def files(self) -> list[Entry]:
        return [e for e in self.entries.values() if e.is_file]


# ---------------------------------------------------------------------------------------------- caches


class _Lru:
    """A small in-process LRU (values are immutable facts about a commit: its listing, its reachability), bounded by
    count and by total weight (a listing weighs its number of entries)."""

    def __init__(self, size: int, max_weight: int | None = None) -> None:
        self.size = size
        self.max_weight = max_weight
        self.data: OrderedDict[tuple[str, ...], object] = OrderedDict()

    def get(self, key: tuple[str, ...]) -> object | None:
        if key in self.data:
            self.data.move_to_end(key)
            return self.data[key]
        return None

    def put(self, key: tuple[str, ...], value: object) -> None:
        self.data[key] = value
        self.data.move_to_end(key)
        while len(self.data) > self.size or (self.max_weight is not None and self._weight() > self.max_weight):
            if len(self.data) == 1:
                break
            self.data.popitem(last=False)

    def _weight(self) -> int:
        return sum(len(v.entries) if isinstance(v, TreeIndex) else 1 for v in self.data.values())


_REACHABLE = _Lru(4096)
_INDEXES = _Lru(16, max_weight=1_000_000)
"""Tree listings held by one process: 16 commits, 1M entries in all (~400 bytes each: ~400 MiB at most)."""


# ---------------------------------------------------------------------------------------------- refs


async def _git(
    git_dir: Path, *args: str, timeout_s: float, max_output: int = 1024 * 1024, input_bytes: bytes | None = None
) -> tuple[int, str, bytes]:
    try:
        res = await run_git(
            args,
            git_dir=git_dir,
            check=False,
            config=WORKSPACE_CONFIG,
            max_output=max_output,
            timeout_s=timeout_s,
            input_bytes=input_bytes,
            profile=hostproc.Profile.QUERY,
        )
    except TimeoutError:
        raise TreeError(f"git {args[0]} took longer than {timeout_s:g} s", "timeout") from None
    if res.code != 0 and hostproc.exhausted(res.code, res.err):
        raise limit_exceeded(args[0]) from None
    return res.code, res.out, res.raw


def limit_exceeded(command: str) -> TreeError:
    mib = hostproc.limits(hostproc.Profile.QUERY).memory_bytes // hostproc.MIB
    return TreeError(
        f"git {command} needed more than its bound of {mib} MiB of memory (CREWWORK_GIT_QUERY_MEMORY_MB) or its CPU "
        "time; ask for less (a narrower path, a simpler pattern)",
        "limit_exceeded",
    )


async def _rev(git_dir: Path, spec: str, timeout_s: float) -> str | None:
    code, out, _ = await _git(
        git_dir, "rev-parse", "--verify", "--quiet", "--end-of-options", spec, timeout_s=timeout_s
    )
    sha = out.strip()
    return sha if code == 0 and re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", sha) else None


async def reachable(git_dir: Path, commit: str, *, scope: str, timeout_s: float) -> bool:
    """Whether `commit` is reachable from a branch or tag of `git_dir` (cached per `scope`, a tenant registration)."""
    key = (scope, str(git_dir), commit)
    if _REACHABLE.get(key):
        return True
    code, out, _ = await _git(
        git_dir,
        "for-each-ref",
        "--count=1",
        "--format=%(refname)",
        f"--contains={commit}",
        "refs/heads/",
        "refs/tags/",
        timeout_s=timeout_s,
    )
    ok = code == 0 and bool(out.strip())
    if ok:
        _REACHABLE.put(key, True)
    return ok


async def resolve_commit(git_dir: Path, raw: object, *, scope: str, timeout_s: float = 30.0) -> str:
    """The full id of the commit `raw` names in `git_dir`, by the rules of the module's docstring. TreeError
    (`invalid_ref`, `not_found`) otherwise; a name and an id that do not exist get the same `not_found`."""
    ref = parse_ref(raw)
    if ref.base == "HEAD":
        candidates = ["HEAD"]
    elif ref.base.startswith("refs/"):
        candidates = [ref.base]
    else:
        candidates = [f"refs/heads/{ref.base}", f"refs/tags/{ref.base}"]
    commit = None
    for cand in candidates:
        commit = await _rev(git_dir, f"{cand}^{{commit}}", timeout_s)
        if commit:
            break
    if commit is None and ref.hex:
        found = await _rev(git_dir, f"{ref.base}^{{commit}}", timeout_s)
        if found and await reachable(git_dir, found, scope=scope, timeout_s=timeout_s):
            commit = found
    if commit is None:
        raise TreeError(f"ref {raw!r} names no branch, tag or commit of this repository", "not_found")
    if ref.suffix:
        moved = await _rev(git_dir, f"{commit}{ref.suffix}^{{commit}}", timeout_s)
        if moved is None:
            raise TreeError(f"ref {raw!r}: {commit[:12]}{ref.suffix} does not exist", "not_found")
        commit = moved
    return commit


# ---------------------------------------------------------------------------------------------- trees


async def load_index(
    git_dir: Path, commit: str, *, scope: str, max_entries: int = 500_000, timeout_s: float = 30.0
) -> TreeIndex:
    """The tree listing of `commit` (cached per `scope` and commit: a commit's tree never changes)."""
    key = (scope, str(git_dir), commit)
    cached = _INDEXES.get(key)
    if isinstance(cached, TreeIndex):
        return cached
    try:
        code, _, raw = await _git(
            git_dir,
            "ls-tree",
            "-r",
            "-t",
            "-z",
            "--long",
            "--full-tree",
            commit,
            timeout_s=timeout_s,
            # ~ 120 bytes per entry is generous for ls-tree --long; a bigger listing is refused by count below.
            max_output=max_entries * 160,
        )
    except GitOutputTooLarge:
        raise TreeError(f"the tree of {commit[:12]} has more than {max_entries} entries", "too_large") from None
    if code != 0:
        raise TreeError(f"commit {commit[:12]} has no readable tree here", "not_found")
    # Up to `max_entries` records of pure Python work: in a thread, so a serving event loop keeps answering.
    index = await asyncio.to_thread(_parse_listing, commit, raw, max_entries)
    _INDEXES.put(key, index)
    return index


def _parse_listing(commit: str, raw: bytes, max_entries: int) -> TreeIndex:
    index = TreeIndex(commit, {}, {"": []})
    records = raw.split(b"\x00")
    if len(records) > max_entries + 1:
        raise TreeError(f"the tree of {commit[:12]} has more than {max_entries} entries", "too_large")
    for rec in records:
        if not rec:
            continue
        meta, _, name = rec.partition(b"\t")
        fields = meta.split()
        if len(fields) != 4:
            continue
        try:
            path = name.decode("utf-8")
        except UnicodeDecodeError:
            index.skipped += 1
            continue
        # The regular expressions only pick out the few paths that need the exact (slow) checks.
        if _CONTROL.search(path) or (_MAYBE_DOTGIT.search(path) and any(is_dotgit(p) for p in path.split("/"))):
            index.skipped += 1
            continue
        size = int(fields[3]) if fields[3].isdigit() else None
        entry = Entry(path, fields[0].decode(), fields[1].decode(), fields[2].decode(), size)
        index.entries[path] = entry
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        index.children.setdefault(parent, []).append(path)
        if entry.is_dir:
            index.children.setdefault(path, [])
    for names in index.children.values():  # sorted here, in the thread, once: never per request on the event loop
        names.sort()
    return index


def _lexical(dir_parts: list[str], target: str) -> list[str] | None:
    """`target` (a symlink's text) taken from the directory `dir_parts`, or None when it leaves the tree."""
    if target.startswith("/") or "\x00" in target:
        return None
    parts = list(dir_parts)
    for comp in target.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(comp)
    return parts


async def resolve(
    git_dir: Path, index: TreeIndex, parts: tuple[str, ...], *, follow_final: bool = True, timeout_s: float = 30.0
) -> Entry | None:
    """The entry `parts` names in the tree, following in-tree symlinks (the final one only when `follow_final`);
    None for the root. TreeError when it does not exist, leaves the tree, reaches `.git` or enters a submodule."""
    shown = "/".join(parts)
    cur = list(parts)
    hops = 0
    i = 0
    entry: Entry | None = None
    while i < len(cur):
        prefix = "/".join(cur[: i + 1])
        entry = index.entries.get(prefix)
        last = i == len(cur) - 1
        if entry is None:
            raise TreeError(f"{shown} does not exist at {index.commit[:12]}", "not_found")
        if entry.is_symlink and (not last or follow_final):
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                raise TreeError(f"{shown}: more than {MAX_SYMLINK_HOPS} symbolic links on the way", "invalid_path")
            target = await read_link(git_dir, entry, timeout_s=timeout_s)
            moved = _lexical(cur[:i], target)
            if moved is None:
                raise TreeError(
                    f"{shown}: {prefix} is a symbolic link that points outside the repository (not followed)",
                    "invalid_path",
                )
            if any(is_dotgit(p) for p in moved):
                raise TreeError(f"{shown}: {prefix} is a symbolic link into .git (not followed)", "invalid_path")
            cur = moved + cur[i + 1 :]
            i = 0
            if not cur:
                return None
            continue
        if entry.is_submodule and not last:
            raise TreeError(
                f"{shown}: {prefix} is a submodule (commit {entry.sha[:12]}); its files are not part of this repository",
                "not_found",
            )
        if not last and not entry.is_dir:
            raise TreeError(f"{shown}: {prefix} is not a directory", "not_found")
        i += 1
    return entry


async def read_link(git_dir: Path, entry: Entry, *, timeout_s: float = 30.0) -> str:
    data = await read_blob(git_dir, entry.sha, max_bytes=MAX_LINK_BYTES, timeout_s=timeout_s)
    return data.decode("utf-8", "replace")


async def read_blob(git_dir: Path, sha: str, *, max_bytes: int, timeout_s: float = 30.0) -> bytes:
    """A blob's bytes (TreeError `too_large` past `max_bytes`)."""
    if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", sha):
        raise TreeError("not an object id", "invalid_argument")
    try:
        code, _, raw = await _git(git_dir, "cat-file", "blob", sha, timeout_s=timeout_s, max_output=max_bytes)
    except GitOutputTooLarge:
        raise TreeError(f"object {sha[:12]} is larger than {max_bytes} bytes", "too_large") from None
    if code != 0:
        raise TreeError(f"object {sha[:12]} is not readable here", "not_found")
    return raw
