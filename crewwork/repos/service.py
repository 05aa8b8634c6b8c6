"""Repositories for one crewwork process: operator policy on URLs, credentials, this host's mirror cache.

The one object activities and the submission check use: `Repositories(settings)`. A repository is named
everywhere by its *locator*, the normalised URL (`RepoURL.url`: a remote URL, or an absolute path for a local
repository), which never holds a secret.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path

from crewwork.config import Settings
from crewwork.config.repos import ForgeConfig
from crewwork.forge import ForgeError, forge_for
from crewwork.forge.github import GitHubForge, PullRequest
from crewwork.models import PullRequestSpec, TenantRef
from crewwork.outbound import Resolver
from crewwork.repos.address import RemoteAddressPolicy
from crewwork.repos.credentials import CredentialError, Credentials, GitAuth, read_secret
from crewwork.repos.git import RemoteAddressRefused, RemoteError, RemoteNotFound, is_sha, run_git
from crewwork.repos.landing import Landed, NotePushed, land_by_push, publish_note
from crewwork.repos.local import UnsafeLocalRepository, confine, local_git_dir
from crewwork.repos.mirror import MirrorCache, MirrorHold
from crewwork.repos.remote import Remote
from crewwork.steps.errors import REPOSITORY_ERROR, REPOSITORY_UNAVAILABLE
from crewwork.transport.redact import Redactor
from crewwork.urls import RepoURL, RepoURLError, parse_repo_url, redact_url


class _Configured:
    """The operator's CREWWORK_REPO_ROOTS (for a caller that names no tenant's roots)."""


CONFIGURED = _Configured()
Roots = list[Path] | None | _Configured


class RepoPolicyError(ValueError):
    """A submitted repository or ref is unusable; the message is safe to show the submitter."""


class RepoAddressRefused(RepoPolicyError):
    """The repository's host is, or resolves to, an address the operator does not allow (CREWWORK_REPO_ALLOW_NETWORKS)."""


class Repositories:
    def __init__(self, settings: Settings, *, resolver: Resolver | None = None) -> None:
        self.settings = settings
        self.address = RemoteAddressPolicy.from_settings(settings, resolver)
        exposed = [settings.data_dir.resolve(), settings.resolved_worktree_dir(), settings.resolved_mirror_dir()]
        self.credentials = Credentials(settings.repo_credentials, known_hosts=settings.ssh_known_hosts, exposed=exposed)

    @functools.cached_property
    def mirrors(self) -> MirrorCache:
        return MirrorCache(
            self.settings.resolved_mirror_dir(), self.settings.mirror_max_bytes, fsck=self.settings.mirror_fsck
        )

    # ------------------------------------------------------------------ naming

    def parse(self, raw: str, *, must_exist: bool = False, roots: Roots = CONFIGURED) -> RepoURL:
        """A submitted URL under operator policy: allowed scheme, local paths confined to the repo roots (`roots`:
        the tenant's, `Settings.repo_roots_for`; None anywhere, [] nowhere; default CREWWORK_REPO_ROOTS)."""
        confined = (self.settings.repo_root_list() or None) if isinstance(roots, _Configured) else roots
        try:
            url = parse_repo_url(raw, roots=confined or None, must_exist=must_exist)
        except RepoURLError as exc:
            raise RepoPolicyError(str(exc)) from None
        if url.is_local and confined == []:
            raise RepoPolicyError(
                f"repository {url.url}: no repository roots are assigned to this tenant, so it may use no local "
                "repositories (CREWWORK_TENANT_REPO_ROOTS)"
            )
        scheme = "file" if url.is_local else url.scheme
        allowed = self.settings.repo_scheme_set()
        if scheme not in allowed:
            raise RepoPolicyError(
                f"repository {url.url}: {scheme} repositories are not allowed here (CREWWORK_REPO_SCHEMES="
                f"{','.join(sorted(allowed))})"
            )
        return url

    def locate(self, locator: str) -> RepoURL:
        """The URL of a stored locator (already checked at submission)."""
        return parse_repo_url(locator)

    def remote(self, url: RepoURL, tenant: TenantRef | None = None, credential: str | None = None) -> Remote:
        return Remote(
            url=url,
            auth=self.auth(url, tenant, credential),
            timeout_s=self.settings.git_timeout_s,
            fsck=self.settings.mirror_fsck,
            address=self.address,
        )

    def auth(self, url: RepoURL, tenant: TenantRef | None = None, credential: str | None = None) -> GitAuth:
        """Host git's credential for `url`: the named one (a registered repository's), else the operator's
        credential with the longest matching scope."""
        return self.credentials.auth_for(url, tenant, credential)

    def redactor(self) -> Redactor:
        """Masks every configured credential and URL user info (for text of unknown origin)."""
        return Redactor(self.credentials.all_secret_values())

    def redact(self, text: str) -> str:
        return self.redactor()(redact_url(text))

    # ------------------------------------------------------------------ submission

    async def check(
        self,
        raw_url: str,
        ref: str,
        tenant: TenantRef | None = None,
        *,
        credential: str | None = None,
        roots: Roots = CONFIGURED,
    ) -> tuple[RepoURL, str]:
        """The repository and the commit `ref` names now, checked against the remote itself where it can be
        (unreachable, bad credentials, missing ref: a RepoPolicyError naming the remote)."""
        url = self.parse(raw_url, must_exist=True, roots=roots)
        if url.is_local:
            return url, await self._resolve_local(url, ref)
        try:
            # The address first, so a refused one is what the tenant is told (and is checked again, and pinned,
            # by every git command the remote runs).
            await self.address.pin(url)
            remote = self.remote(url, tenant, credential)
            return url, await remote.resolve(ref, timeout_s=self.settings.repo_check_timeout_s)
        except CredentialError as exc:
            raise RepoPolicyError(f"repository {url.url}: {exc}") from None
        except RemoteNotFound as exc:
            raise RepoPolicyError(f"repo.ref {ref!r} does not exist in {url.url} ({exc})") from None
        except RemoteAddressRefused as exc:
            raise RepoAddressRefused(str(exc)) from None
        except RemoteError as exc:
            raise RepoPolicyError(str(exc)) from None

    async def _resolve_local(self, url: RepoURL, ref: str) -> str:
        git_dir = checked_local_git_dir(url)
        try:
            confined = confine(git_dir, writable=False)
        except UnsafeLocalRepository as exc:
            raise RepoPolicyError(f"repository {url.url}: {exc}") from None
        try:
            res = await run_git(
                ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"],
                cwd="/",
                git_dir=git_dir,
                wrap=confined.argv,
                pass_fds=confined.fds,
            )
        finally:
            confined.close()
        sha = res.out.strip()
        if res.code != 0 or len(sha) not in (40, 64):
            raise RepoPolicyError(f"repo.ref {ref!r} does not exist in {url.url}")
        return sha

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

    # ------------------------------------------------------------------ pull requests

    def forge(self, url: RepoURL, requested: PullRequestSpec | None) -> ForgeConfig | None:
        """The forge that opens a pull request for landings on `url`: when the work item asks for one, or the
        forge opens one for every landing. Raises RepoPolicyError when one is asked for and none is configured."""
        forge = forge_for(url, self.settings.forges)
        if requested is not None and forge is None:
            raise RepoPolicyError(
                f"repo.pull_request: no forge is configured for {url.url} (CREWWORK_FORGES), so no pull request "
                "can be opened"
            )
        if forge is not None and (requested is not None or forge.pull_requests == "always"):
            if url.owner_and_name is None:
                raise RepoPolicyError(f"repo.pull_request: {url.url} does not name an owner/repository on the forge")
            cred = self.settings.repo_credentials.get(forge.credential)
            if cred is None or cred.kind != "https_token":
                raise RepoPolicyError(
                    f"repo.pull_request: the forge's credential {forge.credential!r} is not a configured https_token"
                )
            return forge
        return None

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
        body = "\n".join(lines[1:]).strip() + f"\n\nOpened by crewwork for work item `{work_item_id}`.\n"
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


def checked_local_git_dir(url: RepoURL) -> Path:
    """The git directory of a local repository, once it is known to make git read nothing outside it
    (crewwork.repos.local); RepoPolicyError naming the redirect otherwise."""
    try:
        return local_git_dir(url.local_path)
    except UnsafeLocalRepository as exc:
        raise RepoPolicyError(f"repository {url.url}: {exc}") from None


def _branch_of(ref: str | None) -> str | None:
    """`ref` as a branch name when it can be one (not HEAD, a commit or a tag)."""
    if not ref or ref == "HEAD" or is_sha(ref) or ref.startswith("refs/tags/"):
        return None
    return ref.removeprefix("refs/heads/")


def repo_failure(exc: BaseException) -> Exception:
    """The Temporal error for a repository failure (types in crewwork/steps/errors.py): retryable while the
    remote is unreachable, not otherwise. The workflow ends the item `failed` naming the remote, never `dead`."""
    from temporalio.exceptions import ApplicationError

    if isinstance(exc, RemoteError) and exc.retryable:
        return ApplicationError(str(exc), type=REPOSITORY_UNAVAILABLE)
    return ApplicationError(str(exc), type=REPOSITORY_ERROR, non_retryable=True)


REPO_ERRORS: tuple[type[BaseException], ...] = (RemoteError, CredentialError, RepoURLError)
