"""Host-side git for talking to remotes and keeping mirrors: hardened invocations, typed and redacted errors.

Every command runs with an explicit environment built here (PATH, an empty HOME, no system or global config, no
terminal prompts, no trace variables inherited from the worker) plus the remote's `GitAuth`, and with `-c` options
that switch off what a hostile remote or repository could use: hooks, protocol helpers other than the one in use,
redirects, submodule recursion, automatic gc. Error text is masked (`GitAuth.redact`) before it is raised.

The containment-hardened workspace operations (private git directories, trees, diffs) stay in `crewwork.workspace.gitops`;
this module is the network half and the mirror's own bookkeeping. Commands on a mirror name it with `--git-dir`, so
git never discovers a repository from a directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from crewwork.boundary import hostproc
from crewwork.boundary.urls import RepoURL, redact_url
from crewwork.repos.credentials import GitAuth
from crewwork.workspace import childio

# Environment variables host git may inherit from the worker; everything else is dropped (GIT_TRACE_CURL would
# log headers, GIT_SSH/GIT_ASKPASS/SSH_AUTH_SOCK would bring the operator's own identity, GIT_DIR would redirect).
# No proxy variables (http_proxy, HTTPS_PROXY, ALL_PROXY, no_proxy): a proxy resolves and connects on its own, so
# the address crewwork checked and pinned (crewwork.repos.address) would not be the one connected to.
_INHERIT = ("PATH", "TMPDIR", "SYSTEMROOT")
_EMPTY_HOME = Path(tempfile.gettempdir()) / "crewwork-git-home"

IDENTITY = {
    "GIT_AUTHOR_NAME": "crewwork",
    "GIT_AUTHOR_EMAIL": "crewwork@localhost",
    "GIT_COMMITTER_NAME": "crewwork",
    "GIT_COMMITTER_EMAIL": "crewwork@localhost",
}


class RemoteError(RuntimeError):
    """A remote git operation failed. Subclasses say whether retrying can help. Messages are redacted."""

    retryable = False

    def __init__(self, message: str, remote: str = "") -> None:
        super().__init__(message)
        self.remote = remote


class RemoteUnavailable(RemoteError):
    """The remote could not be reached or broke off (network, DNS, timeout, server error): retrying may help."""

    retryable = True


class RemoteAccessDenied(RemoteError):
    """Authentication or authorization failed, or the server's host key is not the known one."""


class RemoteNotFound(RemoteError):
    """The repository, ref or commit does not exist on the remote."""


class PushRejected(RemoteError):
    """The remote refused a push (compare-and-swap lost, hook or protection rule); carries its message."""


class LocalRepositoryRefused(RemoteError):
    """A local repository makes git read outside its own git directory (alternates, a `gitdir:` or `commondir`
    redirect, a symlink out of it: crewwork.repos.local). Nothing was run in it. Not retried: it is policy."""


class RemoteAddressRefused(RemoteError):
    """The remote's host is, or resolves to, an address the operator does not let host git connect to (loopback,
    private, link-local, ...; CREWWORK_REPO_ALLOW_NETWORKS). Nothing was sent to it. Not retried: it is policy."""


# Without an ssh credential: no config, no agent, and no host is known, so every ssh server is refused.
DEFAULT_SSH_COMMAND = (
    "ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=yes "
    "-o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile=/dev/null"
)


@dataclass
class GitOutput:
    code: int
    out: str
    err: str


def git_env(auth: GitAuth | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    _EMPTY_HOME.mkdir(mode=0o700, exist_ok=True)
    env = {k: v for k in _INHERIT if (v := os.environ.get(k)) is not None}
    env.update(
        {
            "HOME": str(_EMPTY_HOME),
            "XDG_CONFIG_HOME": str(_EMPTY_HOME),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_ASKPASS": "/bin/false",
            "SSH_ASKPASS": "/bin/false",
            "GIT_PROTOCOL_FROM_USER": "0",
            # No on-demand fetch from a repository's promisor remote (a local repository's config names it).
            "GIT_NO_LAZY_FETCH": "1",
            "GIT_SSH_COMMAND": DEFAULT_SSH_COMMAND,
            "LC_ALL": "C",
            **IDENTITY,
        }
    )
    if auth is not None:
        env.update(auth.env)
    if extra:
        env.update(extra)
    return env


def hardening(scheme: str | None = None, *, fsck: bool = True) -> list[str]:
    """`-c` options for every git command crewwork runs against a mirror or a remote."""
    opts = {
        "core.hooksPath": os.devnull,
        "core.fsmonitor": "false",
        "core.askPass": "/bin/false",
        "credential.helper": "",
        "protocol.allow": "never",
        "http.followRedirects": "false",
        "submodule.recurse": "false",
        "fetch.recurseSubmodules": "false",
        "gc.auto": "0",
        "maintenance.auto": "false",
        "fetch.writeCommitGraph": "false",
        "advice.detachedHead": "false",
        "init.defaultBranch": "main",
    }
    if scheme is not None:
        opts[f"protocol.{scheme}.allow"] = "always"
    if fsck:
        opts["transfer.fsckObjects"] = "true"
    out: list[str] = []
    for k, v in opts.items():
        out += ["-c", f"{k}={v}"]
    return out


def protocol_of(url: RepoURL) -> str:
    """The name git's `protocol.<name>.allow` knows this remote's transport by."""
    return "file" if url.is_local else url.scheme


async def run_git(
    args: Sequence[str],
    *,
    cwd: Path | str,
    auth: GitAuth | None = None,
    scheme: str | None = None,
    timeout_s: float = 600.0,
    input_bytes: bytes | None = None,
    fsck: bool = True,
    env: Mapping[str, str] | None = None,
    git_dir: Path | None = None,
    config: Sequence[str] = (),
    pass_fds: Sequence[int] = (),
    wrap: Sequence[str] = (),
) -> GitOutput:
    """Run git with the hardening options (on `git_dir` when given) and `config` (more `key=value` settings, given
    as `-c`), started through `wrap` (a confinement's argv) with `pass_fds` inherited; output is returned redacted.
    Never raises for a non-zero exit."""
    argv = [
        *wrap,
        "git",
        *hardening(scheme, fsck=fsck),
        *(arg for kv in config for arg in ("-c", kv)),
        *([f"--git-dir={git_dir}"] if git_dir is not None else []),
        *args,
    ]
    proc = await asyncio.create_subprocess_exec(
        # The memory bound first: rlimits are inherited through the confinement and by git's own children
        # (index-pack, remote helpers).
        *hostproc.bounded(argv, hostproc.Profile.GIT),
        cwd=str(cwd),
        env=git_env(auth, env),
        stdin=asyncio.subprocess.PIPE if input_bytes is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    )
    feeding: asyncio.Future[bool] | None = None
    if input_bytes is not None:
        assert proc.stdin is not None
        # Fed here, beside `communicate` (which then only reads and waits), not by it: it writes without looking, and
        # on uvloop a child gone already made that a RuntimeError (crewwork/workspace/childio.py).
        feeding = asyncio.ensure_future(childio.feed_and_close(proc.stdin, input_bytes))
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        _kill(proc)
        await proc.wait()
        return GitOutput(124, "", f"timed out after {timeout_s:.0f} s")
    except asyncio.CancelledError:
        _kill(proc)
        await proc.wait()
        raise
    finally:
        if feeding is not None and not feeding.done():
            # The child has exited (or was killed): nothing is left to feed.
            feeding.cancel()
            with contextlib.suppress(asyncio.CancelledError, *childio.CLOSED_PIPE):
                await feeding
    redact = auth.redact if auth is not None else redact_url
    return GitOutput(proc.returncode or 0, redact(out.decode(errors="replace")), redact(err.decode(errors="replace")))


def _kill(proc: asyncio.subprocess.Process) -> None:
    # The whole session: git's children (ssh, remote-https, index-pack) die with it.
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


_DENIED = (
    "authentication failed",
    "permission denied",
    "host key verification failed",
    "could not read username",
    "could not read password",
    "returned error: 401",
    "returned error: 403",
    "http 401",
    "http 403",
    "access denied",
    "invalid username or password",
    "no such identity",
    "remote host identification has changed",
)
_NOT_FOUND = (
    "couldn't find remote ref",
    "repository not found",
    "not found",
    "does not appear to be a git repository",
    "no such file or directory",
    "not our ref",
    "no such repository",
    "unadvertised object",
    "returned error: 404",
    "no matching remote head",
)
_UNAVAILABLE = (
    "could not resolve host",
    "connection refused",
    "connection timed out",
    "timed out",
    "failed to connect",
    "unable to connect",
    "network is unreachable",
    "no route to host",
    "connection reset",
    "remote end hung up",
    "early eof",
    "returned error: 5",
    "the requested url returned error: 5",
    "couldn't connect",
    "operation timed out",
    "could not read from remote repository",
    "unable to access",
)


def classify(err: str, remote: str, what: str) -> RemoteError:
    """The typed error for a failed remote command, from git's (already redacted) stderr."""
    text = err.strip()
    low = text.lower()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    detail = "; ".join(lines[-4:])[-1500:] or "no message"
    msg = f"{what} {remote} failed: {detail}"
    if any(p in low for p in _DENIED):
        return RemoteAccessDenied(msg, remote)
    if any(p in low for p in _UNAVAILABLE):
        return RemoteUnavailable(msg, remote)
    if any(p in low for p in _NOT_FOUND):
        return RemoteNotFound(msg, remote)
    return RemoteUnavailable(msg, remote)


SHA_RE = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def is_sha(s: str) -> bool:
    return bool(SHA_RE.match(s))
