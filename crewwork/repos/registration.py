"""The checks of a repository where it enters, with nothing that keeps or changes one: its URL under operator policy,
the address host git may connect to, the credential it names, the ref on the remote (`git ls-remote`, or the local
repository read through its confinement), and the forge a pull request would go to. The API process registers
repositories and checks submissions with this alone; crewwork/repos/worker.py adds this host's mirrors, landing and
pull requests for the workers.

A repository is named everywhere by its *locator*, the normalised URL (`RepoURL.url`: a remote URL, or an absolute
path for a local repository), which never holds a secret.
"""

from __future__ import annotations

from pathlib import Path

from crewwork.boundary.masking import Redactor
from crewwork.boundary.outbound import Resolver
from crewwork.boundary.urls import RepoURL, RepoURLError, parse_repo_url, redact_url
from crewwork.config import Settings
from crewwork.config.repos import ForgeConfig
from crewwork.forge import forge_for
from crewwork.models import PullRequestSpec, TenantRef
from crewwork.repos.address import RemoteAddressPolicy
from crewwork.repos.credentials import CredentialError, Credentials, GitAuth, read_secret
from crewwork.repos.git import RemoteAddressRefused, RemoteError, RemoteNotFound, run_git
from crewwork.repos.local import UnsafeLocalRepository, confine, local_git_dir
from crewwork.repos.remote import Remote


class _Configured:
    """The operator's CREWWORK_REPO_ROOTS (for a caller that names no tenant's roots)."""


CONFIGURED = _Configured()
Roots = list[Path] | None | _Configured


class RepoPolicyError(ValueError):
    """A submitted repository or ref is unusable; the message is safe to show the submitter."""


class RepoAddressRefused(RepoPolicyError):
    """The repository's host is, or resolves to, an address the operator does not allow (CREWWORK_REPO_ALLOW_NETWORKS)."""


class RepositoryChecks:
    """Operator policy on repositories for one process: `parse` a submitted URL, `check` it and its ref against the
    remote, name the `forge` of its pull requests; `remote` and `auth` are what every git command against it uses."""

    def __init__(self, settings: Settings, *, resolver: Resolver | None = None) -> None:
        self.settings = settings
        self.address = RemoteAddressPolicy.from_settings(settings, resolver)
        exposed = [settings.data_dir.resolve(), settings.resolved_worktree_dir(), settings.resolved_mirror_dir()]
        self.credentials = Credentials(settings.repo_credentials, known_hosts=settings.ssh_known_hosts, exposed=exposed)

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
        if res.code != 0 and res.err.strip():
            # `--quiet` makes a missing ref silent: anything on stderr is git (or the confinement around it) failing
            # to read the repository, which is not the tenant's ref being wrong (a directory on the way that only
            # another user may enter made this read "repo.ref 'HEAD' does not exist").
            raise RepoPolicyError(f"repository {url.url} could not be read: {res.err.strip().splitlines()[-1][:300]}")
        if res.code != 0 or len(sha) not in (40, 64):
            raise RepoPolicyError(f"repo.ref {ref!r} does not exist in {url.url}")
        return sha

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

    def intake_forge(self, url: RepoURL, tenant: TenantRef | None) -> ForgeConfig:
        """The operator's forge that hosts `url`, for intake from its events: RepoPolicyError when none is
        configured (CREWWORK_FORGES), the URL names no owner/repository on it, or its credential is not an
        https_token available to `tenant`."""
        forge = forge_for(url, self.settings.forges)
        if forge is None:
            raise RepoPolicyError(f"no forge is configured for {url.url} (CREWWORK_FORGES), so it has no events")
        if url.owner_and_name is None:
            raise RepoPolicyError(f"{url.url} does not name an owner/repository on the forge")
        cred = self.settings.repo_credentials.get(forge.credential)
        if cred is None or cred.kind != "https_token":
            raise RepoPolicyError(f"the forge's credential {forge.credential!r} is not a configured https_token")
        try:
            self.credentials.select(url, tenant, forge.credential)
        except CredentialError as exc:
            raise RepoPolicyError(f"the forge's credential: {exc}") from None
        return forge

    def forge_token(self, forge: ForgeConfig) -> str:
        """The token of `forge`'s credential, read now (CredentialError when it cannot be)."""
        cred = self.settings.repo_credentials[forge.credential]
        return read_secret(forge.credential, cred.secret_file, self.credentials.exposed)


def checked_local_git_dir(url: RepoURL) -> Path:
    """The git directory of a local repository, once it is known to make git read nothing outside it
    (crewwork.repos.local); RepoPolicyError naming the redirect otherwise."""
    try:
        return local_git_dir(url.local_path)
    except UnsafeLocalRepository as exc:
        raise RepoPolicyError(f"repository {url.url}: {exc}") from None
