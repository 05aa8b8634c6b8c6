"""The grammar of repository URLs: one parser for everything a submission or a registered repository may name.

Accepted, and nothing else:

| form | example | normalised to |
|---|---|---|
| https / http | `https://GitHub.com:443/acme/widgets.git/` | `https://github.com/acme/widgets.git` |
| ssh | `ssh://git@host:2222/srv/x.git` | same, host lower-cased, port 22 dropped |
| scp-style | `git@host:acme/x.git` | kept scp-style (its path is relative to the login's home) |
| git | `git://host/x.git` | port 9418 dropped |
| file | `file:///srv/git/x.git` | the absolute path `/srv/git/x.git` |
| local path | `/srv/git/x.git`, `relative/x` (against repo roots) | the absolute path |

Refused with a reason: credentials in the URL (any user info in http(s) URLs, a password anywhere; the message shows
the URL redacted), query strings and fragments, control characters and whitespace, a host or path that starts with
`-` (an option smuggled into ssh or git), a path git would read into the host (`@[` anywhere, or a `%` left after
decoding, which git decodes again), transport helpers (`ext::`, `fd::`, `foo::url`) and every other scheme.

The normalised form is the repository's identity (mirror cache key, workspace lease key, stored `repo_url`) and
is what host-side git is given; it never holds a secret.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

Scheme = Literal["https", "http", "ssh", "git", "file"]
SCHEMES: tuple[Scheme, ...] = ("https", "http", "ssh", "git", "file")
DEFAULT_PORTS = {"https": 443, "http": 80, "ssh": 22, "git": 9418}
SCHEME_ALIASES = {"git+ssh": "ssh", "ssh+git": "ssh"}
MAX_URL_CHARS = 4096

# A DNS name or IPv4 address; IPv6 literals are bracketed and checked separately.
_HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")
_IPV6 = re.compile(r"^\[[0-9A-Fa-f:.]+\]$")
_USER = re.compile(r"^[A-Za-z0-9._~-]{1,64}$")
# scp-style: [user@]host:path where the first colon comes before any slash (git's own rule).
_SCP = re.compile(r"^(?:(?P<user>[^@/:]+)@)?(?P<host>\[[^\]/]+\]|[^@/:\[\]]+):(?P<path>.*)$", re.S)
_CONTROL = re.compile(r"[\x00-\x20\x7f]")
# git's remote-helper syntax `<transport>::<address>` (`ext::sh -c ...` runs a command).
_HELPER = re.compile(r"^[A-Za-z0-9+.-]+::")
# `user:pass@` or `token@` right after a scheme, anywhere in a text: what redaction looks for.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]{0,20}://)(?P<info>[^/@\s\"'<>]*)@")


class RepoURLError(ValueError):
    """The URL is not one crewwork accepts; the message says why and never contains a secret."""


@dataclass(frozen=True)
class RepoURL:
    scheme: Scheme
    host: str
    """Lower-cased host ("" for local repositories); IPv6 literals keep their brackets."""
    port: int | None
    """Only when not the scheme's default."""
    user: str | None
    """The ssh login (`git` in `git@host:x`); never set for http(s)."""
    path: str
    """The path on the server (for local repositories: the absolute local path)."""
    scp: bool = False

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    @property
    def local_path(self) -> Path:
        if not self.is_local:
            raise ValueError(f"{self.url} is not a local repository")
        return Path(self.path)

    @property
    def url(self) -> str:
        """The normalised URL (the repository's identity, and what git is given). Holds no secret."""
        if self.is_local:
            return self.path
        user = f"{self.user}@" if self.user else ""
        if self.scp:
            return f"{user}{self.host}:{self.path}"
        port = f":{self.port}" if self.port else ""
        return f"{self.scheme}://{user}{self.host}{port}{self.path}"

    @property
    def origin(self) -> str:
        """scheme://host[:port]: what an operator allowlist or credential scope names."""
        if self.is_local:
            return "file://"
        port = f":{self.port}" if self.port else ""
        scheme = "ssh" if self.scp else self.scheme
        return f"{scheme}://{self.host}{port}"

    @property
    def owner_and_name(self) -> tuple[str, str] | None:
        """The last two path segments without `.git` (`acme`, `widgets`): a forge's repository name."""
        parts = [p for p in self.path.strip("/").split("/") if p and p != "~"]
        if len(parts) < 2:
            return None
        name = parts[-1][:-4] if parts[-1].endswith(".git") else parts[-1]
        return parts[-2], name

    def __str__(self) -> str:
        return self.url


def parse_repo_url(raw: str, *, roots: list[Path] | None = None, must_exist: bool = False) -> RepoURL:
    """Parse and normalise a repository URL or local path (see the module docstring for the grammar).

    `roots` (the operator's `CREWWORK_REPO_ROOTS`) resolve relative local paths and confine local ones; with
    `must_exist`, a local path must be an existing directory. Raises RepoURLError naming the problem."""
    if not isinstance(raw, str) or not raw:
        raise RepoURLError("repository URL is empty")
    if len(raw) > MAX_URL_CHARS:
        raise RepoURLError(f"repository URL is longer than {MAX_URL_CHARS} characters")
    shown = redact_url(raw)
    if _CONTROL.search(raw):
        raise RepoURLError(f"repository URL {shown!r} contains whitespace or control characters")
    if raw.startswith("-"):
        raise RepoURLError(f"repository URL {shown!r} starts with '-'")
    if _HELPER.match(raw):
        raise RepoURLError(f"repository URL {shown!r}: git transport helpers (`helper::address`) are not allowed")
    if "://" in raw:
        return _parse_scheme_url(raw, shown, roots, must_exist)
    scp = _SCP.match(raw)
    if scp and not raw.startswith(("/", "./", "../")) and not _is_windows_drive(raw):
        return _parse_scp(scp, shown)
    return _local(raw, shown, roots, must_exist)


def _is_windows_drive(raw: str) -> bool:
    return len(raw) >= 2 and raw[1] == ":" and raw[0].isalpha() and (len(raw) == 2 or raw[2] in "\\/")


def _parse_scheme_url(raw: str, shown: str, roots: list[Path] | None, must_exist: bool) -> RepoURL:
    scheme_raw = raw.split("://", 1)[0].lower()
    scheme = SCHEME_ALIASES.get(scheme_raw, scheme_raw)
    if scheme not in SCHEMES:
        allowed = ", ".join(f"{s}://" for s in SCHEMES)
        raise RepoURLError(f"repository URL {shown!r}: scheme {scheme_raw!r} is not supported (use {allowed})")
    try:
        parts = urlsplit(raw)
    except ValueError as exc:
        raise RepoURLError(f"repository URL {shown!r} is malformed: {exc}") from exc
    if parts.query or parts.fragment or "?" in raw or "#" in raw:
        raise RepoURLError(f"repository URL {shown!r}: query strings and fragments are not allowed")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise RepoURLError(f"repository URL {shown!r}: file:// URLs name a local path (file:///path)")
        return _local(unquote(parts.path), shown, roots, must_exist, from_file_url=True)
    netloc = parts.netloc
    user: str | None = None
    if "@" in netloc:
        info, netloc = netloc.rsplit("@", 1)
        if scheme in ("https", "http"):
            raise RepoURLError(
                f"repository URL {shown!r} carries credentials; http(s) URLs must not hold user info. "
                "Credentials are operator-held and referenced by name (docs/repositories.md)"
            )
        if ":" in info:
            raise RepoURLError(
                f"repository URL {shown!r} carries a password; credentials are operator-held (docs/repositories.md)"
            )
        if scheme == "git":
            raise RepoURLError(f"repository URL {shown!r}: git:// URLs have no user")
        user = _check_user(unquote(info), shown)
    host, port = _split_host_port(netloc, shown)
    path = unquote(parts.path)
    if "%" in path:
        # git decodes the %-escapes of ssh:// and git:// URLs again, after ours: `%2540%255B` would be `@[` to it.
        raise RepoURLError(
            f"repository URL {shown!r}: the path holds a '%' after decoding, which git would decode again (and "
            "could read as the host)"
        )
    if not path or path == "/":
        raise RepoURLError(f"repository URL {shown!r} names no repository path")
    path = _check_path(path, shown)
    if port == DEFAULT_PORTS[scheme]:
        port = None
    return RepoURL(scheme=scheme, host=host, port=port, user=user, path=path)  # type: ignore[arg-type]


def _parse_scp(m: re.Match[str], shown: str) -> RepoURL:
    user = _check_user(m.group("user"), shown) if m.group("user") is not None else None
    host = _check_host(m.group("host"), shown)
    path = m.group("path")
    if not path:
        raise RepoURLError(f"repository URL {shown!r} names no repository path")
    if path.startswith("-"):
        raise RepoURLError(f"repository URL {shown!r}: the path must not start with '-'")
    path = _check_path(path, shown, absolute=False)
    return RepoURL(scheme="ssh", host=host, port=None, user=user, path=path, scp=True)


def _split_host_port(netloc: str, shown: str) -> tuple[str, int | None]:
    port: int | None = None
    host = netloc
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise RepoURLError(f"repository URL {shown!r}: unterminated IPv6 address")
        host, rest = netloc[: end + 1], netloc[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise RepoURLError(f"repository URL {shown!r}: junk after the IPv6 address")
            port = _port(rest[1:], shown)
    elif ":" in netloc:
        host, port_s = netloc.rsplit(":", 1)
        port = _port(port_s, shown) if port_s else None
    return _check_host(host, shown), port


def _port(s: str, shown: str) -> int:
    if not s.isdigit() or not 0 < int(s) < 65536:
        raise RepoURLError(f"repository URL {shown!r}: port {s!r} is not a number from 1 to 65535")
    return int(s)


def _check_host(host: str, shown: str) -> str:
    if not host:
        raise RepoURLError(f"repository URL {shown!r} names no host")
    if host.startswith("-"):
        raise RepoURLError(f"repository URL {shown!r}: the host must not start with '-'")
    if not (_HOST.match(host) or _IPV6.match(host)) or ".." in host:
        raise RepoURLError(f"repository URL {shown!r}: {host!r} is not a valid host name")
    if host.startswith("["):
        # Only an IPv6 address between brackets: git reads `[host:port]` in scp-style URLs as a host and a port.
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise RepoURLError(
                f"repository URL {shown!r}: {host!r} is not a valid host (brackets hold an IPv6 address only)"
            ) from None
    return host.lower()


def _check_user(user: str, shown: str) -> str:
    if not _USER.match(user) or user.startswith("-"):
        raise RepoURLError(f"repository URL {shown!r}: {user!r} is not a valid ssh login name")
    return user


def _check_path(path: str, shown: str, *, absolute: bool = True) -> str:
    if _CONTROL.search(path) or "\\" in path:
        raise RepoURLError(f"repository URL {shown!r}: the path contains control characters or backslashes")
    # git's URL parser reads past the host: it takes `@[...]` anywhere after the scheme as the host (an IPv6
    # literal after a login), so git would dial a host that was never judged (crewwork.repos.address).
    if "@[" in path:
        raise RepoURLError(f"repository URL {shown!r}: '@[' in the path would be read by git as the host")
    segments = path.split("/")
    if any(s == ".." for s in segments):
        raise RepoURLError(f"repository URL {shown!r}: the path must not contain '..'")
    if absolute and not path.startswith("/"):
        path = "/" + path
    path = re.sub(r"/{2,}", "/", path)
    return path.rstrip("/") or "/"


def _local(raw: str, shown: str, roots: list[Path] | None, must_exist: bool, from_file_url: bool = False) -> RepoURL:
    roots = roots or []
    candidate = Path(raw)
    if not candidate.is_absolute():
        if from_file_url:
            raise RepoURLError(f"repository URL {shown!r}: file:// URLs need an absolute path")
        if not roots:
            raise RepoURLError(
                f"repository {shown!r} is a relative path; use an absolute path (no CREWWORK_REPO_ROOTS is configured)"
            )
        for root in roots:
            resolved = (root / candidate).resolve()
            if resolved.is_relative_to(root) and resolved.exists():
                return _local_checked(resolved, shown, must_exist)
        raise RepoURLError(f"repository {shown!r} is not a repository under any allowed root (or it escapes them)")
    resolved = candidate.resolve()
    if roots and not any(resolved.is_relative_to(r) for r in roots):
        allowed = ", ".join(str(r) for r in roots)
        raise RepoURLError(f"repository {shown!r} is outside the allowed repository roots ({allowed})")
    return _local_checked(resolved, shown, must_exist)


def _local_checked(path: Path, shown: str, must_exist: bool) -> RepoURL:
    if must_exist:
        if not path.exists():
            raise RepoURLError(f"repository {shown!r}: no such directory")
        if not path.is_dir():
            raise RepoURLError(f"repository {shown!r}: not a directory")
        if not ((path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())):
            raise RepoURLError(f"repository {shown!r}: not a git repository")
    return RepoURL(scheme="file", host="", port=None, user=None, path=str(path))


def redact_url(text: str) -> str:
    """Mask user info after any `scheme://` in `text`: all of it for http(s) (a token is often the user name),
    the password part elsewhere (`ssh://git:***@host`). Safe on any text, not only URLs."""

    def _mask(m: re.Match[str]) -> str:
        scheme, info = m.group("scheme"), m.group("info")
        if scheme.lower().startswith("http"):
            return f"{scheme}***@"
        if ":" not in info:
            return m.group(0)
        return f"{scheme}{info.split(':', 1)[0]}:***@"

    return _USERINFO.sub(_mask, text)
