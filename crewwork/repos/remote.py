"""Talking to one remote: list refs, resolve a ref, fetch into a mirror, push a branch with compare-and-swap.

A `Remote` is a parsed URL plus the `GitAuth` the operator's credentials give it and the address policy its host
must pass (`crewwork.repos.address`): every command here checks the host again and pins git to the checked
address. Nothing here keeps state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from crewwork.boundary.urls import RepoURL
from crewwork.repos.address import RemoteAddressPolicy, pinned_invocation
from crewwork.repos.credentials import GitAuth
from crewwork.repos.git import (
    GitOutput,
    LocalRepositoryRefused,
    PushRejected,
    RemoteError,
    RemoteNotFound,
    classify,
    is_sha,
    protocol_of,
    run_git,
)
from crewwork.repos.local import Confined, UnsafeLocalRepository, local_git_dir, local_server

HEADS_AND_TAGS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")


@dataclass(frozen=True)
class Remote:
    url: RepoURL
    auth: GitAuth = field(default_factory=GitAuth)
    timeout_s: float = 600.0
    fsck: bool = True
    address: RemoteAddressPolicy = field(default_factory=RemoteAddressPolicy)
    """Where the host may be reached: public addresses only unless the operator's allowlist says otherwise."""

    @property
    def name(self) -> str:
        """How messages name the remote (normalised, credential-free)."""
        return self.url.url

    def _local(self, args: tuple[str, ...]) -> tuple[tuple[str, ...], Confined | None]:
        """`args` for a local repository: its URL replaced by its checked git directory (crewwork.repos.local,
        checked again now: the tenant may have changed it since the submission), and the git server command that
        runs in it (upload-pack, receive-pack) started with the repository's config switched off where it could
        make the host run something (its hooks, fsmonitor, filters of a work-tree update), confined to the git
        directory where the host can."""
        try:
            git_dir = local_git_dir(self.url.local_path)
            args = tuple(str(git_dir) if a == self.url.url else a for a in args)
            name = {"fetch": "upload-pack", "ls-remote": "upload-pack", "push": "receive-pack"}.get(args[0])
            if name is None:
                return args, None
            command, confined = local_server(name, git_dir, writable=name == "receive-pack")
        except UnsafeLocalRepository as exc:
            raise LocalRepositoryRefused(f"repository {self.name}: {exc}", self.name) from None
        return (args[0], f"--{name}={command}", *args[1:]), confined

    async def git(
        self, *args: str, cwd: Path | str, timeout_s: float | None = None, git_dir: Path | None = None
    ) -> GitOutput:
        """Run a git command that talks to this remote (its URL among `args` as `self.url.url`). The host is checked
        first, each time (RemoteAddressRefused, before any process starts), and git connects to the checked
        address only. A local repository is checked again, each time, and git is given its git directory."""
        confined = None
        if self.url.is_local:
            args, confined = self._local(args)
        try:
            pin = await self.address.pin(self.url)
            argv, config, env = pinned_invocation(pin, self.url, self.auth, args)
            return await run_git(
                argv,
                cwd=cwd,
                git_dir=git_dir,
                auth=self.auth,
                scheme=protocol_of(self.url),
                timeout_s=timeout_s or self.timeout_s,
                fsck=self.fsck,
                config=config,
                env=env,
                pass_fds=confined.fds if confined is not None else (),
            )
        finally:
            if confined is not None:
                confined.close()

    async def ls_remote(self, *patterns: str, cwd: Path | str = "/", timeout_s: float | None = None) -> dict[str, str]:
        """ref -> object id of the remote's refs matching `patterns` (all refs when none)."""
        res = await self.git("ls-remote", "--", self.url.url, *patterns, cwd=cwd, timeout_s=timeout_s)
        if res.code != 0:
            raise classify(res.err, self.name, "listing refs of")
        refs: dict[str, str] = {}
        for line in res.out.splitlines():
            sha, _, ref = line.partition("\t")
            if ref and is_sha(sha):
                refs[ref] = sha
        return refs

    async def resolve(self, ref: str, *, timeout_s: float | None = None) -> str:
        """The commit `ref` names on the remote (a branch, a tag, HEAD or a full ref). A commit id is returned
        as is: servers do not say whether they have an arbitrary commit until it is fetched."""
        if is_sha(ref):
            return ref
        if ref == "HEAD":
            wanted = ["HEAD"]
        elif ref.startswith("refs/"):
            wanted = [ref, f"{ref}^{{}}"]
        else:
            wanted = [f"refs/heads/{ref}", f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}"]
        refs = await self.ls_remote(*[w.removesuffix("^{}") for w in wanted], timeout_s=timeout_s)
        if ref.startswith("refs/") and f"{ref}^{{}}" in refs:
            return refs[f"{ref}^{{}}"]
        for w in wanted:
            if w in refs:
                return refs[w]
        raise RemoteNotFound(f"ref {ref!r} does not exist in {self.name}", self.name)

    async def fetch(self, gitdir: Path, *refspecs: str, prune: bool = False) -> None:
        args = ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-auto-gc"]
        if prune:
            args.append("--prune")
        res = await self.git(*args, "--", self.url.url, *(refspecs or HEADS_AND_TAGS), cwd=gitdir, git_dir=gitdir)
        if res.code != 0:
            raise classify(res.err, self.name, "fetching from")

    async def push_branch(self, gitdir: Path, commit: str, branch: str, expected_old: str | None) -> str:
        """Point `refs/heads/<branch>` on the remote at `commit`, only if it is now `expected_old` (None: only if
        it does not exist). The server checks this under its ref lock, so a concurrent writer is detected, never
        overwritten. Returns the remote's porcelain status line; raises PushRejected with the remote's message."""
        return await self.push_ref(gitdir, commit, f"refs/heads/{branch}", expected_old)

    async def push_ref(self, gitdir: Path, commit: str, ref: str, expected_old: str | None) -> str:
        """`push_branch` for any full ref name (a delivery branch, an evidence notes ref)."""
        lease = f"--force-with-lease={ref}:{expected_old or ''}"
        res = await self.git(
            "push",
            "--porcelain",
            "--no-verify",
            lease,
            "--",
            self.url.url,
            f"{commit}:{ref}",
            cwd=gitdir,
            git_dir=gitdir,
        )
        status = [ln for ln in res.out.splitlines() if ln.startswith(("=", "*", "+", " ", "!", "-"))]
        rejected = [ln for ln in status if ln.startswith("!")]
        if res.code == 0 and not rejected:
            return status[0] if status else ""
        if rejected or "rejected" in res.err or "stale info" in res.err:
            remote_msg = (
                "; ".join([*(ln.split("\t", 2)[-1] for ln in rejected), *_remote_lines(res.err)])
                or res.err.strip()[-1500:]
            )
            raise PushRejected(f"{self.name} rejected the push of {ref}: {remote_msg}", self.name)
        err = classify(res.err, self.name, f"pushing {ref} to")
        raise err


def _remote_lines(err: str) -> list[str]:
    """What the server said (`remote: ...` lines and `! [rejected]` lines), for a rejection's message."""
    out = []
    for ln in err.splitlines():
        s = ln.strip()
        if s.startswith("remote:") and s[7:].strip():
            out.append(s)
        elif s.startswith("! ") or "[rejected]" in s or "[remote rejected]" in s:
            out.append(s)
    return out[-6:]


__all__ = ["HEADS_AND_TAGS", "PushRejected", "Remote", "RemoteError", "RemoteNotFound"]
