"""Host-side access to files beneath a root that a sandbox could have touched, never following a link.

Everything inside a workspace is untrusted: any component may have been replaced by a symlink, a FIFO, a socket,
a device node, a hard link to some other file, or a file far larger than it claims to matter. The functions here
resolve a path one component at a time beneath an open directory (openat2 with RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV where the kernel has it, else an O_NOFOLLOW
walk from the root's descriptor), so no path can lead out of the root or through a link. A file is first opened
as O_PATH, checked with fstat (a regular file, one link, within the size bound) and only then reopened for
reading through its own descriptor, so a FIFO or a device is never opened at all. Reads stream with a hard bound.

Hand-written on purpose: the standard library has no beneath-only resolution (Python 3.11 has no
`os.openat2`), and the libraries that offer one are thin wrappers over the same two system calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

CHUNK = 256 * 1024
_O_PATH = getattr(os, "O_PATH", 0o10000000)
_DIR_PATH = _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_READ = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# openat2(2) (Linux 5.6+): resolve flags.
_RESOLVE_NO_XDEV = 0x01
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = 437  # the same number on x86_64 and the generic table (aarch64)


class Refused(OSError):
    """The host refuses to touch this path; `reason` says why (a symlink, not a regular file, a hard link ...)."""

    def __init__(self, path: str | bytes, reason: str) -> None:
        shown = path.decode("utf-8", "replace") if isinstance(path, bytes) else path
        super().__init__(f"{shown}: {reason}")
        self.path = shown
        self.reason = reason


class TooLarge(Refused):
    """The file is larger than the bound the caller set (`size`: how large, when known)."""

    def __init__(self, path: str | bytes, reason: str, size: int | None = None) -> None:
        super().__init__(path, reason)
        self.size = size


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


@functools.cache
def openat2_available() -> bool:
    libc = _libc()
    if libc is None or os.uname().machine not in ("x86_64", "aarch64"):
        return False
    try:
        fd = _openat2_raw(os.open("/", _DIR_PATH), b".", _DIR_PATH, 0, close_dir=True)
    except OSError:
        return False
    if fd < 0:
        return False
    os.close(fd)
    return True


def _openat2_raw(dir_fd: int, path: bytes, flags: int, mode: int, *, close_dir: bool = False) -> int:
    libc = _libc()
    assert libc is not None
    how = _OpenHow(flags, mode, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_XDEV)
    try:
        libc.syscall.restype = ctypes.c_long
        fd = int(libc.syscall(ctypes.c_long(_SYS_OPENAT2), dir_fd, path, ctypes.byref(how), ctypes.sizeof(how)))
        if fd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOSYS, errno.EPERM) and close_dir:
                return -1
            raise OSError(err, os.strerror(err), path)
        return fd
    finally:
        if close_dir:
            os.close(dir_fd)


def _as_bytes(rel: str | bytes) -> bytes:
    return rel if isinstance(rel, bytes) else rel.encode("utf-8", "surrogateescape")


def _components(rel: str | bytes) -> list[bytes]:
    raw = _as_bytes(rel)
    if raw.startswith(b"/") or b"\x00" in raw:
        raise Refused(raw, "not a relative path")
    parts = [p for p in raw.split(b"/") if p not in (b"", b".")]
    if not parts or b".." in parts:
        raise Refused(raw, "not a plain relative path")
    return parts


def _refusal(rel: bytes, exc: OSError) -> Refused:
    if exc.errno == errno.ELOOP:
        return Refused(rel, "a component is a symbolic link (links are never followed)")
    if exc.errno == errno.EXDEV:
        return Refused(rel, "the path leaves the workspace (other file system or outside the root)")
    if exc.errno == errno.ENOTDIR:
        return Refused(rel, "a parent component is not a directory")
    if exc.errno == errno.ENXIO:
        return Refused(rel, "not a regular file (a socket or device)")
    return Refused(rel, f"cannot open: {exc.strerror or exc}")


@contextlib.contextmanager
def opened(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def open_root(path: Path | str) -> int:
    """An O_PATH descriptor of a directory the host made itself (a workspace root). The root must not be a link."""
    fd = os.open(path, _DIR_PATH)
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refused(str(path), "the root is not a directory")
    return fd


def _walk_to_parent(root_fd: int, parts: list[bytes], *, create: bool, owner: tuple[int, int] | None) -> int:
    """Descriptor of the directory holding the last component, every parent opened O_NOFOLLOW (created if asked)."""
    root_dev = os.fstat(root_fd).st_dev
    cur = os.dup(root_fd)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                nxt = os.open(part, _DIR_PATH, dir_fd=cur)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=cur)
                    if owner is not None:
                        os.chown(part, *owner, dir_fd=cur, follow_symlinks=False)
                nxt = os.open(part, _DIR_PATH, dir_fd=cur)
            except OSError as exc:
                where = b"/".join(parts[: i + 1])
                try:
                    is_link = stat.S_ISLNK(os.stat(part, dir_fd=cur, follow_symlinks=False).st_mode)
                except OSError:
                    is_link = False
                if is_link:
                    raise Refused(where, "a symbolic link (links are never followed)") from None
                raise _refusal(where, exc) from None
            st = os.fstat(nxt)
            if not stat.S_ISDIR(st.st_mode) or st.st_dev != root_dev:
                os.close(nxt)
                raise Refused(b"/".join(parts[: i + 1]), "not a directory on the workspace's file system")
            os.close(cur)
            cur = nxt
        return cur
    except BaseException:
        os.close(cur)
        raise


def lookup(root_fd: int, rel: str | bytes) -> int:
    """An O_PATH|O_NOFOLLOW descriptor of `rel` beneath the root (the entry itself, whatever its type).

    Raises FileNotFoundError if it does not exist, Refused if the way there is not plain directories."""
    parts = _components(rel)
    raw = b"/".join(parts)
    if openat2_available():
        try:
            return _openat2_raw(root_fd, raw, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, 0)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno == errno.EAGAIN:  # a rename raced the lookup; the walk below settles it
                pass
            else:
                raise _refusal(raw, exc) from None
    parent = _walk_to_parent(root_fd, parts, create=False, owner=None)
    with opened(parent):
        try:
            return os.open(parts[-1], _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _refusal(raw, exc) from None


def _reopen(path_fd: int, flags: int) -> int:
    """A real descriptor for the inode an O_PATH descriptor names (no second path lookup, so no race)."""
    return os.open(f"/proc/self/fd/{path_fd}", flags | os.O_CLOEXEC | os.O_NOCTTY)


def describe(st: os.stat_result) -> str:
    mode = st.st_mode
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(
    root_fd: int, rel: str | bytes, *, max_bytes: int | None = None, allow_hardlinks: bool = False
) -> tuple[int, os.stat_result]:
    """A read-only descriptor of a regular file beneath the root, and its stat. Refused for anything else."""
    with opened(lookup(root_fd, rel)) as pfd:
        return _checked_reopen(pfd, _as_bytes(rel), max_bytes=max_bytes, allow_hardlinks=allow_hardlinks)


def _checked_reopen(
    pfd: int, rel: bytes, *, max_bytes: int | None, allow_hardlinks: bool
) -> tuple[int, os.stat_result]:
    st = os.fstat(pfd)
    if not stat.S_ISREG(st.st_mode):
        raise Refused(rel, f"{describe(st)}, not a regular file")
    if st.st_nlink > 1 and not allow_hardlinks:
        raise Refused(rel, f"a hard link ({st.st_nlink} names for one file); refused")
    if max_bytes is not None and st.st_size > max_bytes:
        raise TooLarge(rel, f"{st.st_size} bytes, more than the limit of {max_bytes}", st.st_size)
    fd = _reopen(pfd, os.O_RDONLY)
    st2 = os.fstat(fd)
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):  # cannot happen through /proc/self/fd; checked anyway
        os.close(fd)
        raise Refused(rel, "changed while being opened")
    return fd, st


def iter_fd(fd: int, *, max_bytes: int, rel: bytes | str = b"") -> Iterator[bytes]:
    """Stream a descriptor's content in chunks, never more than `max_bytes` in all (TooLarge beyond)."""
    total = 0
    while True:
        chunk = os.read(fd, min(CHUNK, max_bytes + 1 - total))
        if not chunk:
            return
        total += len(chunk)
        if total > max_bytes:
            raise TooLarge(rel, f"more than the limit of {max_bytes} bytes")
        yield chunk


def read_bytes(root: Path | int, rel: str | bytes, *, max_bytes: int, allow_hardlinks: bool = False) -> bytes:
    """The content of a regular file beneath `root`, at most `max_bytes` (TooLarge beyond, never read whole)."""
    root_fd = root if isinstance(root, int) else open_root(root)
    try:
        fd, _st = open_regular(root_fd, rel, max_bytes=max_bytes, allow_hardlinks=allow_hardlinks)
        with opened(fd):
            return b"".join(iter_fd(fd, max_bytes=max_bytes, rel=_as_bytes(rel)))
    finally:
        if not isinstance(root, int):
            os.close(root_fd)


# ---------------------------------------------------------------------------------------------- writing


def make_dirs(root_fd: int, rel: str | bytes, *, owner: tuple[int, int] | None = None) -> None:
    """Create `rel` and its missing parents as plain directories beneath the root (never through a link)."""
    parts = _components(rel)
    parent = _walk_to_parent(root_fd, [*parts, b"x"], create=True, owner=owner)
    os.close(parent)


def write_file(
    root_fd: int,
    rel: str | bytes,
    chunks: Iterable[bytes],
    *,
    mode: int = 0o644,
    owner: tuple[int, int] | None = None,
    exclusive: bool = False,
) -> int:
    """Write a regular file beneath the root (parents created), replacing only a regular file. Returns its size.

    Refused if any component is a link or the existing entry is anything but a single-link regular file, so a
    write can never land outside the root or in another file that shares the inode."""
    parts = _components(rel)
    raw = b"/".join(parts)
    parent = _walk_to_parent(root_fd, parts, create=True, owner=owner)
    with opened(parent):
        name = parts[-1]
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if exclusive:
                raise Refused(raw, "already exists")
            if not stat.S_ISREG(st.st_mode):
                raise Refused(raw, f"{describe(st)} is in the way; refused to write through or over it")
            if st.st_nlink > 1:
                raise Refused(raw, "a hard link; refused to write into a file that has other names")
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
        flags |= os.O_EXCL if st is None else os.O_TRUNC
        try:
            fd = os.open(name, flags, 0o600, dir_fd=parent)
        except OSError as exc:
            raise _refusal(raw, exc) from None
        with opened(fd):
            fst = os.fstat(fd)
            if not stat.S_ISREG(fst.st_mode) or fst.st_nlink != 1:
                raise Refused(raw, "not a single regular file after opening")
            size = 0
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                    size += n
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, *owner)
        return size


def create_file(root_fd: int, rel: str | bytes, *, mode: int = 0o644, owner: tuple[int, int] | None = None) -> int:
    """A write descriptor of a new regular file beneath the root (parents made; nothing may exist there yet)."""
    parts = _components(rel)
    raw = b"/".join(parts)
    parent = _walk_to_parent(root_fd, parts, create=True, owner=owner)
    with opened(parent):
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
        try:
            fd = os.open(parts[-1], flags, 0o600, dir_fd=parent)
        except FileExistsError:
            raise Refused(raw, "already exists") from None
        except OSError as exc:
            raise _refusal(raw, exc) from None
        try:
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, *owner)
        except BaseException:
            os.close(fd)
            raise
        return fd


def symlink(root_fd: int, rel: str | bytes, target: bytes, *, owner: tuple[int, int] | None = None) -> None:
    """Create a symbolic link beneath the root. The host never follows it; it exists for the sandbox's sake."""
    parts = _components(rel)
    parent = _walk_to_parent(root_fd, parts, create=True, owner=owner)
    with opened(parent):
        os.symlink(target, parts[-1], dir_fd=parent)
        if owner is not None:
            os.chown(parts[-1], *owner, dir_fd=parent, follow_symlinks=False)


def remove(root_fd: int, rel: str | bytes) -> bool:
    """Remove the entry `rel` (a directory with everything in it) without following links. False if absent."""
    parts = _components(rel)
    try:
        parent = _walk_to_parent(root_fd, parts, create=False, owner=None)
    except FileNotFoundError:
        return False
    with opened(parent):
        try:
            st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            _rmtree_at(parent, parts[-1])
        else:
            os.unlink(parts[-1], dir_fd=parent)
        return True


def _rmtree_at(parent_fd: int, name: bytes) -> None:
    fd = os.open(name, _DIR_READ, dir_fd=parent_fd)
    with opened(fd):
        for child, st in entries(fd):
            if stat.S_ISDIR(st.st_mode):
                _rmtree_at(fd, child)
            else:
                os.unlink(child, dir_fd=fd)
    os.rmdir(name, dir_fd=parent_fd)


def delete_tree(root: Path) -> None:
    """Delete a tree a sandbox wrote (a workspace, a prepared environment) completely, never following a link.

    A sandbox may have taken its own directories' permissions away (`chmod 500`, `chmod 000`). Root ignores that,
    but a worker that is not root (and whose sandbox runs as itself) has no override: `shutil.rmtree` then leaves
    those directories and everything below them on disk for good. So when a first pass leaves something, each
    directory is given back to its owner (u+rwx, through an O_PATH descriptor: a link is never followed) and the
    tree is deleted again. Errors beyond that are ignored, as shutil.rmtree(ignore_errors=True) does."""
    root = Path(root)
    shutil.rmtree(root, ignore_errors=True)
    if not os.path.lexists(root):
        return
    with contextlib.suppress(OSError):
        _grant_dir(None, os.fsencode(root))
    shutil.rmtree(root, ignore_errors=True)


def _grant_dir(parent_fd: int | None, name: bytes) -> None:
    """Give directory `name` (beneath `parent_fd`) u+rwx, then every directory below it."""
    path_fd = os.open(name, _DIR_PATH, dir_fd=parent_fd)  # O_NOFOLLOW: a link here is not a directory
    with opened(path_fd):
        mode = stat.S_IMODE(os.fstat(path_fd).st_mode)
        if mode & 0o700 != 0o700:
            os.chmod(f"/proc/self/fd/{path_fd}", mode | 0o700)  # the directory the descriptor holds, nothing else
        # Reopened for listing through the descriptor's own magic link (which names that directory and no path).
        with opened(os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)) as fd:
            for child, st in entries(fd):
                if stat.S_ISDIR(st.st_mode):
                    with contextlib.suppress(OSError):
                        _grant_dir(fd, child)


def chown_tree(root: Path, owner: tuple[int, int]) -> None:
    """Give a directory tree to `owner` (lchown: links themselves, never their targets)."""
    root_fd = os.open(root, _DIR_READ)
    with opened(root_fd):
        os.fchown(root_fd, *owner)
        _chown_below(root_fd, owner)


def _chown_below(dir_fd: int, owner: tuple[int, int]) -> None:
    for name, st in entries(dir_fd):
        os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            with opened(os.open(name, _DIR_READ, dir_fd=dir_fd)) as sub:
                _chown_below(sub, owner)


# ---------------------------------------------------------------------------------------------- walking


def entries(dir_fd: int) -> list[tuple[bytes, os.stat_result]]:
    """(name, lstat) of every entry of an open directory, sorted by name (bytes, as git sorts)."""
    out = []
    with os.scandir(dir_fd) as it:
        for e in it:
            name = os.fsencode(e.name)
            try:
                out.append((name, os.stat(name, dir_fd=dir_fd, follow_symlinks=False)))
            except FileNotFoundError:
                continue
    out.sort()
    return out


def open_subdir(dir_fd: int, name: bytes, expect: os.stat_result) -> int:
    """Open a child directory for listing, refusing it if it is not the directory `expect` described."""
    fd = os.open(name, _DIR_READ, dir_fd=dir_fd)
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (expect.st_dev, expect.st_ino):
        os.close(fd)
        raise Refused(name, "replaced while being read")
    return fd


def open_child_regular(
    dir_fd: int, name: bytes, *, max_bytes: int | None, allow_hardlinks: bool, rel: bytes
) -> tuple[int, os.stat_result]:
    """Like `open_regular` for one entry of an already-open directory."""
    try:
        pfd = os.open(name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise _refusal(rel, exc) from None
    with opened(pfd):
        return _checked_reopen(pfd, rel, max_bytes=max_bytes, allow_hardlinks=allow_hardlinks)


def readlink_child(dir_fd: int, name: bytes, *, max_bytes: int = 4096) -> bytes:
    target = os.readlink(name, dir_fd=dir_fd)
    if len(target) > max_bytes:
        raise TooLarge(name, "symbolic link target too long")
    return target
