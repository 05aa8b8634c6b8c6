"""The repository address policy's pure parts: how a host spelling is read, what the pin tells git, and that the
production defaults are strict while the development stack allows its loopback git servers.

The behaviour against real git servers is in tests/repos/test_remote_addresses.py and tests/api/
test_repository_addresses.py."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from pydantic import ValidationError

from crewwork.boundary.outbound import ip_literal
from crewwork.boundary.urls import parse_repo_url
from crewwork.cli.stack import Stack
from crewwork.config import Settings
from crewwork.repos.address import Pin
from crewwork.repos.credentials import GitAuth
from crewwork.repos.git import DEFAULT_SSH_COMMAND, git_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7F.0.0.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("00000000127.0.0.1", "87.0.0.1"),  # leading zeros are octal to inet_aton, and so to git and ssh
        ("0xa9fea9fe", "169.254.169.254"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),
        ("::1", "::1"),
    ],
)
def test_every_spelling_of_an_address_is_read_as_the_resolver_reads_it(host: str, address: str) -> None:
    assert ip_literal(host) == ipaddress.ip_address(address)


@pytest.mark.parametrize("name", ["github.com", "deadbeef", "1e100.net", "cafe.be", "4294967296", "localhost", ""])
def test_names_are_names(name: str) -> None:
    assert ip_literal(name) is None


def test_the_pin_names_the_checked_address_to_each_transport() -> None:
    v4, v6 = ipaddress.ip_address("192.0.2.7"), ipaddress.ip_address("2001:db8::7")
    https = Pin("https", "git.example", 443, v4)
    assert https.git_config() == ["http.curloptResolve=git.example:443:192.0.2.7"]
    assert Pin("http", "git.example", 8080, v6).git_config() == ["http.curloptResolve=git.example:8080:[2001:db8::7]"]
    assert https.env(GitAuth()) == {}
    url = parse_repo_url("https://git.example/acme/x.git")
    assert https.git_url(url) == url.url, "http(s) keeps the name: Host, SNI and credential scopes need it"

    ssh = Pin("ssh", "git.example", 22, v4).env(GitAuth())["GIT_SSH_COMMAND"]
    assert ssh.startswith(DEFAULT_SSH_COMMAND) and ssh.endswith(
        "-o HostName=192.0.2.7 -o HostKeyAlias=git.example -o CheckHostIP=no"
    )
    keyed = GitAuth(env={"GIT_SSH_COMMAND": "ssh -F /dev/null -i /run/secrets/key"})
    ssh = Pin("ssh", "git.example", 2222, v6).env(keyed)["GIT_SSH_COMMAND"]
    assert ssh.startswith("ssh -F /dev/null -i /run/secrets/key ")
    assert "HostName=2001:db8::7" in ssh and "'HostKeyAlias=[git.example]:2222'" in ssh
    assert Pin("ssh", "git.example", 22, v4).git_config() == []

    git_url = parse_repo_url("git://git.example:9419/acme/x.git")
    assert Pin("git", "git.example", 9419, v4).git_url(git_url) == "git://192.0.2.7:9419/acme/x.git"
    assert Pin("git", "git.example", 9418, v6).git_url(parse_repo_url("git://git.example/x")) == "git://[2001:db8::7]/x"


def test_host_git_inherits_no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy"):
        monkeypatch.setenv(var, "http://10.0.0.1:3128")
    env = git_env()
    assert not {k for k in env if "proxy" in k.lower()}


def test_production_defaults_are_strict_and_the_dev_stack_allows_loopback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert Settings.model_fields["repo_allow_networks"].default == ""
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "CREWWORK_REPO_ALLOW_NETWORKS: ${CREWWORK_REPO_ALLOW_NETWORKS:-}\n" in compose
    monkeypatch.delenv("CREWWORK_REPO_ALLOW_NETWORKS", raising=False)
    assert Stack(tmp_path).env()["CREWWORK_REPO_ALLOW_NETWORKS"] == "127.0.0.0/8,::1/128"
    with pytest.raises(ValidationError, match="not an IP network"):
        Settings(repo_allow_networks="10.0.0.0/8,git.internal")
