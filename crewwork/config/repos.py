"""Operator configuration of repositories: credentials, forges and setup secrets, as typed models.

`crewwork.config.Settings` holds these (JSON in `CREWWORK_REPO_CREDENTIALS`, `CREWWORK_FORGES`,
`CREWWORK_SETUP_SECRETS`). A model here holds a *reference* to a secret (the path of a file that holds it), never
the secret itself, so settings can be printed, logged and diffed. Secrets are files rather than environment
variables because every child process inherits the environment (git, ssh, sandboxes started by the worker) while a
file is read only by the code that asks for it, at the moment it needs it (so rotation needs no restart).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from crewwork.boundary.urls import RepoURLError, parse_repo_url


def _check_prefix(v: str) -> str:
    """A scope is a normalised URL prefix; scp-style scopes (`git@host:acme/`) are compared as written."""
    if "://" in v:
        try:
            parse_repo_url(v.rstrip("/") + "/x")
        except RepoURLError as exc:
            raise ValueError(f"scope {v!r} is not a repository URL prefix: {exc}") from exc
    return v


class RepoCredential(BaseModel):
    """A credential host-side git presents to the repositories under `match`, and only to them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["https_token", "ssh_key"] = Field(
        description="`https_token`: an HTTP(S) token or password (sent as a header by host git only); "
        "`ssh_key`: an SSH private key."
    )
    match: list[str] = Field(
        min_length=1,
        description="Normalised repository URL prefixes this credential may be sent to, e.g. "
        "`https://github.com/acme/` or `ssh://git@git.internal:2222/`. A credential is never used elsewhere.",
    )
    secret_file: Path = Field(
        description="File holding the token (https_token) or the private key (ssh_key). Read at each use. Keep it "
        "outside every directory a sandbox can see (not under /usr, /etc or the data directory); crewwork refuses "
        "one that is.",
    )
    username: str = Field(
        default="x-access-token",
        description="https_token: the user name of HTTP basic auth (GitHub: x-access-token; GitLab: oauth2).",
    )
    auth_scheme: Literal["basic", "bearer"] = Field(
        default="basic", description="https_token: `basic` (user name + token) or `bearer` (the token alone)."
    )
    known_hosts: Path | None = Field(
        default=None, description="ssh_key: known_hosts file for these hosts (default CREWWORK_SSH_KNOWN_HOSTS)."
    )
    tenants: list[str] | None = Field(
        default=None,
        description="Tenants whose work items may use this credential, by name (`crewwork keys create --tenant "
        "NAME`) or id. None: every tenant.",
    )

    @field_validator("match")
    @classmethod
    def _prefixes(cls, v: list[str]) -> list[str]:
        return [_check_prefix(p) for p in v]


class ForgeConfig(BaseModel):
    """A forge whose REST API opens pull requests for landed branches (GitHub and GitHub Enterprise)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["github"] = Field(default="github", description="Forge API dialect.")
    match: list[str] = Field(min_length=1, description="Repository URL prefixes hosted on this forge.")
    api_url: str = Field(
        default="https://api.github.com",
        description="REST API base URL (GitHub Enterprise: https://HOST/api/v3).",
        pattern=r"^https?://[^\s/?#@]+(/[^\s?#]*)?$",
    )
    credential: str = Field(
        description="Name of an https_token in CREWWORK_REPO_CREDENTIALS whose token the API accepts (Bearer)."
    )
    pull_requests: Literal["on_request", "always"] = Field(
        default="on_request",
        description="`always`: every landing on these repositories opens a pull request; `on_request`: only work "
        "items with `repo.pull_request` do.",
    )
    draft: bool = Field(default=False, description="Open pull requests as drafts unless the work item says.")
    timeout_s: float = Field(default=30.0, gt=0, description="Timeout of one API request, seconds.")

    @field_validator("match")
    @classmethod
    def _prefixes(cls, v: list[str]) -> list[str]:
        return [_check_prefix(p) for p in v]


class SetupSecret(BaseModel):
    """An operator secret a repository's setup commands may ask for by name; never given to agents or tests."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: Path = Field(description="File holding the secret value. Read when a setup that names it runs.")
    env: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$",
        description="Environment variable the setup commands see it as (e.g. PIP_INDEX_URL).",
    )
    tenants: list[str] | None = Field(
        default=None, description="Tenants that may name it, by name or id. None: every tenant."
    )


def matches(prefix: str, url: str) -> bool:
    """`url` lies under the scope `prefix` (a normalised URL prefix, compared on a path boundary)."""
    if url == prefix.rstrip("/"):
        return True
    if not url.startswith(prefix):
        return False
    return prefix.endswith(("/", ":")) or url[len(prefix)] in "/:"
