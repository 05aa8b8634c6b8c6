"""The repository URL grammar, normalisation, credential redaction and credential scoping (pure functions)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from crewwork.boundary.urls import RepoURLError, parse_repo_url, redact_url
from crewwork.config.repos import RepoCredential, matches
from crewwork.models import RepoSpec, TenantRef
from crewwork.repos.credentials import CredentialError, Credentials, check_secret_location


@pytest.mark.parametrize(
    ("raw", "normalised", "scheme"),
    [
        ("https://GitHub.com/acme/widgets.git", "https://github.com/acme/widgets.git", "https"),
        ("https://github.com:443/acme/widgets/", "https://github.com/acme/widgets", "https"),
        ("https://git.example:8443/a//b.git", "https://git.example:8443/a/b.git", "https"),
        ("http://127.0.0.1:8080/acme/calc.git", "http://127.0.0.1:8080/acme/calc.git", "http"),
        ("ssh://git@Host.Example:22/srv/x.git", "ssh://git@host.example/srv/x.git", "ssh"),
        ("ssh://git@host:2222/srv/x.git", "ssh://git@host:2222/srv/x.git", "ssh"),
        ("git+ssh://host/x.git", "ssh://host/x.git", "ssh"),
        ("git@github.com:acme/widgets.git", "git@github.com:acme/widgets.git", "ssh"),
        ("host.example:/abs/x.git", "host.example:/abs/x.git", "ssh"),
        ("git://127.0.0.1:9418/acme/calc.git", "git://127.0.0.1/acme/calc.git", "git"),
        ("git://[::1]:9999/x.git", "git://[::1]:9999/x.git", "git"),
        ("file:///srv/git/x.git", "/srv/git/x.git", "file"),
        ("/srv/git/x.git", "/srv/git/x.git", "file"),
    ],
)
def test_accepted_urls_normalise(raw: str, normalised: str, scheme: str) -> None:
    url = parse_repo_url(raw)
    assert url.url == normalised
    assert url.scheme == scheme
    assert parse_repo_url(url.url) == url, "normalising is idempotent"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("https://user:tok123@github.com/a/b.git", "credentials"),
        ("https://ghp_abcdefabcdefabcdefabcdef@github.com/a/b.git", "credentials"),
        ("ssh://git:hunter22@host/x.git", "password"),
        ("git://user@host/x.git", "no user"),
        ("https://github.com/a/b.git?token=abc", "query"),
        ("https://github.com/a/b.git#frag", "query"),
        ("ext::sh -c touch% /tmp/pwned", "whitespace"),
        ("ext::sh", "helper"),
        ("fd::17", "helper"),
        ("ftp://host/x.git", "not supported"),
        ("ssh://-oProxyCommand=touch%20x/y", "must not start with '-'"),
        ("-upload-pack=touch", "starts with '-'"),
        ("-oProxyCommand=x:y", "starts with '-'"),
        ("git@host:-x.git", "must not start with '-'"),
        ("https://github.com/a/../b.git", "'..'"),
        ("https://github.com", "no repository path"),
        ("https://host:99999/x.git", "port"),
        ("https://exa mple.com/x.git", "whitespace"),
        ("https://host/x\n.git", "control"),
        ("file://otherhost/x.git", "local path"),
        ("https://bad_host!/x.git", "not a valid host"),
        ("git@host:x@[::1]:y.git", "read by git as the host"),
        ("ssh://git@host/x%2540%255B10.0.0.1%255D/y.git", "decode again"),
    ],
)
def test_refused_urls_say_why(raw: str, why: str) -> None:
    with pytest.raises(RepoURLError) as err:
        parse_repo_url(raw)
    assert why in str(err.value)
    for secret in ("tok123", "hunter22", "ghp_abcdefabcdefabcdefabcdef"):
        assert secret not in str(err.value)


def test_redaction_masks_user_info_in_any_text() -> None:
    text = (
        "fatal: unable to access 'https://crew:s3cr3t-token@127.0.0.1:8080/acme/x.git/': 401 and "
        "https://ghp_0123456789abcdef0123@github.com/a.git, ssh://git:pw123456@host/x, ssh://git@host/y"
    )
    out = redact_url(text)
    assert "s3cr3t-token" not in out and "ghp_0123456789abcdef0123" not in out and "pw123456" not in out
    assert "https://***@127.0.0.1:8080/acme/x.git/" in out
    assert "ssh://git:***@host/x" in out and "ssh://git@host/y" in out


def test_repo_spec_normalises_and_refuses_credentials_without_echoing_them() -> None:
    assert RepoSpec(url="HTTPS://Example.com/a/b.git/").url == "https://example.com/a/b.git"
    assert RepoSpec(url="relative/repo").url == "relative/repo", "relative paths are resolved at submission"
    with pytest.raises(ValidationError) as err:
        RepoSpec(url="https://bob:pa55word-xyz@example.com/a/b.git")
    messages = " ".join(e["msg"] for e in err.value.errors())
    assert "pa55word-xyz" not in messages and "https://***@example.com/a/b.git" in messages


def test_scope_matching_is_on_a_path_boundary() -> None:
    assert matches("https://github.com/acme/", "https://github.com/acme/widgets.git")
    assert matches("https://github.com/acme", "https://github.com/acme/widgets.git")
    assert not matches("https://github.com/acme", "https://github.com/acme-evil/widgets.git")
    assert not matches("https://github.com/acme/", "https://github.com.evil.example/acme/x.git")


def test_credentials_are_chosen_by_scope_and_tenant(tmp_path: Path) -> None:
    token = tmp_path / "tok"
    token.write_text("abcdef123456\n")
    creds = Credentials(
        {
            "org": RepoCredential(kind="https_token", match=["https://github.com/acme/"], secret_file=token),
            "repo": RepoCredential(
                kind="https_token", match=["https://github.com/acme/special.git"], secret_file=token, tenants=["t1"]
            ),
        }
    )
    special = parse_repo_url("https://github.com/acme/special.git")
    t1, t2 = TenantRef(id="t1", name="acme"), TenantRef(id="t2", name="globex")
    assert creds.select(special, t1) == "repo", "the narrower scope wins"
    assert creds.select(special, t2) == "org", "a tenant-restricted credential is skipped for other tenants"
    assert creds.select(special, None) == "org", "without a tenant only unrestricted credentials are used"
    assert creds.select(parse_repo_url("https://github.com/other/x.git"), t1) is None
    with pytest.raises(CredentialError, match="not scoped"):
        creds.select(parse_repo_url("https://gitlab.com/acme/x.git"), t1, name="org")
    with pytest.raises(CredentialError, match="not available to this tenant"):
        creds.select(special, t2, name="repo")
    auth = creds.auth_for(special, t2)
    assert "abcdef123456" not in " ".join(auth.env.keys())
    assert auth.env["GIT_CONFIG_KEY_0"] == "http.https://github.com/acme/.extraHeader"
    assert auth.redact("token abcdef123456 in a message") == "token [REDACTED] in a message"


def test_tenant_scopes_name_tenants_by_name_or_by_id(tmp_path: Path) -> None:
    """docs/repositories.md scopes credentials with `"tenants": ["acme"]`, the name `crewwork keys create --tenant
    acme` gave the tenant; its id (`tn_…`) works too, and neither admits anyone else."""
    token = tmp_path / "tok"
    token.write_text("abcdef123456\n")
    by_name = RepoCredential(
        kind="https_token", match=["https://github.com/acme/"], secret_file=token, tenants=["acme"]
    )
    by_id = RepoCredential(kind="https_token", match=["https://github.com/acme/"], secret_file=token, tenants=["tn_1"])
    url = parse_repo_url("https://github.com/acme/x.git")
    acme, other = TenantRef(id="tn_1", name="acme"), TenantRef(id="tn_2", name="acme-evil")
    for cred in (by_name, by_id):
        creds = Credentials({"c": cred})
        assert creds.select(url, acme, name="c") == "c"
        with pytest.raises(CredentialError, match="not available to this tenant"):
            creds.select(url, other, name="c")
        assert creds.select(url, other) is None and creds.select(url, None) is None
    assert not TenantRef(id="acme", name=None).in_scope(["tn_1"]) and TenantRef(id="x", name="acme").in_scope(["acme"])


def test_secret_files_a_sandbox_could_read_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CredentialError, match="sandboxes can see"):
        check_secret_location(Path("/etc/crewwork/token"))
    data = tmp_path / "data"
    with pytest.raises(CredentialError, match="sandboxes can see"):
        check_secret_location(data / "secrets" / "token", [data])
    check_secret_location(tmp_path / "elsewhere" / "token", [data])


def test_ssh_without_known_hosts_is_a_clear_error(tmp_path: Path) -> None:
    creds = Credentials({})
    with pytest.raises(CredentialError, match="known_hosts"):
        creds.auth_for(parse_repo_url("ssh://git@host/x.git"))
