"""Repositories for one crewwork worker: the checks of crewwork/repos/registration.py, plus this host's mirror cache,
landing by compare-and-swap push, evidence notes and pull requests.

The one object activities use: `Repositories(settings)` (crewwork/steps/ports.py).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path

from crewwork.boundary.urls import RepoURLError
from crewwork.forge import ForgeError
from crewwork.forge.github import GitHubForge, PullRequest
from crewwork.models import PullRequestSpec, TenantRef
from crewwork.repos.credentials import CredentialError, read_secret
from crewwork.repos.git import RemoteError, is_sha
from crewwork.repos.landing import Landed, NotePushed, ReviewPushed, land_by_push, publish_note, push_for_review
from crewwork.repos.mirror import MirrorCache, MirrorHold
from crewwork.repos.registration import RepoPolicyError, RepositoryChecks


class Repositories(RepositoryChecks):
    """The repositories as the step activities use them: the entry checks, and this host's mirrors under them."""

    @functools.cached_property
    def mirrors(self) -> MirrorCache:
        return MirrorCache(
            self.settings.resolved_mirror_dir(), self.settings.mirror_max_bytes, fsck=self.settings.mirror_fsck
        )

    # ------------------------------------------------------------------ activities

    async def hold(
        self, locator: str, commit: str, tenant: TenantRef | None = None, credential: str | None = None
    ) -> MirrorHold:
        """This host's mirror of the repository holding `commit` (fetched when it lacks it), kept from eviction until
        the hold is released: the git directory workspaces are made from."""
        url = self.locate(locator)
        return await self.mirrors.hold(self.remote(url, tenant, credential), commit)

    async def land(
        self,
        locator: str,
        *,
        tenant: TenantRef | None,
        work_item_id: str,
        base_commit: str,
        diff: str,
        message: str,
        scratch: Path,
        credential: str | None = None,
    ) -> Landed:
        url = self.locate(locator)
        return await land_by_push(
            self.mirrors,
            self.remote(url, tenant, credential),
            work_item_id=work_item_id,
            base_commit=base_commit,
            diff=diff,
            message=message,
            scratch=scratch,
        )

    async def push_for_review(
        self,
        locator: str,
        *,
        tenant: TenantRef | None,
        work_item_id: str,
        base_commit: str,
        diff: str,
        attempt: int,
        scratch: Path,
        credential: str | None = None,
    ) -> ReviewPushed:
        """Show an attempt's change on the item's delivery branch for review on the forge (crewwork.repos.landing)."""
        url = self.locate(locator)
        return await push_for_review(
            self.mirrors,
            self.remote(url, tenant, credential),
            work_item_id=work_item_id,
            base_commit=base_commit,
            diff=diff,
            attempt=attempt,
            scratch=scratch,
        )

    async def publish_note(
        self,
        locator: str,
        *,
        tenant: TenantRef | None,
        work_item_id: str,
        commit: str,
        make_note: Callable[[Path], Awaitable[bytes]],
        credential: str | None = None,
        before_push: Callable[[], Awaitable[None]] | None = None,
    ) -> NotePushed:
        """Evidence hook: the landed commit's signed bundle as a git note (crewwork.repos.landing.publish_note)."""
        url = self.locate(locator)
        return await publish_note(
            self.mirrors,
            self.remote(url, tenant, credential),
            work_item_id=work_item_id,
            commit=commit,
            make_note=make_note,
            before_push=before_push,
        )

    async def open_pull_request(
        self,
        locator: str,
        *,
        tenant: TenantRef | None,
        branch: str,
        spec: PullRequestSpec | None,
        ref: str | None,
        message: str,
        work_item_id: str,
        evidence: str | None = None,
    ) -> PullRequest | None:
        """Open (or find, on a retry) the pull request of a landed branch, if one is wanted. ForgeError on failure.
        `evidence`: a paragraph about the change's signed evidence bundle, for the body."""
        url = self.locate(locator)
        try:
            forge = self.forge(url, spec)
        except RepoPolicyError as exc:
            raise ForgeError(str(exc), retryable=False) from None
        if forge is None:
            return None
        cred = self.settings.repo_credentials[forge.credential]
        if not (tenant is not None and tenant.in_scope(cred.tenants)):
            raise ForgeError(
                f"the forge's credential {forge.credential!r} is not available to this tenant", retryable=False
            )
        token = read_secret(forge.credential, cred.secret_file, self.credentials.exposed)
        owner_name = url.owner_and_name
        assert owner_name is not None
        owner, name = owner_name
        lines = message.strip().splitlines()
        title = (spec.title if spec and spec.title else None) or (lines[0] if lines else branch)
        lead = f"{spec.body.strip()}\n\n" if spec and spec.body else ""
        body = lead + "\n".join(lines[1:]).strip() + f"\n\nOpened by crewwork for work item `{work_item_id}`.\n"
        if evidence:
            body += f"\n{evidence}\n"
        base = spec.base if spec and spec.base else _branch_of(ref)
        draft = spec.draft if spec and spec.draft is not None else forge.draft
        return await GitHubForge(forge.api_url, token, timeout_s=forge.timeout_s).open_pull_request(
            owner, name, head=branch, base=base, title=title, body=body.strip() + "\n", draft=draft
        )

    async def prune(self, locator: str) -> None:
        try:
            url = self.locate(locator)
        except RepoURLError:
            return
        await self.mirrors.prune(url)


def _branch_of(ref: str | None) -> str | None:
    """`ref` as a branch name when it can be one (not HEAD, a commit or a tag)."""
    if not ref or ref == "HEAD" or is_sha(ref) or ref.startswith("refs/tags/"):
        return None
    return ref.removeprefix("refs/heads/")


REPO_ERRORS: tuple[type[BaseException], ...] = (RemoteError, CredentialError, RepoURLError)
"""What a repository operation raises for a repository's own failure (crewwork.steps.execution.repo_failure says
which the workflow retries)."""
