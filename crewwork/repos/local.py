"""Local repositories as host git may read them: the one git directory of the registered path, and nothing it points to.

A local repository is a directory the tenant controls, and git follows what such a directory says about where its
data is: `objects/info/alternates` (objects of another repository, served as the tenant's own), a `.git` *file*
(`gitdir: /elsewhere`, as in a linked worktree or a submodule checkout), a `commondir` file (refs and objects of
another git directory), a `.git` inside the git directory (which `upload-pack` tries before the directory itself),
and symlinks anywhere in the git directory (`objects`, `refs`, `packed-refs`, a pack file) that lead out of it. None of them is a
symlink on the *path* the root check resolves, so each would let a repository under one tenant's root serve another
tenant's repository (or any repository the service can read).

`local_git_dir` refuses every such redirect, and returns the git directory host git is then given (never the
repository path, from which git would discover one): the registered path's `.git` directory, or the path itself
for a bare repository. The rule needs no tenant's roots, so the same check runs at registration, at every
submission and before every host git process on the repository (`crewwork.repos.remote.Remote.git`).

Where the host can (bubblewrap), the git processes that read the repository run confined to that git directory
(`confine`), so a redirect planted between the last check and git opening the repository names nothing.

What the repository's own config could make the host run is switched off separately (`LOCAL_SERVER_CONFIG`): git
strips the client's `-c` options from the `upload-pack` and `receive-pack` it starts on a local path, so they are
given again on those commands' own command lines.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("crewwork.repos.local")


class UnsafeLocalRepository(ValueError):
    """The local repository would make git read data outside its own directory; the message names what."""


# `-c` options for the git server commands (`upload-pack`, `receive-pack`) started in a local repository: command
# line config outranks the repository's own, which the tenant writes.
LOCAL_SERVER_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    # Run by receive-pack's connectivity check on every push (`rev-list --alternate-refs`: the repository's own
    # objects count as an alternate of the quarantine), alternates file or not. `true` lists no refs.
    "core.alternateRefsCommand=true",
    # updateInstead would check the pushed commit out in the tenant's work tree: clean/smudge filters and the
    # fsmonitor of the tenant's config would run on the host.
    "receive.denyCurrentBranch=refuse",
    "receive.denyDeleteCurrent=refuse",
    "receive.autogc=false",
    "receive.updateServerInfo=false",
    "gc.auto=0",
    "maintenance.auto=false",
)

# Files that name another place git reads objects or refs from.
_REDIRECTS = {
    "commondir": "a `commondir` file (git would take refs and objects from the directory it names)",
    "objects/info/alternates": "`objects/info/alternates` (git would serve the objects of the repositories it "
    "names as this repository's)",
    "objects/info/http-alternates": "`objects/info/http-alternates` (git would fetch objects from the places it names)",
}
# Enough to refuse a pathological repository without walking it all; a real git directory has far fewer entries
# outside its loose objects, and loose objects are counted too.
MAX_ENTRIES = 2_000_000


@dataclass
class Confined:
    """How to run a git command on a checked local git directory: `argv` (prepended to `git ...`; empty when this
    host cannot confine) and the file descriptors it must inherit, closed by `close()`."""

    argv: list[str]
    fds: tuple[int, ...] = ()

    def close(self) -> None:
        fds, self.fds = self.fds, ()
        for fd in fds:
            os.close(fd)


def confine(git_dir: Path, *, writable: bool) -> Confined:
    """Confinement for a git process on the checked `git_dir`, where this host can (bubblewrap, with unprivileged
    namespaces): a mount namespace holding the system directories and the git directory only, bound by a descriptor
    opened without following symlinks, and no network. There, whatever the git directory came to say between the
    check and now (alternates, a symlink, a redirect) names nothing: no other repository exists. Without
    bubblewrap, the checks alone (`local_git_dir`, just before) stand, and a change in the moment between them and
    git opening the repository is not seen."""
    bwrap = _bwrap()
    if bwrap is None:
        return Confined([])
    try:
        fd = os.open(git_dir, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise UnsafeLocalRepository(f"the git directory cannot be opened as a directory ({exc.strerror})") from None
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != str(git_dir):
            raise UnsafeLocalRepository("the git directory now leads elsewhere (a symlink on the way)")
        os.set_inheritable(fd, True)
    except BaseException:
        os.close(fd)
        raise
    bind = "--bind-fd" if writable else "--ro-bind-fd"
    return Confined([bwrap, *_CONFINE, bind, str(fd), str(git_dir), "--"], (fd,))


def local_server(name: str, git_dir: Path, *, writable: bool) -> tuple[str, Confined]:
    """The `--upload-pack` / `--receive-pack` value that starts git server command `name` in the checked `git_dir`
    with `LOCAL_SERVER_CONFIG`, confined (`confine`), and the confinement to close when git is done."""
    confined = confine(git_dir, writable=writable)
    argv = [*confined.argv, "git", *(arg for kv in LOCAL_SERVER_CONFIG for arg in ("-c", kv)), name]
    return shlex.join(argv), confined


_CONFINE: list[str] = ["--unshare-all", "--die-with-parent", "--new-session", "--dev", "/dev"]
for _d in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
    if os.path.islink(_d):
        _CONFINE += ["--symlink", os.readlink(_d), _d]
    elif os.path.isdir(_d):
        _CONFINE += ["--ro-bind", _d, _d]


@functools.cache
def _bwrap() -> str | None:
    """bubblewrap, when it can make the namespaces here and git runs in them (probed once per process)."""
    exe = shutil.which("bwrap")
    if exe is None:
        log.warning("bwrap not found: local repositories are read by git unconfined (checks only)")
        return None
    try:
        res = subprocess.run(
            [exe, *_CONFINE, "--", "git", "--version"], capture_output=True, timeout=30, env={"PATH": os.defpath}
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("bwrap does not run (%s): local repositories are read by git unconfined (checks only)", exc)
        return None
    if res.returncode != 0:
        log.warning(
            "bwrap cannot confine git here (%s): local repositories are read by git unconfined (checks only)",
            res.stderr.decode(errors="replace").strip()[-300:],
        )
        return None
    return exe


def local_git_dir(repo: Path | str) -> Path:
    """The git directory of the local repository `repo` (an absolute, already resolved path), after checking that
    git reading it reads nothing outside `repo`. Raises UnsafeLocalRepository naming the problem."""
    repo = Path(repo)
    if not repo.is_absolute():
        raise UnsafeLocalRepository("not an absolute path")
    real = Path(os.path.realpath(repo))
    if real != repo:
        raise UnsafeLocalRepository("the path now leads elsewhere (a symlink on the way)")
    if not repo.is_dir():
        raise UnsafeLocalRepository("not a directory")
    dotgit = repo / ".git"
    if os.path.lexists(dotgit):
        if dotgit.is_symlink():
            raise UnsafeLocalRepository("`.git` is a symlink; git would read the repository it points to")
        if not dotgit.is_dir():
            raise UnsafeLocalRepository(
                "`.git` is a file, not a directory: a `gitdir:` redirect (a linked worktree or a submodule "
                "checkout) makes git read the repository it names; register that repository itself"
            )
        git_dir = dotgit
        # upload-pack, given the git directory, tries `<dir>/.git` before the directory itself.
        if os.path.lexists(git_dir / ".git"):
            raise UnsafeLocalRepository("`.git/.git` exists; git would read it instead of `.git`")
    else:
        git_dir = repo
    # When the directory is not a valid git directory (a HEAD git cannot read), upload-pack goes on to
    # `<dir>.git/.git` and `<dir>.git`.
    sibling = Path(f"{git_dir}.git")
    if os.path.lexists(sibling):
        raise UnsafeLocalRepository(
            f"`{sibling.relative_to(repo) if sibling.is_relative_to(repo) else sibling.name}` exists next to the git "
            "directory; git would read it if the git directory were not valid"
        )
    prefix = "" if git_dir == repo else ".git/"
    for rel, what in _REDIRECTS.items():
        if os.path.lexists(git_dir / rel):
            raise UnsafeLocalRepository(f"the git directory has {what.replace('`', '`' + prefix, 1)}; refused")
    _check_symlinks(git_dir, prefix)
    if not ((git_dir / "HEAD").is_file() and (git_dir / "objects").is_dir() and (git_dir / "refs").is_dir()):
        raise UnsafeLocalRepository("not a git repository")
    if not _valid_head(git_dir / "HEAD"):
        raise UnsafeLocalRepository(f"`{prefix}HEAD` is neither a symbolic ref nor an object id")
    return git_dir


_HEAD = re.compile(rb"^(ref: refs/\S+|[0-9a-f]{40}|[0-9a-f]{64})\s*$")


def _valid_head(head: Path) -> bool:
    """HEAD as git accepts it (else git would not take the directory as a git directory, and look elsewhere)."""
    try:
        with open(head, "rb") as f:
            text = f.read(4096)
    except OSError:
        return False
    return bool(_HEAD.match(text))


def _check_symlinks(git_dir: Path, prefix: str) -> None:
    """Every symlink in `git_dir` (at any depth) must resolve inside `git_dir`. Symlinks are not followed: what one
    points to is inside, so it is walked where it is."""
    seen = 0
    stack = [git_dir]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError as exc:
            rel = d.relative_to(git_dir)
            raise UnsafeLocalRepository(f"`{prefix}{rel}` cannot be read: {exc.strerror}") from None
        with it:
            for entry in it:
                seen += 1
                if seen > MAX_ENTRIES:
                    raise UnsafeLocalRepository(f"the git directory has more than {MAX_ENTRIES} entries")
                if entry.is_symlink():
                    target = Path(os.path.realpath(entry.path))
                    if not target.is_relative_to(git_dir):
                        # Where it leads is not shown: it may be another tenant's.
                        rel = Path(entry.path).relative_to(git_dir)
                        raise UnsafeLocalRepository(
                            f"`{prefix}{rel}` is a symlink that leads out of the git directory; git would read what "
                            "it points to as this repository's"
                        )
                elif entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
