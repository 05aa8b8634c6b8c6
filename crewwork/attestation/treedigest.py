"""The sha256 of a git tree's content: "crewwork tree digest v1".

Git names trees by SHA-1 (in most repositories), whose collisions are practical; a signed statement about a landed
change names its tree by this digest as well, which depends on every file's bytes through SHA-256 only:

    for each entry of the tree, recursively, sorted by the path's bytes:
        line = MODE + " " + sha256(CONTENT) in hex + " " + PATH + NUL
    digest = sha256(all lines, concatenated)

MODE is git's (`100644`, `100755`, `120000` for a symbolic link, whose CONTENT is its target, `160000` for a
submodule, whose CONTENT is the commit id in hex). docs/evidence.md has a standalone version of this function, so a
verifier needs neither crewwork nor trust in it.

Git runs with `--git-dir` (never discovering a repository from a directory), without system or global config, and
only plumbing that reads objects (`ls-tree`, `cat-file`, `rev-parse`; never `show` or `log`, which run the
`gpg.program` a repository's config names to check a signature): nothing a repository's config names runs, and its
replace refs are ignored.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from crewwork.boundary import hostproc

_GIT = ["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "protocol.allow=never"]


def git_env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        # The objects themselves: a repository's replace refs never stand in for them, and nothing is fetched for
        # a missing one from a promisor remote its config names.
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_NO_LAZY_FETCH": "1",
        "LC_ALL": "C",
    }


class TreeDigestError(RuntimeError):
    """The tree cannot be read (missing objects, not a tree, git failed); the message says which."""


@dataclass(frozen=True)
class TreeDigest:
    tree: str
    """Git's id of the tree."""
    sha256: str
    files: int


def git(git_dir: Path, *args: str, input_bytes: bytes | None = None, timeout_s: float = 120) -> bytes:
    res = subprocess.run(
        hostproc.bounded([*_GIT, f"--git-dir={git_dir}", *args], hostproc.Profile.GIT),
        input=input_bytes,
        capture_output=True,
        env=git_env(),
        timeout=timeout_s,
        check=False,
    )
    if res.returncode != 0:
        raise TreeDigestError(f"git {args[0]} failed: {res.stderr.decode(errors='replace').strip()[-500:]}")
    return res.stdout


def commit_info(git_dir: Path, commit: str) -> tuple[str, list[str], int]:
    """(tree, parents, committer time) of `commit`, read with `cat-file` (plumbing: no signature check, so no
    `gpg.program` runs)."""
    if commit.startswith("-"):
        raise TreeDigestError(f"{commit!r} is not an object name")
    raw = git(git_dir, "cat-file", "commit", commit)
    header = raw.split(b"\n\n", 1)[0].decode(errors="replace").split("\n")
    tree = next((line[5:] for line in header if line.startswith("tree ")), "")
    parents = [line[7:] for line in header if line.startswith("parent ")]
    committer = next((line for line in header if line.startswith("committer ")), "")
    try:
        when = int(committer.rsplit(" ", 2)[-2])
    except (IndexError, ValueError):
        when = 0
    return tree, parents, when


def tree_digest(git_dir: Path, treeish: str) -> TreeDigest:
    """The crewwork tree digest v1 of `treeish` (a commit or tree id) in the repository at `git_dir`."""
    if treeish.startswith("-"):
        raise TreeDigestError(f"{treeish!r} is not an object name")
    tree = git(git_dir, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{treeish}^{{tree}}").decode().strip()
    listing = git(git_dir, "ls-tree", "-r", "-z", "--full-tree", tree)
    entries: list[tuple[bytes, str, str, str]] = []  # (path, mode, type, object id)
    for record in listing.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, kind, oid = meta.decode().split(" ")
        entries.append((path, mode, kind, oid))
    blobs = [oid for _, _, kind, oid in entries if kind == "blob"]
    digests = _blob_digests(git_dir, blobs)
    h = hashlib.sha256()
    for path, mode, kind, oid in sorted(entries):
        content = digests[oid] if kind == "blob" else hashlib.sha256(oid.encode()).hexdigest()
        h.update(f"{mode} {content} ".encode() + path + b"\0")
    return TreeDigest(tree=tree, sha256=h.hexdigest(), files=len(entries))


def _blob_digests(git_dir: Path, oids: list[str]) -> dict[str, str]:
    """sha256 of each blob's content, streamed through one `git cat-file --batch`."""
    out: dict[str, str] = {}
    wanted = list(dict.fromkeys(oids))
    if not wanted:
        return out
    proc = subprocess.Popen(
        hostproc.bounded([*_GIT, f"--git-dir={git_dir}", "cat-file", "--batch"], hostproc.Profile.GIT),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=git_env(),
    )
    assert proc.stdin is not None and proc.stdout is not None

    def feed() -> None:
        try:
            for oid in wanted:
                proc.stdin.write(oid.encode() + b"\n")  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    try:
        for oid in wanted:
            header = proc.stdout.readline().split()
            if len(header) != 3 or header[1] != b"blob":
                raise TreeDigestError(f"object {oid} is missing or not a blob ({b' '.join(header).decode()!r})")
            size = int(header[2])
            h = hashlib.sha256()
            left = size
            while left:
                chunk = proc.stdout.read(min(left, 1 << 20))
                if not chunk:
                    raise TreeDigestError(f"git cat-file ended inside object {oid}")
                h.update(chunk)
                left -= len(chunk)
            proc.stdout.read(1)  # the newline after the content
            out[oid] = h.hexdigest()
    finally:
        proc.stdout.close()
        proc.kill()
        proc.wait()
        writer.join(5)
    return out
