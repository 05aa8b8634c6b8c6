"""Where the platform may send a request that a tenant named: the address policy for webhook URLs.

A tenant is untrusted, and the processes that call tenant-named URLs (the API's webhook deliverer) sit inside the
operator's network, next to the database, Temporal, a cloud metadata service. So a tenant-named URL is reachable
only at a *public* address, unless the operator's allowlist (`CREWWORK_OUTBOUND_ALLOW_NETWORKS`, CIDRs) says
otherwise. Refused: loopback, private (RFC 1918, ULA), link-local (169.254/16 with the metadata service, fe80::/10),
site-local (fec0::/10), multicast, reserved, unspecified, shared address space (100.64/10), documentation ranges,
and any IPv6 address that embeds one of those (IPv4-mapped `::ffff:a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`, Teredo).

The check runs when the URL is registered (a 422 naming the address) and again before every delivery, and it
pins what it checked: the name is resolved once, *every* address it resolves to must pass (a name that mixes a
public and a private address is refused), and the request then connects to the checked address with the name in
the `Host` header and in TLS SNI (so certificates are verified against the name). A DNS answer that changes
between the check and the connection (rebinding) therefore cannot move the connection to another address.

Repository remotes get the same address check from `check_host` (`crewwork.repos.address`): the same categories,
every resolved address, the checked address pinned for the git process (curl's resolve list for http(s), ssh's
`HostName` for ssh, the address itself for git://), at registration, at each submission and before every fetch,
ls-remote and push, with their own allowlist (`CREWWORK_REPO_ALLOW_NETWORKS`: an internal git server is a common
need, an internal webhook receiver is not, and allowing one should not allow the other). Local paths are not
addresses; tenant roots govern them (docs/repositories.md).

Model endpoints are not here: they come from the operator's configuration (`CREWWORK_MODEL_ENDPOINTS`); a work
item may declare its own only where the operator sets `allow_work_item_endpoints` (off by default,
`crewwork.transport.config`). Forge API URLs are operator configuration too.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_DEFAULT_PORTS = {"http": 80, "https": 443}
RESOLVE_TIMEOUT_S = 5.0


class OutboundRefused(ValueError):
    """A tenant-named URL the operator's policy does not let the platform call; the message says why."""


class Unresolvable(OutboundRefused):
    """The name does not resolve (or resolves to nothing) right now: nothing was refused on policy, and a later try
    may succeed."""


def ip_literal(host: str) -> IPAddress | None:
    """The address `host` spells, when it spells one, as the system's resolver reads it (None: it is a name).

    Beyond the canonical forms this includes every numbers-and-dots spelling `inet_aton` accepts, which is what
    getaddrinfo, curl (and so git over http) and ssh connect to: `2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`, `0`.
    Parsing them here means no resolver (an injected one included) is asked about an address in disguise."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if not host or not all(c in "0123456789abcdefABCDEFxX." for c in host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def _category(ip: IPAddress) -> str | None:
    """Why `ip` is not a public address (None: it is one)."""
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        # fec0::/10: deprecated (RFC 3879) but still routed inside some networks, and not in Python's private list.
        return "site-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_private:
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "not globally routable"
    return None


def parse_networks(text: str) -> tuple[IPNetwork, ...]:
    """Comma-separated CIDRs (a bare address is its own /32 or /128); ValueError names a bad entry."""
    nets: list[IPNetwork] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP network (CIDR such as 10.0.0.0/8 or ::1/128)") from None
    return tuple(nets)


@dataclass(frozen=True)
class Target:
    """A checked URL, pinned to the address that was checked."""

    url: str
    scheme: str
    host: str
    """The name (or literal) as the URL gave it, without brackets."""
    port: int
    ip: IPAddress

    @property
    def pinned_url(self) -> str:
        """The URL with its host replaced by the checked address (what the connection is made to)."""
        parts = urlsplit(self.url)
        host = f"[{self.ip}]" if self.ip.version == 6 else str(self.ip)
        netloc = host if parts.port is None else f"{host}:{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))

    @property
    def host_header(self) -> str:
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == _DEFAULT_PORTS.get(self.scheme) else f"{name}:{self.port}"

    def request_kwargs(self, headers: dict[str, str] | None = None) -> dict[str, Any]:
        """httpx request arguments that connect to `ip` and present the name (Host, SNI, certificate check)."""
        kw: dict[str, Any] = {"headers": {**(headers or {}), "Host": self.host_header}}
        if self.scheme == "https":
            kw["extensions"] = {"sni_hostname": self.host}
        return kw


Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]


@dataclass(frozen=True)
class OutboundPolicy:
    allow: tuple[IPNetwork, ...] = ()
    """Networks a tenant-named URL may reach although they are not public (the operator's allowlist)."""
    resolver: Resolver | None = field(default=None, compare=False)
    """How names are resolved (default: the system resolver, `getaddrinfo`); tests give a DNS that changes its
    answers, as a rebinding attacker's does."""
    allow_setting: str = "CREWWORK_OUTBOUND_ALLOW_NETWORKS"
    """The setting that holds `allow`, named in refusals so the operator knows which one to change."""

    @classmethod
    def from_settings(cls, settings: Any) -> OutboundPolicy:
        return cls(parse_networks(settings.outbound_allow_networks))

    def refusal(self, ip: IPAddress) -> str | None:
        """Why the platform may not connect to `ip`, or None."""
        if any(ip.version == n.version and ip in n for n in self.allow):
            return None
        inner = _embedded_v4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
        if inner is not None:
            if any(inner in n for n in self.allow if n.version == 4):
                return None
            why = _category(inner)
            if why is not None:
                return f"{ip} embeds the {why} address {inner}"
        why = _category(ip)
        return None if why is None else f"{ip} is a {why} address"

    async def check(self, url: str, *, timeout_s: float = RESOLVE_TIMEOUT_S) -> Target:
        """Resolve `url`'s host once, check every address, and return the target pinned to the first one.
        OutboundRefused says why when the URL may not be called (or its name does not resolve)."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise OutboundRefused("the URL must be an absolute http:// or https:// URL")
        host = parts.hostname
        try:
            port = parts.port or _DEFAULT_PORTS[scheme]
        except ValueError:
            raise OutboundRefused("the URL's port is not a number from 0 to 65535") from None
        ip = await self.check_host(host, port, timeout_s=timeout_s)
        return Target(url=url, scheme=scheme, host=host, port=port, ip=ip)

    async def check_host(self, host: str, port: int, *, timeout_s: float = RESOLVE_TIMEOUT_S) -> IPAddress:
        """The address to connect to for `host` (a name, or an address in any spelling `ip_literal` reads): the
        name is resolved once and *every* address must pass; the first is returned, for the caller to pin.
        OutboundRefused names the refused address and its category; Unresolvable when the name does not resolve."""
        literal = ip_literal(host)
        addresses = [literal] if literal is not None else await self._resolve(host, port, timeout_s)
        for ip in addresses:
            why = self.refusal(ip)
            if why is not None:
                if str(ip) == host:
                    where = ""
                else:
                    where = f"{host} is the address {ip}: " if literal is not None else f"{host} resolves to {ip}: "
                raise OutboundRefused(
                    f"{where}{why}, which this service does not connect to unless the operator allows its network "
                    f"({self.allow_setting})"
                )
        return addresses[0]

    async def _resolve(self, host: str, port: int, timeout_s: float) -> list[IPAddress]:
        if self.resolver is not None:
            try:
                found = await asyncio.wait_for(self.resolver(host, port), timeout_s)
            except (OSError, TimeoutError) as exc:
                raise Unresolvable(f"{host} does not resolve ({exc or 'timed out'})") from None
            if not found:
                raise Unresolvable(f"{host} resolves to no address")
            return found
        return await _system_resolve(host, port, timeout_s)


async def _system_resolve(host: str, port: int, timeout_s: float) -> list[IPAddress]:
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP), timeout_s
        )
    except (OSError, TimeoutError) as exc:
        raise Unresolvable(f"{host} does not resolve ({exc or 'timed out'})") from None
    except UnicodeError as exc:
        # The resolver encodes the name with IDNA first: a label over 63 characters, an empty one, or a character
        # IDNA refuses is no host name at all (a ValueError, not an OSError: it was a server error).
        raise Unresolvable(f"{host!r} is not a host name that can be looked up ({exc})") from None
    out: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if ip not in out:
            out.append(ip)
    if not out:
        raise Unresolvable(f"{host} resolves to no address")
    return out


__all__ = ["OutboundPolicy", "OutboundRefused", "Target", "Unresolvable", "ip_literal", "parse_networks"]
