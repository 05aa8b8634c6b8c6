"""Where host git may connect for a tenant's repository: the address policy for remotes, and the pin that holds it.

A tenant names its repository's URL, and the processes that dial it (the API's `ls-remote` at registration and
submission, every pool's mirror fetch, the control pool's landing push) sit inside the operator's network. So a
remote is reachable only at a *public* address unless the operator's allowlist (`CREWWORK_REPO_ALLOW_NETWORKS`,
CIDRs) says otherwise: the categories and the check are `crewwork.boundary.outbound`'s (loopback, private, link-local with
the cloud metadata service, shared, reserved, multicast, unspecified, and IPv6 forms embedding one of them).

The host is judged by what git would connect to: an address in any spelling the system resolver reads
(`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`, `0`, `[::ffff:127.0.0.1]`) is that address; a name is resolved
once and *every* address it resolves to must pass. The URL grammar (`crewwork.boundary.urls`) has already refused
user info in http(s) URLs, hosts starting with `-`, trailing dots, `%`-escapes and anything but `[A-Za-z0-9._-]`
or a bracketed IPv6 literal in a host, and paths git would read into the host (`@[`, a `%` git would decode again),
so what is judged here is the host git is given.

Then the checked address is pinned for the one git process that uses it, so a DNS answer that changes between the
check and the connection (rebinding, TTL 0) cannot move it:

- http(s): `-c http.curloptResolve=HOST:PORT:ADDRESS` (git >= 2.37): curl takes the address from its resolve
  list and never asks DNS; the URL, the `Host` header, TLS SNI and certificate checks keep the name, and so do
  credential scopes (`http.<url>.extraHeader`). Redirects stay off (`http.followRedirects=false`).
- ssh: `-o HostName=ADDRESS -o HostKeyAlias=NAME` (`[NAME]:PORT` off port 22, as known_hosts records it) and
  `CheckHostIP=no`: ssh connects to the address and checks the server's key against the *name's* entry in the
  operator's known_hosts (StrictHostKeyChecking stays on).
- git://: the URL given to git names the address (the daemon then sees `host=ADDRESS` in the request; a daemon
  that serves virtual hosts by that field would need an allowlisted address spelled as such).

The check runs before every network git command (`crewwork.repos.remote.Remote.git`), so at registration, at each
submission (a registered repository whose name now resolves inside is refused) and on the workers before each
fetch, ls-remote and push. Local repositories are not addresses: tenant roots govern them.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from crewwork.boundary.outbound import (
    RESOLVE_TIMEOUT_S,
    IPAddress,
    OutboundPolicy,
    OutboundRefused,
    Resolver,
    Unresolvable,
    parse_networks,
)
from crewwork.boundary.urls import DEFAULT_PORTS, RepoURL
from crewwork.repos.credentials import GitAuth
from crewwork.repos.git import DEFAULT_SSH_COMMAND, RemoteAddressRefused, RemoteUnavailable

ALLOW_SETTING = "CREWWORK_REPO_ALLOW_NETWORKS"


@dataclass(frozen=True)
class Pin:
    """A remote's host, checked, and the address git connects to for it."""

    scheme: str
    host: str
    """The host as the normalised URL names it (IPv6 without brackets)."""
    port: int
    ip: IPAddress

    @property
    def _ip_in_url(self) -> str:
        return f"[{self.ip}]" if self.ip.version == 6 else str(self.ip)

    def git_url(self, url: RepoURL) -> str:
        """The URL git is given: the normalised one, except for git://, which names the checked address."""
        if self.scheme != "git":
            return url.url
        port = f":{url.port}" if url.port else ""
        return f"git://{self._ip_in_url}{port}{url.path}"

    def git_config(self) -> list[str]:
        """`-c` settings that make curl connect to the checked address (http(s) only, and only for a name)."""
        if self.scheme not in ("http", "https") or str(self.ip) == self.host:
            return []
        return [f"http.curloptResolve={self.host}:{self.port}:{self._ip_in_url}"]

    def env(self, auth: GitAuth) -> dict[str, str]:
        """Environment for git: for ssh, its command with the checked address as the one to connect to."""
        if self.scheme != "ssh":
            return {}
        base = auth.env.get("GIT_SSH_COMMAND", DEFAULT_SSH_COMMAND)
        alias = self.host if self.port == DEFAULT_PORTS["ssh"] else f"[{self.host}]:{self.port}"
        pinned = ["-o", f"HostName={self.ip}", "-o", f"HostKeyAlias={alias}", "-o", "CheckHostIP=no"]
        return {"GIT_SSH_COMMAND": f"{base} {shlex.join(pinned)}"}


@dataclass(frozen=True)
class RemoteAddressPolicy:
    allow: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    """Networks a remote may be reached at although they are not public (the operator's allowlist)."""
    resolver: Resolver | None = field(default=None, compare=False)
    """How names are resolved (default: the system resolver); tests give a DNS whose answers change."""
    timeout_s: float = RESOLVE_TIMEOUT_S

    @classmethod
    def from_settings(cls, settings: Any, resolver: Resolver | None = None) -> RemoteAddressPolicy:
        return cls(parse_networks(settings.repo_allow_networks), resolver=resolver)

    @property
    def _outbound(self) -> OutboundPolicy:
        return OutboundPolicy(self.allow, resolver=self.resolver, allow_setting=ALLOW_SETTING)

    async def pin(self, url: RepoURL) -> Pin | None:
        """The checked address of `url`'s host (None for a local repository, which has none). Raises
        RemoteAddressRefused naming the address and why, or RemoteUnavailable when the name does not resolve."""
        if url.is_local:
            return None
        host = url.host[1:-1] if url.host.startswith("[") else url.host
        port = url.port or DEFAULT_PORTS[url.scheme]
        try:
            ip = await self._outbound.check_host(host, port, timeout_s=self.timeout_s)
        except Unresolvable as exc:
            raise RemoteUnavailable(f"repository {url.url}: {exc}", url.url) from None
        except OutboundRefused as exc:
            raise RemoteAddressRefused(f"repository {url.url}: {exc}", url.url) from None
        return Pin(scheme=url.scheme, host=host, port=port, ip=ip)


def pinned_invocation(
    pin: Pin | None, url: RepoURL, auth: GitAuth, args: tuple[str, ...]
) -> tuple[list[str], list[str], Mapping[str, str]]:
    """`args` with the remote's URL as git is to be given it, plus the `-c` settings and environment of the pin."""
    if pin is None:
        return list(args), [], {}
    given = pin.git_url(url)
    return [given if a == url.url else a for a in args], pin.git_config(), pin.env(auth)


__all__ = ["ALLOW_SETTING", "Pin", "RemoteAddressPolicy", "pinned_invocation"]
