"""Git operations on the host: repositories and refs, private per-workspace git directories, trees, diffs, landing.

The one rule (docs/sandbox.md): everything inside a workspace is untrusted input, so host git never looks at a
workspace. It always runs with an explicit git directory the host made (`--git-dir`), never discovers one from a
current directory, reads no system or global configuration, and runs with `HARDENED_CONFIG` (no hooks, no
fsmonitor, no ssh command, protected `.git` spellings). The workspace itself is written and read by
`crewwork.workspace.tree` through `crewwork.boundary.safefs`; git only ever sees object ids and bytes the host hands it.

Functions take the repository's git directory as a parameter (`git_dir_of(repo)` for a local repository; a
mirror cache can supply its own), and every output the host reads from git is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from crewwork.boundary import hostproc
from crewwork.boundary.paths import PLATFORM_DIR as PLATFORM_DIR
from crewwork.models import DiffStats
from crewwork.workspace import childio

_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "crewwork",
    "GIT_AUTHOR_EMAIL": "crewwork@localhost",
    "GIT_COMMITTER_NAME": "crewwork",
    "GIT_COMMITTER_EMAIL": "crewwork@localhost",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "LC_ALL": "C",
}
# Given on every host git command line (command-line configuration wins over any repository's own config).
HARDENED_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.protectHFS=true",
    "core.protectNTFS=true",
    "core.attributesFile=/dev/null",
    "core.sshCommand=false",
    "core.askPass=false",
    "diff.external=",
    "gc.auto=0",
    "maintenance.auto=false",
    "fetch.recurseSubmodules=false",
    "submodule.recurse=false",
)
# Workspace-level commands never need a remote: no protocol is allowed at all, no credential helper is asked.
WORKSPACE_CONFIG = ("protocol.allow=never", "credential.helper=")
DEFAULT_MAX_OUTPUT = 64 * 1024 * 1024
MAX_STATS_FILES = 500
"""Files a change's statistics name (`DiffStats.files`); `files_changed` counts them all."""
MAX_STATS_NAME_CHARS = 500
_MAX_ERR = 64 * 1024


class GitError(RuntimeError):
    pass


class GitOutputTooLarge(GitError):
    """A git command produced more output than the caller allowed; it was stopped."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass
class GitResult:
    code: int
    out: str
    err: str
    raw: bytes = b""


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    # Nothing git-related is inherited from the worker's environment (GIT_DIR, GIT_CONFIG_PARAMETERS, ...).
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(_GIT_ENV)
    if extra:
        env.update(extra)
    return env


async def run_git(
    args: Iterable[str],
    *,
    git_dir: Path | str | None = None,
    cwd: Path | str | None = None,
    check: bool = True,
    input_bytes: bytes | None = None,
    input_chunks: AsyncIterator[bytes] | None = None,
    env: Mapping[str, str] | None = None,
    config: Iterable[str] = (),
    max_output: int = DEFAULT_MAX_OUTPUT,
    timeout_s: float = 120,
    profile: hostproc.Profile = hostproc.Profile.GIT,
) -> GitResult:
    """Run one git command with the hardened configuration, a bounded stdout (GitOutputTooLarge beyond) and
    `profile`'s memory bound (crewwork.boundary.hostproc)."""
    argv = ["git"]
    for item in (*HARDENED_CONFIG, *config):
        argv += ["-c", item]
    if git_dir is not None:
        argv.append(f"--git-dir={git_dir}")
    argv += list(args)
    feed = input_bytes is not None or input_chunks is not None
    proc = await asyncio.create_subprocess_exec(
        *hostproc.bounded(argv, profile),
        cwd=str(cwd if cwd is not None else (git_dir if git_dir is not None else "/")),
        env=_env(env),
        stdin=asyncio.subprocess.PIPE if feed else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out = bytearray()
    err = bytearray()

    async def write() -> None:
        assert proc.stdin is not None
        try:
            if input_bytes is not None and not await childio.feed_all(proc.stdin, input_bytes):
                return
            if input_chunks is not None:
                async for chunk in input_chunks:
                    if not await childio.feed_all(proc.stdin, chunk):
                        return
        finally:
            childio.close(proc.stdin)

    async def read_out() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(256 * 1024):
            out.extend(chunk)
            if len(out) > max_output:
                raise GitOutputTooLarge(f"git {_shown(args)} produced more than {max_output} bytes", max_output)

    async def read_err() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.read(64 * 1024):
            err.extend(chunk)
            del err[: max(0, len(err) - _MAX_ERR)]

    tasks = [asyncio.ensure_future(read_out()), asyncio.ensure_future(read_err())]
    if feed:
        tasks.append(asyncio.ensure_future(write()))
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout_s)
        await asyncio.wait_for(proc.wait(), timeout_s)
    except BaseException:
        for t in tasks:
            t.cancel()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        # Bounded: in CI this wait once never returned after the kill (the child's exit was not seen), and the
        # capture hung until its test's timeout instead of raising; a killed git exits at once.
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(proc.wait()), 10)
        raise
    raw = bytes(out)
    res = GitResult(proc.returncode or 0, raw.decode(errors="replace"), err.decode(errors="replace"), raw)
    if check and res.code != 0:
        raise GitError(f"git {_shown(args)} failed ({res.code}): {res.err.strip() or res.out.strip()[:2000]}")
    return res


def _shown(args: Iterable[str]) -> str:
    return " ".join(a if len(a) < 80 else a[:77] + "..." for a in args)


async def git(
    *args: str,
    cwd: Path | str,
    check: bool = True,
    input_bytes: bytes | None = None,
    timeout_s: float = 120,
    env: Mapping[str, str] | None = None,
) -> GitResult:
    """A hardened git command in the host repository at `cwd` (its git directory given explicitly, never
    discovered from a work tree). For repository-level commands; workspaces never go through here."""
    return await run_git(
        args, git_dir=git_dir_of(Path(cwd)), check=check, input_bytes=input_bytes, timeout_s=timeout_s, env=env
    )


def git_dir_of(repo: Path) -> Path:
    """The git directory of a host repository: `repo/.git` for a repository with a work tree, `repo` if bare.

    A repository whose `.git` is a file (a linked worktree or a submodule checkout) is resolved through its
    `gitdir:` line to the directory it names, and from there to the common directory."""
    repo = Path(repo)
    dotgit = repo / ".git"
    if dotgit.is_dir() and not dotgit.is_symlink():
        return dotgit
    if dotgit.is_file():
        text = dotgit.read_text(errors="replace")[:4096].strip()
        if text.startswith("gitdir:"):
            target = Path(text[len("gitdir:") :].strip())
            target = target if target.is_absolute() else (repo / target)
            common = target / "commondir"
            if common.is_file():
                c = Path(common.read_text().strip())
                target = c if c.is_absolute() else target / c
            return target.resolve()
    if (repo / "HEAD").is_file() and (repo / "objects").is_dir():
        return repo
    raise GitError(f"{repo} is not a git repository")


_FORMATS: dict[Path, str] = {}


async def object_format(git_dir: Path) -> str:
    """`sha1` or `sha256`: how the repository names its objects (fixed for a repository's life, so cached)."""
    git_dir = Path(git_dir)
    if git_dir in _FORMATS:
        return _FORMATS[git_dir]
    res = await run_git(["rev-parse", "--show-object-format"], git_dir=git_dir, check=False)
    fmt = res.out.strip() or "sha1"
    if fmt not in ("sha1", "sha256"):
        raise GitError(f"{git_dir}: unsupported object format {fmt!r}")
    _FORMATS[git_dir] = fmt
    return fmt


# ---------------------------------------------------------------------------------------------- trees


@dataclass(frozen=True)
class TreeEntry:
    """One non-tree entry of a recursive tree listing."""

    mode: str
    """Octal git mode: 100644, 100755, 120000 (symlink) or 160000 (submodule)."""
    kind: str
    """`blob` or `commit` (a submodule)."""
    sha: str


Tree = dict[bytes, TreeEntry]


@dataclass
class PrivateGit:
    """A git directory the host owns, per workspace and outside it: its own index, refs and object directory,
    reading the repository's objects through `objects/info/alternates`. Nothing an attempt writes (new blobs,
    trees) goes into the repository itself, and the directory goes away with the workspace."""

    path: Path
    source: Path
    object_format: str = "sha1"
    _hash: Callable[[], hashlib._Hash] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._hash = hashlib.sha256 if self.object_format == "sha256" else hashlib.sha1

    @classmethod
    async def create(cls, source_git_dir: Path, path: Path) -> PrivateGit:
        source_git_dir = Path(source_git_dir).resolve()
        fmt = await object_format(source_git_dir)
        if path.exists():
            shutil.rmtree(path)
        (path / "objects" / "info").mkdir(parents=True, mode=0o700)
        (path / "objects" / "pack").mkdir(mode=0o700)
        (path / "refs" / "heads").mkdir(parents=True, mode=0o700)
        (path / "HEAD").write_text("ref: refs/heads/crewwork-private\n")
        ext = "\trepositoryformatversion = 1\n[extensions]\n\tobjectformat = sha256\n" if fmt == "sha256" else ""
        (path / "config").write_text(
            "[core]\n\tbare = true\n" + (ext or "\trepositoryformatversion = 0\n") + "[gc]\n\tauto = 0\n"
        )
        alternates = [str(source_git_dir / "objects")]
        (path / "objects" / "info" / "alternates").write_text("\n".join(alternates) + "\n")
        path.chmod(0o700)
        return cls(path=path, source=source_git_dir, object_format=fmt)

    @property
    def zero(self) -> str:
        return "0" * (64 if self.object_format == "sha256" else 40)

    def blob_hasher(self, size: int) -> hashlib._Hash:
        h = self._hash()
        h.update(b"blob %d\x00" % size)
        return h

    async def run(
        self,
        *args: str,
        index: Path | None = None,
        check: bool = True,
        input_bytes: bytes | None = None,
        input_chunks: AsyncIterator[bytes] | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
        timeout_s: float = 300,
    ) -> GitResult:
        env = {"GIT_INDEX_FILE": str(index)} if index is not None else None
        return await run_git(
            args,
            git_dir=self.path,
            check=check,
            input_bytes=input_bytes,
            input_chunks=input_chunks,
            env=env,
            config=WORKSPACE_CONFIG,
            max_output=max_output,
            timeout_s=timeout_s,
        )

    async def ls_tree(self, tree: str, *, max_output: int = 256 * 1024 * 1024) -> Tree:
        """Every blob and submodule entry of `tree`, recursively, by path (bytes, as git stores them)."""
        raw = (await self.run("ls-tree", "-r", "-z", "--full-tree", tree, max_output=max_output)).raw
        out: Tree = {}
        for rec in raw.split(b"\x00"):
            if not rec:
                continue
            meta, _, path = rec.partition(b"\t")
            mode, kind, sha = meta.decode().split(" ")
            out[path] = TreeEntry(mode, kind, sha)
        return out

    async def write_tree(self, entries: Mapping[bytes, TreeEntry]) -> str:
        """The tree holding exactly `entries` (whose objects must exist), built in a fresh private index."""
        index = self.path / f"index-{os.urandom(6).hex()}"
        try:
            lines = b"".join(
                b"%s %s\t%s\x00" % (e.mode.encode(), e.sha.encode(), path) for path, e in sorted(entries.items())
            )
            res = await self.run("update-index", "-z", "--index-info", index=index, input_bytes=lines)
            if "Ignoring path" in res.err or "invalid path" in res.err:
                # update-index drops a path git's own rules refuse instead of failing: never a silent loss.
                raise GitError(f"git refused a path of the tree: {res.err.strip()[:500]}")
            return (await self.run("write-tree", index=index)).out.strip()
        finally:
            with contextlib.suppress(FileNotFoundError):
                index.unlink()

    async def write_blobs(self, blobs: AsyncIterator[tuple[int, AsyncIterator[bytes]]]) -> None:
        """Store blobs streamed as (size, chunks) with one `git fast-import`: no file is ever held whole."""

        async def stream() -> AsyncIterator[bytes]:
            async for size, chunks in blobs:
                yield b"blob\ndata %d\n" % size
                sent = 0
                async for chunk in chunks:
                    sent += len(chunk)
                    yield chunk
                if sent != size:
                    raise GitError(f"a blob announced {size} bytes but {sent} arrived")
                yield b"\n"
            yield b"done\n"

        await self.run("fast-import", "--quiet", "--done", input_chunks=stream(), timeout_s=600)

    async def stream_blobs(
        self, shas: list[str], sink: Callable[[str, int], Callable[[bytes | None], None]], *, max_blob: int
    ) -> None:
        """Feed the content of each blob in `shas` to `sink(sha, size)` chunk by chunk (None at the end).

        One `git cat-file --batch` for all of them; a blob larger than `max_blob` is an error."""
        if not shas:
            return
        argv = ["git", *(a for item in (*HARDENED_CONFIG, *WORKSPACE_CONFIG) for a in ("-c", item))]
        argv += [f"--git-dir={self.path}", "cat-file", "--batch"]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=str(self.path),
            env=_env(None),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=1024 * 1024,
        )
        assert proc.stdin is not None and proc.stdout is not None

        async def ask() -> None:
            assert proc.stdin is not None
            try:
                for sha in shas:
                    if not await childio.feed_all(proc.stdin, sha.encode() + b"\n"):
                        return
            finally:
                childio.close(proc.stdin)

        writer = asyncio.ensure_future(ask())
        try:
            for sha in shas:
                header = (await proc.stdout.readline()).decode().split()
                if len(header) != 3 or header[1] != "blob":
                    raise GitError(f"object {sha} is not a readable blob: {' '.join(header)}")
                size = int(header[2])
                if size > max_blob:
                    raise GitError(f"blob {sha} is {size} bytes, more than the limit of {max_blob}")
                put = sink(sha, size)
                left = size
                while left:
                    chunk = await proc.stdout.read(min(left, 256 * 1024))
                    if not chunk:
                        raise GitError("git cat-file ended early")
                    put(chunk)
                    left -= len(chunk)
                put(None)
                await proc.stdout.readexactly(1)
            await writer
            await proc.wait()
        except BaseException:
            writer.cancel()
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(BaseException):
                await asyncio.shield(proc.wait())
            raise

    async def read_blob(self, sha: str, max_bytes: int) -> bytes | None:
        """A small blob's content, or None if it is larger than `max_bytes` or missing."""
        size = await self.run("cat-file", "-s", sha, check=False)
        if size.code != 0 or not size.out.strip().isdigit() or int(size.out.strip()) > max_bytes:
            return None
        return (await self.run("cat-file", "blob", sha, max_output=max_bytes)).raw

    async def apply(self, tree: str, diff: bytes) -> tuple[str | None, str]:
        """Apply a unified diff to `tree` in a private index only (no work tree exists): (new tree, "") or
        (None, why it does not apply)."""
        index = self.path / f"index-{os.urandom(6).hex()}"
        try:
            await self.run("read-tree", tree, index=index)
            res = await self.run(
                "apply", "--cached", "--binary", "--whitespace=nowarn", "-", index=index, check=False, input_bytes=diff
            )
            if res.code != 0:
                return None, res.err.strip()[-4000:]
            return (await self.run("write-tree", index=index)).out.strip(), ""
        finally:
            with contextlib.suppress(FileNotFoundError):
                index.unlink()

    async def diff(self, base_tree: str, tree: str, *, max_bytes: int) -> bytes:
        """The binary-safe unified diff from `base_tree` to `tree`; GitOutputTooLarge beyond `max_bytes`."""
        return (
            await self.run(
                "diff",
                "--binary",
                "--full-index",
                "--no-color",
                "--no-ext-diff",
                "--no-textconv",
                "--src-prefix=a/",
                "--dst-prefix=b/",
                base_tree,
                tree,
                max_output=max_bytes,
            )
        ).raw

    async def numstat(self, base_tree: str, tree: str) -> DiffStats:
        raw = (await self.run("diff", "--numstat", "-z", "--no-ext-diff", "--no-textconv", base_tree, tree)).raw
        stats = DiffStats()
        fields = raw.split(b"\x00")
        i = 0
        while i < len(fields):
            head = fields[i]
            i += 1
            if not head:
                continue
            parts = head.split(b"\t", 2)  # the name itself may hold tabs
            if len(parts) != 3:
                continue
            ins, dels, name = parts
            if not name:  # a rename or copy: the two names follow as their own fields
                name = fields[i + 1] if i + 1 < len(fields) else b""
                i += 2
            stats.files_changed += 1
            stats.insertions += int(ins) if ins.isdigit() else 0
            stats.deletions += int(dels) if dels.isdigit() else 0
            # The statistics travel through Temporal with the attempt: a change of 100,000 files (or of long names)
            # is counted in full and named in part; the diff artifact holds every name.
            if len(stats.files) < MAX_STATS_FILES:
                stats.files.append(name.decode("utf-8", "replace")[:MAX_STATS_NAME_CHARS])
        return stats
