"""Operator-held git credentials, applied only to host-side git and only for the repositories they are scoped to.

How a secret reaches git without being seen anywhere else:

- **HTTPS token**: an `Authorization` header set through git's environment-borne configuration
  (`GIT_CONFIG_COUNT` / `GIT_CONFIG_KEY_n` / `GIT_CONFIG_VALUE_n`, git >= 2.31), scoped to the credential's URL
  prefix (`http.<prefix>.extraHeader`), with redirects off. Not `-c` on the command line: argv is world-readable in
  /proc; a process's environment is readable only by its own user. No credential helper, no askpass program, no
  file written anywhere.
- **SSH key**: `GIT_SSH_COMMAND` runs `ssh -F /dev/null -i KEY -o IdentitiesOnly=yes -o IdentityAgent=none
  -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile=KNOWN_HOSTS`: no user or system ssh config,
  no agent, no prompt, and a server whose host key is not in the operator's known_hosts is refused.

Sandboxes never see either: they get an explicit environment (`crewwork.sandbox.base.base_env`) and only system
directories plus their workspace, and `check_secret_location` refuses a secret file that lies where a sandbox
could read it. Every message that leaves this package goes through `Redactor`, which masks the secret values and
any user info in URLs.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from crewwork.boundary.masking import Redactor
from crewwork.boundary.urls import RepoURL, redact_url
from crewwork.config.repos import RepoCredential, matches
from crewwork.models import TenantRef

# Directories every sandbox backend exposes (bwrap binds these read-only; the Docker image has its own, but the
# worker's files under them would be visible to the bwrap backend on the same host).
SANDBOX_VISIBLE = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
MAX_SECRET_BYTES = 64 * 1024


class CredentialError(ValueError):
    """A credential is misconfigured or unusable; the message names it and never holds its value."""


@dataclass(frozen=True)
class GitAuth:
    """What host git needs for one remote: extra environment (never argv) and the secret values to mask."""

    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    credential: str | None = None
    """Name of the credential used, for messages and evidence (never its value)."""

    def redactor(self) -> Redactor:
        return Redactor(self.secrets)

    def redact(self, text: str) -> str:
        return self.redactor()(redact_url(text))


def check_secret_location(path: Path, exposed: Iterable[Path] = ()) -> None:
    """Refuse a secret file a sandbox could read: under the system directories bwrap binds, or under the data,
    worktree or mirror directories (`exposed`)."""
    resolved = path.resolve()
    for d in (*map(Path, SANDBOX_VISIBLE), *exposed):
        d = d.resolve()
        if resolved == d or resolved.is_relative_to(d):
            raise CredentialError(
                f"secret file {path} lies under {d}, which sandboxes can see; move it (e.g. to /run/secrets)"
            )


def read_secret(name: str, path: Path, exposed: Iterable[Path] = ()) -> str:
    check_secret_location(path, exposed)
    try:
        data = path.read_bytes()[: MAX_SECRET_BYTES + 1]
    except OSError as exc:
        raise CredentialError(f"credential {name!r}: cannot read its secret file ({exc.strerror})") from None
    if len(data) > MAX_SECRET_BYTES:
        raise CredentialError(f"credential {name!r}: secret file is larger than {MAX_SECRET_BYTES} bytes")
    return data.decode("utf-8", errors="strict").strip("\r\n")


class Credentials:
    """The operator's credentials (`CREWWORK_REPO_CREDENTIALS`) and known_hosts, resolved per remote."""

    def __init__(
        self,
        credentials: dict[str, RepoCredential],
        *,
        known_hosts: Path | None = None,
        exposed: Iterable[Path] = (),
    ) -> None:
        self.credentials = dict(credentials)
        self.known_hosts = known_hosts
        self.exposed = tuple(exposed)

    def select(self, url: RepoURL, tenant: TenantRef | None = None, name: str | None = None) -> str | None:
        """The credential for `url`: `name` if given (it must be scoped to the URL), else the one with the longest
        matching scope. Tenant restrictions (`tenants`, by name or id) apply to both; with no tenant, only
        credentials without restrictions are used."""
        if url.is_local:
            return None
        if name is not None:
            cred = self.credentials.get(name)
            if cred is None:
                raise CredentialError(f"no credential named {name!r} is configured")
            if not any(matches(p, url.url) for p in cred.match):
                raise CredentialError(f"credential {name!r} is not scoped to {url.url}")
            if not _admits(cred.tenants, tenant):
                raise CredentialError(f"credential {name!r} is not available to this tenant")
            return name
        best: tuple[int, str] | None = None
        for cname, cred in self.credentials.items():
            if not _admits(cred.tenants, tenant):
                continue
            if (cred.kind == "ssh_key") != (url.scheme == "ssh"):
                continue
            for p in cred.match:
                if matches(p, url.url) and (best is None or len(p) > best[0]):
                    best = (len(p), cname)
        return best[1] if best else None

    def all_secret_values(self) -> list[str]:
        """Every configured secret that can be read (for masking text that might hold one)."""
        out = []
        for name, cred in self.credentials.items():
            try:
                out.append(read_secret(name, cred.secret_file, self.exposed))
            except (CredentialError, UnicodeDecodeError):
                continue
        return out

    def auth_for(self, url: RepoURL, tenant: TenantRef | None = None, name: str | None = None) -> GitAuth:
        """The environment host git needs to reach `url`; raises CredentialError for a misconfiguration."""
        if url.is_local or url.scheme == "git":
            return GitAuth()
        cname = self.select(url, tenant, name)
        if url.scheme == "ssh":
            return self._ssh(url, cname)
        if cname is None:
            return GitAuth()
        cred = self.credentials[cname]
        try:
            token = read_secret(cname, cred.secret_file, self.exposed)
        except UnicodeDecodeError:
            raise CredentialError(f"credential {cname!r}: the secret file is not UTF-8 text") from None
        if not token or any(c in token for c in "\r\n\x00"):
            raise CredentialError(f"credential {cname!r}: the secret file must hold one non-empty line")
        if cred.auth_scheme == "bearer":
            header = f"Authorization: Bearer {token}"
            encoded = token
        else:
            encoded = base64.b64encode(f"{cred.username}:{token}".encode()).decode()
            header = f"Authorization: Basic {encoded}"
        env: dict[str, str] = {}
        # Scoped to each of the credential's prefixes: git sends the header only to URLs under them.
        scopes = [p for p in cred.match if "://" in p and matches(p, url.url)] or [url.origin + "/"]
        for i, scope in enumerate(scopes):
            env[f"GIT_CONFIG_KEY_{i}"] = f"http.{scope}.extraHeader"
            env[f"GIT_CONFIG_VALUE_{i}"] = header
        env["GIT_CONFIG_COUNT"] = str(len(scopes))
        return GitAuth(env=env, secrets=(token, encoded, header), credential=cname)

    def _ssh(self, url: RepoURL, cname: str | None) -> GitAuth:
        cred = self.credentials.get(cname) if cname else None
        known = (cred.known_hosts if cred and cred.known_hosts else None) or self.known_hosts
        if known is None:
            raise CredentialError(
                f"{url.url}: ssh needs a known_hosts file to check the server against "
                "(set CREWWORK_SSH_KNOWN_HOSTS, or known_hosts on the credential)"
            )
        if not known.is_file():
            raise CredentialError(f"known_hosts file {known} does not exist")
        argv = [
            "ssh",
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentityAgent=none",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={known}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=15",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "PasswordAuthentication=no",
            "-o",
            "KbdInteractiveAuthentication=no",
        ]
        secrets: tuple[str, ...] = ()
        if cred is not None:
            check_secret_location(cred.secret_file, self.exposed)
            if not cred.secret_file.is_file():
                raise CredentialError(f"credential {cname!r}: key file {cred.secret_file} does not exist")
            argv += ["-i", str(cred.secret_file), "-o", "IdentitiesOnly=yes"]
            try:
                key = read_secret(cname or "", cred.secret_file, self.exposed)
                # The key's base64 lines, so that no fragment of it could survive masking.
                secrets = tuple(line for line in key.splitlines() if len(line) >= 16 and "PRIVATE KEY" not in line)
            except (CredentialError, UnicodeDecodeError):
                secrets = ()
        else:
            argv += ["-o", "IdentitiesOnly=yes", "-o", "IdentityFile=none"]
        env = {"GIT_SSH_COMMAND": shlex.join(argv), "GIT_SSH_VARIANT": "ssh"}
        return GitAuth(env=env, secrets=secrets, credential=cname)


def _admits(tenants: list[str] | None, tenant: TenantRef | None) -> bool:
    if tenants is None:
        return True
    return tenant is not None and tenant.in_scope(tenants)
