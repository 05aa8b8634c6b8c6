"""Landing a validated change: commit it on its base in this host's mirror, then push `crewwork/<id>` to the
remote with compare-and-swap.

The push carries `--force-with-lease=refs/heads/crewwork/<id>:` (empty expected value: the branch must not exist),
which the server checks under its own ref lock. So:

- a concurrent writer of the same branch is detected, never overwritten (the push is rejected and the landing
  fails with `LandingConflict`, carrying the remote's message);
- a retried landing whose earlier push went through finds the branch already holding crewwork's commit of the same
  tree on the same parent (see `_is_same_change`), recognises it as its own, and returns it (idempotent; `created` is False);
- the target branch and every other ref are never touched.

Local repositories are just another remote (a path); nothing their config names runs (`receive-pack` is started
with `crewwork.repos.local.LOCAL_SERVER_CONFIG`, confined to the git directory where the host can).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from crewwork.repos.git import IDENTITY, PushRejected, run_git
from crewwork.repos.mirror import MirrorCache
from crewwork.repos.remote import Remote

DELIVERY_PREFIX = "crewwork/"


class LandingConflictError(RuntimeError):
    """The change cannot be landed as it is (the branch holds something else, the push was refused, or the
    change no longer applies). The message is redacted and names the remote."""


@dataclass(frozen=True)
class Landed:
    branch: str
    commit: str
    created: bool
    """False when the branch already held this change (a retried landing)."""
    remote: str


def delivery_branch(work_item_id: str) -> str:
    return f"{DELIVERY_PREFIX}{work_item_id}"


async def land_by_push(
    cache: MirrorCache,
    remote: Remote,
    *,
    work_item_id: str,
    base_commit: str,
    diff: str,
    message: str,
    scratch: Path,
) -> Landed:
    branch = delivery_branch(work_item_id)
    ref = f"refs/heads/{branch}"
    async with cache.using(remote, base_commit) as (gitdir, _stats):
        tree = await _tree_of_change(gitdir, base_commit, diff, scratch)
        commit = await _commit(gitdir, remote, tree, base_commit, message)
        # The push is the check: it creates the branch only where it does not exist (compare-and-swap under the
        # server's ref lock). No `ls-remote` first: that would be one more round trip to the remote on every landing
        # to learn what a rejected push tells us anyway (bench/attempt.py, docs/performance.md). Only where the
        # branch exists is it read: this landing's own earlier try (a retry, or one running alongside) is fine; the
        # change as it was pushed for review on the forge (`push_for_review`) is moved to the landed commit by a
        # second compare-and-swap; anything else there is someone else's, never overwritten.
        expected: str | None = None
        while True:
            try:
                status = await remote.push_branch(gitdir, commit, branch, expected_old=expected)
                break
            except PushRejected as exc:
                current = (await remote.ls_remote(ref)).get(ref)
                if current is None:
                    raise LandingConflictError(str(exc)) from exc
                if await _is_same_change(remote, gitdir, work_item_id, current, tree, base_commit, message):
                    return Landed(branch, current, False, remote.name)
                if (
                    expected is None
                    and await _review_attempt_of(remote, gitdir, work_item_id, current, base_commit) is not None
                ):
                    expected = current
                    continue
                raise LandingConflictError(
                    f"{remote.name} already has {branch} at {current[:12]} with different content; refusing to move it"
                ) from exc
        if status.startswith("="):
            # Already there, the very same commit object (a retry within the same second rebuilds it byte for byte):
            # this landing's own, nothing was pushed.
            return Landed(branch, commit, False, remote.name)
        # Keep the landed commit reachable in the mirror (nothing else refers to it there).
        await run_git(["update-ref", f"refs/crewwork/landed/{work_item_id}", commit], cwd=gitdir, git_dir=gitdir)
        return Landed(branch, commit, True, remote.name)


async def _commit(gitdir: Path, remote: Remote, tree: str, parent: str, message: str) -> str:
    res = await run_git(["commit-tree", tree, "-p", parent, "-F", "-"], cwd=gitdir, input_bytes=message.encode())
    commit = res.out.strip()
    if res.code != 0 or not commit:
        raise RuntimeError(f"git commit-tree failed in the mirror of {remote.name}: {res.err.strip()}")
    return commit


# ---------------------------------------------------------------------------------------------------------------
# Review on the forge: before an item lands, the attempt awaiting review is pushed to its delivery branch as a review
# commit, so the forge's pull request shows the change people review there (crewwork/api/forge_intake.py).

REVIEW_TRAILER = "Crewwork-Review-Of"
_REVIEW_OF = re.compile(rf"^{REVIEW_TRAILER}: (\S+) attempt (\d+)$", re.M)


def review_message(work_item_id: str, attempt: int) -> str:
    """The message of the commit that shows attempt `attempt`'s change for review (never the landed commit)."""
    return (
        f"crewwork {work_item_id}: attempt {attempt}, awaiting review\n\n"
        f"The change validated on attempt {attempt}, shown for review. It lands (as a new commit on this branch) only "
        f"when a person approves it.\n\n{REVIEW_TRAILER}: {work_item_id} attempt {attempt}\n"
    )


@dataclass(frozen=True)
class ReviewPushed:
    branch: str
    commit: str
    created: bool
    """False when the branch already showed this attempt's change."""


async def push_for_review(
    cache: MirrorCache,
    remote: Remote,
    *,
    work_item_id: str,
    base_commit: str,
    diff: str,
    attempt: int,
    scratch: Path,
) -> ReviewPushed:
    """Show attempt `attempt`'s change on the item's delivery branch `crewwork/<id>` as a review commit (crewwork's
    identity, `review_message`), by compare-and-swap: created when the branch does not exist, moved only from an
    earlier review commit of this item (the previous attempt under review). A branch holding anything else, or the
    landed change, is left alone (LandingConflictError). The landing later moves it from the review commit to the
    landed one (`land_by_push`)."""
    branch = delivery_branch(work_item_id)
    ref = f"refs/heads/{branch}"
    message = review_message(work_item_id, attempt)
    async with cache.using(remote, base_commit) as (gitdir, _stats):
        tree = await _tree_of_change(gitdir, base_commit, diff, scratch)
        current = (await remote.ls_remote(ref)).get(ref)
        if current is not None:
            if await _is_same_change(remote, gitdir, work_item_id, current, tree, base_commit, message):
                return ReviewPushed(branch, current, False)
            shown = await _review_attempt_of(remote, gitdir, work_item_id, current, base_commit)
            if shown is None:
                raise LandingConflictError(
                    f"{remote.name} has {branch} at {current[:12]}, which is not a review commit of {work_item_id}; "
                    "refusing to move it"
                )
            if shown > attempt:
                # A late push of an earlier attempt (a stale intake loop) never replaces a later one on the forge.
                raise LandingConflictError(
                    f"{remote.name} shows attempt {shown} of {work_item_id} on {branch}; not moving it back to "
                    f"attempt {attempt}"
                )
        commit = await _commit(gitdir, remote, tree, base_commit, message)
        try:
            await remote.push_branch(gitdir, commit, branch, expected_old=current)
        except PushRejected as exc:
            raise LandingConflictError(str(exc)) from exc
        await run_git(["update-ref", f"refs/crewwork/review/{work_item_id}", commit], cwd=gitdir, git_dir=gitdir)
        return ReviewPushed(branch, commit, True)


async def _review_attempt_of(remote: Remote, gitdir: Path, work_item_id: str, commit: str, parent: str) -> int | None:
    """The attempt `commit` shows for review, if it is exactly a review commit crewwork writes for this item on
    `parent` (rebuilt from its tree, identity and `review_message`, it hashes to `commit`), else None."""
    if not await _has(gitdir, commit):
        await remote.fetch(gitdir, f"+refs/heads/{delivery_branch(work_item_id)}:refs/crewwork/remote/{work_item_id}")
    res = await run_git(["show", "-s", "--format=%T%n%B", commit], cwd=gitdir, git_dir=gitdir)
    if res.code != 0:
        return None
    tree, _, body = res.out.partition("\n")
    found = _REVIEW_OF.search(body)
    if found is None or found.group(1) != work_item_id:
        return None
    attempt = int(found.group(2))
    same = await _is_same_change(
        remote, gitdir, work_item_id, commit, tree.strip(), parent, review_message(work_item_id, attempt)
    )
    return attempt if same else None


async def _tree_of_change(gitdir: Path, base_commit: str, diff: str, scratch: Path) -> str:
    """The tree of `diff` applied to `base_commit`, built in a private index file (no work tree, no checkout)."""
    scratch.mkdir(parents=True, exist_ok=True)
    env = {"GIT_INDEX_FILE": str(scratch / "land.index")}
    try:
        res = await run_git(["read-tree", base_commit], cwd=scratch, git_dir=gitdir, env=env)
        if res.code != 0:
            raise RuntimeError(f"git read-tree {base_commit[:12]} failed in the mirror: {res.err.strip()}")
        res = await run_git(
            ["apply", "--cached", "--binary", "--whitespace=nowarn", "-"],
            cwd=scratch,
            git_dir=gitdir,
            env=env,
            input_bytes=diff.encode(),
        )
        if res.code != 0:
            raise LandingConflictError(f"the change no longer applies to {base_commit[:12]}: {res.err.strip()[-1500:]}")
        res = await run_git(["write-tree"], cwd=scratch, git_dir=gitdir, env=env)
        if res.code != 0 or not res.out.strip():
            raise RuntimeError(f"git write-tree failed in the mirror: {res.err.strip()}")
        return res.out.strip()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def _is_same_change(
    remote: Remote, gitdir: Path, work_item_id: str, commit: str, tree: str, parent: str, message: str
) -> bool:
    """Whether the remote's `commit` is this landing's own (an earlier try of it): fetched into the mirror to look.

    The same tree on the same parent is not enough: anyone who can push to the repository knows the validated change
    and the branch name before the item lands, and a commit of theirs would then be landed, and signed in the
    evidence bundle, as crewwork's, with the author and message they chose. So the commit must be the very object
    this landing writes (`commit-tree` with crewwork's identity and `message`, no other header), whatever its
    timestamps: it is rebuilt from them and must hash to `commit`."""
    if not await _has(gitdir, commit):
        await remote.fetch(gitdir, f"+refs/heads/{delivery_branch(work_item_id)}:refs/crewwork/remote/{work_item_id}")
    res = await run_git(
        ["show", "-s", "--format=%T%n%P%n%ad%n%cd", "--date=raw", commit], cwd=gitdir, git_dir=gitdir, env=IDENTITY
    )
    info = res.out.splitlines()
    if res.code != 0 or len(info) != 4 or info[0] != tree or info[1] != parent:
        return False
    author = f"{IDENTITY['GIT_AUTHOR_NAME']} <{IDENTITY['GIT_AUTHOR_EMAIL']}>"
    committer = f"{IDENTITY['GIT_COMMITTER_NAME']} <{IDENTITY['GIT_COMMITTER_EMAIL']}>"
    ours = (
        f"tree {tree}\nparent {parent}\nauthor {author} {info[2]}\ncommitter {committer} {info[3]}\n\n{message}"
    ).encode()
    rebuilt = await run_git(
        ["hash-object", "-t", "commit", "--stdin"], cwd=gitdir, git_dir=gitdir, input_bytes=ours, env=IDENTITY
    )
    return rebuilt.code == 0 and rebuilt.out.strip() == commit


async def _has(gitdir: Path, commit: str) -> bool:
    return (await run_git(["cat-file", "-e", f"{commit}^{{commit}}"], cwd=gitdir, git_dir=gitdir)).code == 0


# ---------------------------------------------------------------------------------------------------------------
# Evidence hook (crewwork/attestation): a landed change's signed bundle, pushed as a git note on its commit.

NOTES_PREFIX = "refs/notes/crewwork/"


def notes_ref(work_item_id: str) -> str:
    """Each item's bundle has a notes ref of its own (`git notes --ref=crewwork/<id> show <commit>`; fetch them all
    with `git fetch origin 'refs/notes/crewwork/*:refs/notes/crewwork/*'`), so concurrent landings never contend for
    one notes ref, and each is pushed by compare-and-swap like its branch."""
    return f"{NOTES_PREFIX}{work_item_id}"


@dataclass(frozen=True)
class NotePushed:
    ref: str
    commit: str
    """The notes commit (its tree holds one note, the bundle, named by the landed commit's id)."""
    created: bool
    """False when the remote already had exactly this note (a retried landing)."""


async def publish_note(
    cache: MirrorCache,
    remote: Remote,
    *,
    work_item_id: str,
    commit: str,
    make_note: Callable[[Path], Awaitable[bytes]],
    before_push: Callable[[], Awaitable[None]] | None = None,
) -> NotePushed:
    """Attach `make_note(mirror's git dir)` to `commit` as a git note in the item's notes ref on the remote.

    The notes commit is dated with the landed commit's committer date, so the same bundle always gives the same notes
    commit and a retried landing pushes nothing new. The push is a compare-and-swap against the ref as it was seen
    (absent, or an earlier note of this item, e.g. signed with a rotated-out key); `before_push` runs just before it
    and may raise to push nothing."""
    ref = notes_ref(work_item_id)
    async with cache.using(remote, commit) as (gitdir, _stats):
        note = await make_note(gitdir)
        res = await run_git(["show", "-s", "--format=%ct", commit], cwd=gitdir, git_dir=gitdir)
        when = f"{res.out.strip()} +0000"
        env = {**IDENTITY, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
        blob = await _git_out(gitdir, ["hash-object", "-w", "--stdin"], note)
        tree = await _git_out(gitdir, ["mktree"], f"100644 blob {blob}\t{commit}\n".encode())
        message = f"crewwork evidence bundle of {work_item_id} (verify: crewwork verify)\n".encode()
        notes_commit = await _git_out(gitdir, ["commit-tree", tree], message, env)
        current = (await remote.ls_remote(ref)).get(ref)
        if current == notes_commit:
            return NotePushed(ref, notes_commit, False)
        if before_push is not None:
            # The last word before the remote changes (e.g. the caller's fencing: is this attempt still current?).
            await before_push()
        try:
            await remote.push_ref(gitdir, notes_commit, ref, expected_old=current)
        except PushRejected as exc:
            raise LandingConflictError(f"the evidence note {ref} could not be pushed: {exc}") from exc
        await run_git(["update-ref", f"refs/crewwork/notes/{work_item_id}", notes_commit], cwd=gitdir, git_dir=gitdir)
        return NotePushed(ref, notes_commit, True)


async def _git_out(gitdir: Path, args: list[str], data: bytes, env: dict[str, str] | None = None) -> str:
    res = await run_git(args, cwd=gitdir, git_dir=gitdir, input_bytes=data, env=env)
    out = res.out.strip()
    if res.code != 0 or not out:
        raise RuntimeError(f"git {args[0]} failed in the mirror: {res.err.strip()[-500:]}")
    return out
