"""Workspaces: the one directory an agent or a test run may change, made and read by the host without trusting it.

A workspace is a plain directory (its own loopback file system when disk caps are on, owned by the sandbox
user) next to a *private git directory* the host keeps outside it (`crewwork.workspace.gitops.PrivateGit`). There is no
`.git` in a workspace that the host ever uses:

- **materialise**: the host lists the base tree in its private git directory and writes every file itself
  through `crewwork.boundary.safefs` (byte-exact blobs: no checkout, no filters, no attributes, no hooks);
- **capture**: after the run, the host walks the workspace through `safefs` (nothing followed, special files
  and hard links not taken, every size bounded), hashes what it finds, writes only the changed blobs into the
  private object directory with `git fast-import`, builds the new tree there and diffs it against the base
  tree. Git never reads a file of the workspace; it only sees bytes the host streamed to it;
- **apply**: a diff (a previous capture, for validation) is applied to the base tree in a private index only.

An agent that wants a `.git` of its own for its tools can make one inside its sandbox: the capture ignores any
`.git` entry (in any spelling) and the host never reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from crewwork.boundary import safefs
from crewwork.boundary.paths import PLATFORM_DIR, is_dotgit, refused_component
from crewwork.models import DiffStats
from crewwork.models.errors import CaptureRefused, DiffTooLarge
from crewwork.sandbox.disk import WorkspaceDisk, unmount_all_under
from crewwork.workspace import gitops
from crewwork.workspace.gitops import PrivateGit, Tree, TreeEntry
from crewwork.workspace.liveness import HomeLock, claim

GITIGNORE_MAX_BYTES = 256 * 1024
Sink = Callable[[bytes | None], None]
"""Takes a blob's content chunk by chunk, then None."""
# Symlinks with these names are refused by git itself (they would redirect attributes/submodules on checkout).
_NO_SYMLINK_NAMES = {b".gitmodules", b".gitattributes", b".gitignore", b".mailmap"}


class WorkspaceError(RuntimeError):
    """The workspace could not be made (the repository holds something the platform refuses to write)."""


@dataclass(frozen=True)
class CaptureLimits:
    """Bounds on what one capture reads from a workspace. A change beyond them fails with a clear cause."""

    max_diff_bytes: int
    """Largest diff kept (the artifact limit): a bigger change fails the attempt as too large."""
    max_file_bytes: int
    """Largest single file taken into a change."""
    max_entries: int = 200_000
    """Most directory entries walked."""
    max_depth: int = 128
    """Deepest directory nesting walked."""
    max_path_bytes: int = 4096


@dataclass
class Capture:
    diff: bytes
    stats: DiffStats
    tree: str
    entries: Tree
    ignored: list[str] = field(default_factory=list)
    """`path: reason` of entries found and not taken (special files, hard links, .git directories)."""


@dataclass
class _Found:
    rel: bytes
    entry: TreeEntry
    size: int
    ident: tuple[int, int]
    target: bytes | None = None


class _Ignores:
    """The .gitignore files met on the way down, deepest last (git's precedence: the deepest file decides)."""

    def __init__(self) -> None:
        self.specs: list[tuple[str, object]] = []

    def push(self, prefix: str, text: str) -> bool:
        import pathspec

        spec = pathspec.GitIgnoreSpec.from_lines(text.splitlines())
        if not spec.patterns:
            return False
        self.specs.append((prefix, spec))
        return True

    def pop(self) -> None:
        self.specs.pop()

    def ignored(self, rel: str, is_dir: bool) -> bool:
        for prefix, spec in reversed(self.specs):
            sub = rel[len(prefix) :] if prefix else rel
            res = spec.check_file(sub + ("/" if is_dir else ""))  # type: ignore[attr-defined]
            if res.include is not None:
                return bool(res.include)
        return False


class Workspace:
    """One workspace and its private git directory. Make it with `await Workspace.create(...)`."""

    def __init__(
        self,
        *,
        home: Path,
        git: PrivateGit,
        base_commit: str,
        base: Tree,
        disk: WorkspaceDisk | None,
        owner: tuple[int, int] | None,
        lock: HomeLock | None = None,
    ) -> None:
        self.home = home
        self.lock = lock
        """Held while the workspace lives: the host sweep leaves it alone (crewwork/workspace/liveness.py)."""
        self.path = home / "ws"
        self.git = git
        self.base_commit = base_commit
        self.base = base
        self.disk = disk
        self.owner = owner

    @property
    def private_fs(self) -> bool:
        """True when the workspace is a file system of its own (no hard link can reach anything outside it)."""
        return self.disk is not None

    @property
    def disk_enforcement(self) -> str:
        return f"loop-{self.disk.size_mb}m" if self.disk is not None else "none"

    @classmethod
    async def create(
        cls,
        *,
        git_dir: Path,
        home: Path,
        commit: str,
        disk_mb: int | None,
        owner: tuple[int, int] | None,
        materialise: bool = True,
    ) -> Workspace:
        """A fresh workspace at `home/ws` holding `commit` of the repository whose git directory is `git_dir`.

        Whatever a crashed earlier attempt left at `home` is removed first, under the home's lock."""
        lock = await claim(home)
        try:
            await remove_tree(home)
            home.mkdir(parents=True, mode=0o700)
        except BaseException:
            lock.release(unlink=True)
            raise
        try:
            git = await PrivateGit.create(git_dir, home / "git")
            base = await git.ls_tree(commit)
            disk = None
            path = home / "ws"
            if disk_mb:
                disk = await WorkspaceDisk.create(
                    home / "disk.img", path, disk_mb, owner or (os.geteuid(), os.getegid())
                )
            else:
                path.mkdir(mode=0o755)
                if owner is not None:
                    os.chown(path, *owner)
            ws = cls(home=home, git=git, base_commit=commit, base=base, disk=disk, owner=owner, lock=lock)
            if materialise:
                await ws.write_entries(base)
            return ws
        except BaseException:
            await asyncio.shield(remove_tree(home))
            lock.release(unlink=True)
            raise

    # ------------------------------------------------------------------ writing (host-made content only)

    async def write_entries(
        self, entries: Mapping[bytes, TreeEntry], only: set[bytes] | None = None, *, source: PrivateGit | None = None
    ) -> None:
        """Write tree entries into the workspace (all of them, or the paths in `only`), byte for byte. `source`: the
        git directory holding their blobs when it is another workspace's (a change applied there)."""
        wanted = sorted(p for p in entries if only is None or p in only)
        for p in wanted:
            why = refused_component(p)
            if why is not None or (entries[p].mode == "120000" and p.rsplit(b"/", 1)[-1] in _NO_SYMLINK_NAMES):
                shown = p.decode("utf-8", "replace")
                raise WorkspaceError(
                    f"the tree holds {shown!r}, which the platform refuses to write ({why or 'symlink'})"
                )
        root_fd = safefs.open_root(self.path)
        try:
            blobs: list[bytes] = []
            for p in wanted:
                e = entries[p]
                if e.mode == "160000":
                    safefs.make_dirs(root_fd, p, owner=self.owner)  # a submodule: an empty directory, as git does
                else:
                    blobs.append(p)
            pending = iter(blobs)
            max_blob = 1 << 40

            def sink(sha: str, size: int) -> Sink:
                p = next(pending)
                e = entries[p]
                if e.mode == "120000":
                    buf = bytearray()

                    def put_link(chunk: bytes | None) -> None:
                        if chunk is not None:
                            buf.extend(chunk)
                            return
                        safefs.symlink(root_fd, p, bytes(buf), owner=self.owner)

                    return put_link
                fd = safefs.create_file(root_fd, p, mode=0o755 if e.mode == "100755" else 0o644, owner=self.owner)

                def put(chunk: bytes | None) -> None:
                    if chunk is None:
                        os.close(fd)
                        return
                    view = memoryview(chunk)
                    try:
                        while view:
                            view = view[os.write(fd, view) :]
                    except BaseException:
                        os.close(fd)
                        raise

                return put

            await (source or self.git).stream_blobs([entries[p].sha for p in blobs], sink, max_blob=max_blob)
        except OSError as exc:
            if exc.errno == 28:  # ENOSPC
                raise WorkspaceError(
                    f"the repository does not fit in the workspace disk cap ({self.disk_enforcement}): {exc}"
                ) from exc
            raise
        finally:
            os.close(root_fd)

    async def update(
        self, old: Mapping[bytes, TreeEntry], new: Mapping[bytes, TreeEntry], *, source: PrivateGit | None = None
    ) -> None:
        """Turn a workspace holding `old` (written by the host, touched by nothing else) into one holding `new`
        (`source`: the git directory holding new blobs when it is another workspace's)."""
        gone = sorted((p for p in old if p not in new or old[p] != new[p]), reverse=True)
        root_fd = safefs.open_root(self.path)
        try:
            for p in gone:
                safefs.remove(root_fd, p)
            for p in sorted(new):
                if p in old and old[p] == new[p]:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = os.fstat(fd := safefs.lookup(root_fd, p))
                    os.close(fd)
                    if stat.S_ISDIR(st.st_mode):  # a directory emptied above now becomes a file
                        safefs.remove(root_fd, p)
        finally:
            os.close(root_fd)
        await self.write_entries(new, only={p for p in new if p not in old or old[p] != new[p]}, source=source)

    def make_dir(self, rel: str) -> None:
        """Create a directory (and parents) for the sandbox user, e.g. the report's parent directory."""
        root_fd = safefs.open_root(self.path)
        try:
            safefs.make_dirs(root_fd, rel, owner=self.owner)
        finally:
            os.close(root_fd)

    # ------------------------------------------------------------------ trees

    async def apply(self, diff: bytes) -> tuple[Tree | None, str]:
        """The base tree with `diff` applied (in the private index only), or (None, why not)."""
        tree, err = await self.git.apply(self.base_commit, diff)
        if tree is None:
            return None, err
        return await self.git.ls_tree(tree), ""

    async def apply_in_place(self, diff: bytes, limits: CaptureLimits | None = None) -> tuple[bool, str]:
        """Apply `diff` to what the workspace holds now (for host-side agents): capture it, apply the diff to
        that tree in the private index, and write back the paths that differ. (False, why) if it does not apply.

        Only for workspaces no untrusted process has run in yet: the write-back replaces entries in place."""
        limits = limits or CaptureLimits(max_diff_bytes=1 << 40, max_file_bytes=1 << 40)
        now = await self.capture(limits)
        tree, err = await self.git.apply(now.tree, diff)
        if tree is None:
            return False, err
        await self.update(now.entries, await self.git.ls_tree(tree))
        return True, ""

    # ------------------------------------------------------------------ capture (untrusted content)

    async def capture(self, limits: CaptureLimits) -> Capture:
        """Everything changed in the workspace relative to the base commit, as a binary-safe unified diff."""
        found, ignored = await asyncio.to_thread(self._scan, limits)
        entries: Tree = {p: e for p, e in self.base.items() if e.mode == "160000"}
        entries.update({f.rel: f.entry for f in found})
        changed = [f for f in found if self.base.get(f.rel) != f.entry]
        if entries == self.base:
            return Capture(b"", DiffStats(ignored=ignored), self.base_commit, entries, ignored)
        if changed:
            await self.git.write_blobs(self._blob_stream(changed, limits))
        try:
            tree = await self.git.write_tree(entries)
        except gitops.GitError as exc:
            raise CaptureRefused(str(exc)) from exc
        try:
            diff, stats = await asyncio.gather(
                self.git.diff(self.base_commit, tree, max_bytes=limits.max_diff_bytes),
                self.git.numstat(self.base_commit, tree),
            )
        except gitops.GitOutputTooLarge as exc:
            raise DiffTooLarge(
                f"the change is larger than the artifact limit of {limits.max_diff_bytes} bytes as a diff; "
                "make a smaller change (or ask the operator to raise CREWWORK_MAX_ARTIFACT_BYTES)"
            ) from exc
        stats.ignored = ignored
        return Capture(diff, stats, tree, entries, ignored)

    async def _blob_stream(
        self, changed: list[_Found], limits: CaptureLimits
    ) -> AsyncIterator[tuple[int, AsyncIterator[bytes]]]:
        root_fd = safefs.open_root(self.path)
        try:
            for f in changed:
                if f.target is not None:
                    yield len(f.target), _once(f.target)
                    continue
                fd, st = safefs.open_regular(
                    root_fd, f.rel, max_bytes=limits.max_file_bytes, allow_hardlinks=self.private_fs
                )
                try:
                    if (st.st_dev, st.st_ino) != f.ident or st.st_size != f.size:
                        raise CaptureRefused(f"{f.rel.decode('utf-8', 'replace')} changed while it was captured")
                    yield f.size, _hashed_chunks(fd, f, self.git)
                finally:
                    os.close(fd)
        finally:
            os.close(root_fd)

    def _scan(self, limits: CaptureLimits) -> tuple[list[_Found], list[str]]:
        tracked_dirs: set[bytes] = set()
        for p in self.base:
            parts = p.split(b"/")
            for i in range(1, len(parts)):
                tracked_dirs.add(b"/".join(parts[:i]))
        gitlinks = {p for p, e in self.base.items() if e.mode == "160000"}
        found: list[_Found] = []
        ignored: list[str] = []
        ignores = _Ignores()
        count = 0
        root_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        root_dev = os.fstat(root_fd).st_dev

        def note(rel: bytes, why: str) -> None:
            if len(ignored) < 200:
                ignored.append(f"{rel.decode('utf-8', 'replace')}: {why}")

        def walk(dir_fd: int, prefix: bytes, depth: int) -> None:
            nonlocal count
            listing = safefs.entries(dir_fd)
            pushed = False
            for name, st in listing:
                if name == b".gitignore" and stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    try:
                        fd, _ = safefs.open_child_regular(
                            dir_fd, name, max_bytes=GITIGNORE_MAX_BYTES, allow_hardlinks=False, rel=prefix + name
                        )
                        with safefs.opened(fd):
                            text = b"".join(safefs.iter_fd(fd, max_bytes=GITIGNORE_MAX_BYTES)).decode(
                                "utf-8", "replace"
                            )
                        pushed = ignores.push(prefix.decode("utf-8", "surrogateescape"), text)
                    except safefs.Refused:
                        pass
            try:
                for name, st in listing:
                    count += 1
                    if count > limits.max_entries:
                        raise CaptureRefused(f"the workspace holds more than {limits.max_entries} entries")
                    rel = prefix + name
                    if len(rel) > limits.max_path_bytes:
                        raise CaptureRefused(f"a path in the workspace is longer than {limits.max_path_bytes} bytes")
                    if not prefix and name in (PLATFORM_DIR.encode(), b"lost+found"):
                        continue
                    if is_dotgit(name):
                        note(rel, "a .git entry (never part of a change; the host never reads it)")
                        continue
                    if b"\\" in name:
                        note(rel, "the name contains a backslash (refused: a Windows path separator)")
                        continue
                    if st.st_dev != root_dev:
                        note(rel, "on another file system")
                        continue
                    srel = rel.decode("utf-8", "surrogateescape")
                    tracked = rel in self.base
                    if stat.S_ISDIR(st.st_mode):
                        if rel in gitlinks:
                            continue
                        if rel not in tracked_dirs and ignores.ignored(srel, True):
                            continue
                        if depth + 1 > limits.max_depth:
                            raise CaptureRefused(f"the workspace is nested deeper than {limits.max_depth} directories")
                        sub = safefs.open_subdir(dir_fd, name, st)
                        with safefs.opened(sub):
                            walk(sub, rel + b"/", depth + 1)
                        continue
                    if not tracked and ignores.ignored(srel, False):
                        continue
                    if stat.S_ISLNK(st.st_mode):
                        if name in _NO_SYMLINK_NAMES:
                            note(rel, "a symbolic link named like a git control file (git refuses those)")
                            continue
                        target = safefs.readlink_child(dir_fd, name)
                        h = self.git.blob_hasher(len(target))
                        h.update(target)
                        found.append(
                            _Found(
                                rel,
                                TreeEntry("120000", "blob", h.hexdigest()),
                                len(target),
                                (st.st_dev, st.st_ino),
                                target,
                            )
                        )
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        note(rel, f"{safefs.describe(st)} (not a file: not captured)")
                        continue
                    if st.st_nlink > 1 and not self.private_fs:
                        note(rel, f"a hard link ({st.st_nlink} names): not captured")
                        continue
                    if st.st_size > limits.max_file_bytes:
                        raise DiffTooLarge(
                            f"{srel} is {st.st_size} bytes, more than the limit of {limits.max_file_bytes} for one "
                            "file of a change"
                        )
                    fd, fst = safefs.open_child_regular(
                        dir_fd, name, max_bytes=limits.max_file_bytes, allow_hardlinks=self.private_fs, rel=rel
                    )
                    with safefs.opened(fd):
                        h = self.git.blob_hasher(fst.st_size)
                        size = 0
                        for chunk in safefs.iter_fd(fd, max_bytes=fst.st_size, rel=rel):
                            h.update(chunk)
                            size += len(chunk)
                    if size != fst.st_size:
                        raise CaptureRefused(f"{srel} changed size while it was captured")
                    mode = "100755" if fst.st_mode & stat.S_IXUSR else "100644"
                    found.append(_Found(rel, TreeEntry(mode, "blob", h.hexdigest()), size, (fst.st_dev, fst.st_ino)))
            finally:
                if pushed:
                    ignores.pop()

        try:
            walk(root_fd, b"", 0)
        except safefs.Refused as exc:
            raise CaptureRefused(f"capture refused {exc}") from exc
        finally:
            os.close(root_fd)
        return found, ignored

    # ------------------------------------------------------------------ teardown

    async def remove(self) -> None:
        await remove_tree(self.home)
        if self.lock is not None:
            self.lock.release(unlink=True)


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _hashed_chunks(fd: int, f: _Found, git: PrivateGit) -> AsyncIterator[bytes]:
    h = git.blob_hasher(f.size)
    for chunk in safefs.iter_fd(fd, max_bytes=f.size, rel=f.rel):
        h.update(chunk)
        yield chunk
    if h.hexdigest() != f.entry.sha:
        raise CaptureRefused(f"{f.rel.decode('utf-8', 'replace')} changed while it was captured")


async def remove_tree(root: Path) -> None:
    """Remove a workspace home (or a whole directory of them): unmount what is mounted below, then delete.

    Deletion never follows links (shutil.rmtree works on descriptors), so a link the sandbox left in a
    workspace cannot make the host delete anything outside it; what the sandbox made unwritable is deleted too
    (safefs.delete_tree)."""
    root = Path(root)
    if not root.exists() and not root.is_symlink():
        return
    await unmount_all_under(root)
    await asyncio.to_thread(safefs.delete_tree, root)
