"""Repository remotes reach only addresses the operator allows, judged by what git would connect to and pinned for
the git process, so neither a spelling of an internal address nor a DNS answer that changes can steer host git.

Real git servers on loopback (git daemon, http-backend behind a threaded HTTP server, sshd) and plain TCP listeners
that count connections (the proof that nothing was dialled). The DNS is injected, as in tests/api/
test_webhook_outbound.py: `Repositories(settings, resolver=...)` / `RemoteAddressPolicy(resolver=...)` take a
function whose answers the test changes, as a rebinding attacker's DNS server does. Its names (`gitbox.test`) exist
nowhere else: the system resolver cannot find them, so a git process that works with one can only have connected
to the address crewwork checked and pinned."""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from crewwork.boundary.outbound import parse_networks
from crewwork.boundary.urls import RepoURLError, parse_repo_url
from crewwork.config import Settings
from crewwork.config.repos import RepoCredential
from crewwork.repos.address import RemoteAddressPolicy
from crewwork.repos.credentials import Credentials
from crewwork.repos.git import RemoteAccessDenied, RemoteAddressRefused, RemoteError, RemoteUnavailable
from crewwork.repos.landing import land_by_push
from crewwork.repos.mirror import MirrorCache
from crewwork.repos.registration import RepoAddressRefused, RepoPolicyError
from crewwork.repos.remote import Remote
from crewwork.repos.worker import Repositories
from tests.repos.addresses import INTERNAL, NAME, Dns, spell
from tests.repos.conftest import Served
from tests.repos.servers import GitDaemon, Listener, SmartHttp, Sshd, git
from tests.repos.test_remotes import RIGHT_DIFF, _roundtrip


@pytest.fixture
def listeners() -> Iterator[tuple[Listener, Listener]]:
    with Listener("127.0.0.1") as v4, Listener("::1") as v6:
        yield v4, v6


def settings_for(tmp_path: Path, allow: str) -> Settings:
    return Settings(data_dir=tmp_path / "data", repo_allow_networks=allow)


@pytest.mark.parametrize(("template", "category"), INTERNAL)
async def test_every_internal_spelling_is_refused_before_git_runs(
    template: str, category: str, listeners: tuple[Listener, Listener], tmp_path: Path
) -> None:
    url = parse_repo_url(spell(template, listeners))
    remote = Remote(url=url, address=RemoteAddressPolicy(), timeout_s=10)
    with pytest.raises(RemoteAddressRefused, match=category) as err:
        await remote.ls_remote()
    assert "CREWWORK_REPO_ALLOW_NETWORKS" in str(err.value) and url.url in str(err.value)
    with pytest.raises(RemoteAddressRefused):
        await MirrorCache(tmp_path / "mirrors").ensure(remote)
    # The registration / submission check says the same, as a policy error a tenant can read.
    with pytest.raises(RepoAddressRefused, match=category):
        await Repositories(settings_for(tmp_path, "")).check(url.url, "main")
    assert (listeners[0].connections, listeners[1].connections) == (0, 0)
    assert not list((tmp_path / "mirrors").glob("*.git"))


async def test_a_name_is_refused_when_any_of_its_addresses_is_internal(tmp_path: Path) -> None:
    dns = Dns(gitbox_test=["93.184.216.34", "169.254.169.254"])
    repos = Repositories(settings_for(tmp_path, ""), resolver=dns)
    with pytest.raises(RepoAddressRefused, match=r"gitbox\.test resolves to 169\.254\.169\.254: .* link-local"):
        await repos.check(f"https://{NAME}/acme/calc.git", "main")
    # Allowing one network opens only that network.
    dns.answers[NAME] = ["127.0.0.1", "10.0.0.1"]
    repos = Repositories(settings_for(tmp_path, "127.0.0.0/8"), resolver=dns)
    with pytest.raises(RepoAddressRefused, match=r"10\.0\.0\.1 is a private address"):
        await repos.check(f"ssh://git@{NAME}/acme/calc.git", "main")


async def test_a_name_that_does_not_resolve_is_unavailable_and_runs_no_git(tmp_path: Path) -> None:
    remote = Remote(url=parse_repo_url(f"https://{NAME}/acme/calc.git"), address=RemoteAddressPolicy(resolver=Dns()))
    with pytest.raises(RemoteUnavailable, match="does not resolve") as err:
        await remote.ls_remote()
    assert err.value.retryable


# ---------------------------------------------------------------- pinning: git connects to the checked address


def _pinned(url: str, allow: str = "127.0.0.1/32", **kw: object) -> Remote:
    dns = Dns(gitbox_test=["127.0.0.1"])
    return Remote(url=parse_repo_url(url), address=RemoteAddressPolicy(parse_networks(allow), resolver=dns), **kw)  # type: ignore[arg-type]


async def test_git_daemon_by_a_name_only_the_checked_answer_knows(
    daemon: GitDaemon, served: Served, tmp_path: Path
) -> None:
    remote = _pinned(f"git://{NAME}:{daemon.port}/{served.name}")
    await _roundtrip(remote, served, MirrorCache(tmp_path / "mirrors"), tmp_path)


async def test_smart_http_by_a_name_only_the_checked_answer_knows_keeps_name_scoped_credentials(
    smart_http: SmartHttp, served: Served, tmp_path: Path, secret_dir: Path, http_password: str
) -> None:
    token = secret_dir / "http-token"
    token.write_text(http_password + "\n")
    url = parse_repo_url(f"http://{NAME}:{smart_http.port}/{served.name}")
    creds = Credentials(
        {
            "http": RepoCredential(
                kind="https_token", match=[f"http://{NAME}:{smart_http.port}/"], secret_file=token, username="crew"
            )
        }
    )
    remote = _pinned(url.url, auth=creds.auth_for(url))
    await _roundtrip(remote, served, MirrorCache(tmp_path / "mirrors"), tmp_path)
    # The credential is scoped to the name and still sent: the URL git is given keeps the name.
    assert smart_http.requests and all(r.authorization for r in smart_http.requests[1:])


async def test_an_ipv6_answer_is_pinned_too(served: Served, tmp_path: Path) -> None:
    with SmartHttp(served.root, host="::1") as server:
        remote = Remote(
            url=parse_repo_url(f"http://{NAME}:{server.port}/{served.name}"),
            address=RemoteAddressPolicy(parse_networks("::1/128"), resolver=Dns(gitbox_test=["::1"])),
        )
        await _roundtrip(remote, served, MirrorCache(tmp_path / "mirrors"), tmp_path)
        assert server.requests


def _ssh_by_name(sshd: Sshd, served: Served, known_hosts: Path, allow: str = "127.0.0.1/32") -> Remote:
    url = parse_repo_url(f"ssh://root@{NAME}:{sshd.port}{served.bare}")
    creds = Credentials(
        {
            "deploy": RepoCredential(
                kind="ssh_key",
                match=[f"ssh://root@{NAME}:{sshd.port}/"],
                secret_file=sshd.client_key,
                known_hosts=known_hosts,
            )
        }
    )
    return _pinned(url.url, allow=allow, auth=creds.auth_for(url), timeout_s=30)


async def test_sshd_by_a_name_only_the_checked_answer_knows_checks_the_names_host_key(
    sshd: Sshd, served: Served, tmp_path: Path, secret_dir: Path
) -> None:
    # The operator's known_hosts records the server under its name (as ssh-keyscan gitbox.test would).
    by_name = secret_dir / "known_hosts_by_name"
    by_name.write_text(sshd.known_hosts.read_text().replace("[127.0.0.1]", f"[{NAME}]"))
    await _roundtrip(_ssh_by_name(sshd, served, by_name), served, MirrorCache(tmp_path / "mirrors"), tmp_path)
    # The key is checked against the *name* the tenant gave, not the address it was pinned to: a known_hosts that
    # knows only the address (a key for 127.0.0.1 is not a key for gitbox.test) refuses the server.
    with pytest.raises(RemoteAccessDenied, match=r"(?i)host key"):
        await _ssh_by_name(sshd, served, sshd.known_hosts).ls_remote()


# ---------------------------------------------------------------- rebinding and a name that moved after registration


async def test_a_name_rebound_inside_after_registration_is_refused_at_fetch_and_at_push(
    served: Served, tmp_path: Path
) -> None:
    dns = Dns(gitbox_test=["127.0.0.1"])
    repos = Repositories(settings_for(tmp_path, "127.0.0.1/32"), resolver=dns)
    with SmartHttp(served.root) as server:
        # Registration's check: the name answers with an allowed address, and the remote has the ref.
        url, commit = await repos.check(f"http://{NAME}:{server.port}/{served.name}", "main")
        assert commit == git(served.bare, "rev-parse", "main")
        seen = len(server.requests)
        # TTL 0: the next answer is the operator's network. The worker checks again and refuses before git runs.
        for inside in (["10.0.0.1"], ["127.0.0.1", "169.254.169.254"], ["::ffff:10.0.0.1"]):
            dns.answers[NAME] = inside
            with pytest.raises(RemoteAddressRefused, match=r"(private|link-local) address") as err:
                await repos.hold(url.url, commit)
            assert not err.value.retryable, "a refused address is policy: retrying cannot help"
        assert len(server.requests) == seen, "no request reached any server after the name moved"
        assert not list(repos.mirrors.root.glob("*.git"))
        # Back to the allowed answer: the worker fetches. Then the name moves again before the landing's push.
        dns.answers[NAME] = ["127.0.0.1"]
        hold = await repos.hold(url.url, commit)
        hold.release()
        dns.answers[NAME] = ["10.0.0.1"]
        seen = len(server.requests)
        with pytest.raises(RemoteAddressRefused, match=r"10\.0\.0\.1 is a private address"):
            await land_by_push(
                repos.mirrors,
                repos.remote(url),
                work_item_id="wi1",
                base_commit=commit,
                diff=RIGHT_DIFF,
                message="fix\n",
                scratch=tmp_path / "scratch",
            )
        assert len(server.requests) == seen
    assert not git(served.bare, "rev-parse", "--verify", "--quiet", "refs/heads/crewwork/wi1", check=False)


async def test_a_proxy_in_the_workers_environment_does_not_carry_git_elsewhere(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy resolves and connects on its own: the checked, pinned address would not be the one connected to.
    with Listener("127.0.0.1") as proxy, SmartHttp(served.root) as server:
        for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
            monkeypatch.setenv(var, f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("no_proxy", "")
        repos = Repositories(settings_for(tmp_path, "127.0.0.1/32"), resolver=Dns(gitbox_test=["127.0.0.1"]))
        url, commit = await repos.check(f"http://{NAME}:{server.port}/{served.name}", "main")
        (await repos.hold(url.url, commit)).release()
        assert proxy.connections == 0 and server.requests


async def test_a_redirect_cannot_carry_git_to_an_address_that_was_never_checked(tmp_path: Path) -> None:
    # A guard of what was already so (http.followRedirects=false): a remote at an allowed address that answers with
    # a redirect to another one (127.0.0.2 here, outside the allowlist) does not get git there.
    with Listener("127.0.0.2") as elsewhere:

        class Redirect(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.2:{elsewhere.port}{self.path}")
                self.send_header("Content-Length", "0")
                self.end_headers()

        server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            remote = _pinned(f"http://{NAME}:{server.server_address[1]}/acme/calc.git", timeout_s=20)
            with pytest.raises(RemoteError):
                await remote.ls_remote()
        finally:
            server.shutdown()
            server.server_close()
        assert elsewhere.connections == 0


async def test_local_paths_are_governed_by_roots_not_by_the_address_policy(served: Served, tmp_path: Path) -> None:
    repos = Repositories(settings_for(tmp_path, ""), resolver=Dns())
    url, commit = await repos.check(str(served.bare), "main")
    assert url.is_local and commit == git(served.bare, "rev-parse", "main")
    (await repos.hold(url.url, commit)).release()
    with pytest.raises(RepoPolicyError, match="outside the allowed repository roots"):
        await Repositories(
            Settings(data_dir=tmp_path / "d2", repo_allow_networks="", repo_roots=str(tmp_path / "elsewhere"))
        ).check(str(served.bare), "main")


# ---------------------------------------------------------------- git reads the host that was judged

# Spellings whose path git reads into the host: git's URL parser looks for "@[" anywhere after the scheme (an IPv6
# literal after a login, `user@[::1]`), and decodes %-escapes of ssh:// and git:// URLs once more after crewwork's
# own decoding. Ordinary spellings are here too: git must read them as crewwork does.
READ_BY_GIT = [
    "ssh://git@gitbox.test:2222/x@[127.0.0.1]/y",
    "git@gitbox.test:x@[127.0.0.1]:y",
    "ssh://git@gitbox.test/x%2540%255B10.0.0.1%255D/y",
    "git://gitbox.test/x@[127.0.0.1]/y",
    "git://gitbox.test:9999/x%2540%255B127.0.0.1%255D/y",
    "git@[127.0.0.1:2222]:acme/calc.git",  # git reads [host:port] in scp-style: host 127.0.0.1, port 2222
    "ssh://git@gitbox.test:2222/acme/calc.git",
    "ssh://git@gitbox.test/a@b/calc.git",
    "git@gitbox.test:acme/calc.git",
    "git@[::1]:acme/calc.git",
    "git://gitbox.test/acme/calc.git",
    "git://[::1]:9999/acme/c@lc.git",
]


@pytest.mark.parametrize("raw", READ_BY_GIT)
def test_git_reads_the_host_that_was_judged(raw: str, tmp_path: Path) -> None:
    """The pins hold the connection to the checked address, but the host git reads from the URL it is given must be
    the one judged too: for git:// it is the one git resolves and dials itself, and for ssh the destination ssh
    would connect to without `HostName`. Read here from git itself (an ssh that records its arguments; git's own
    message naming the git:// host it looked up); a spelling git would read otherwise is refused, saying so."""
    try:
        url = parse_repo_url(raw)
    except RepoURLError as exc:
        assert "host" in str(exc)
        return
    judged = url.host.strip("[]")
    recorder = tmp_path / "ssh"
    recorder.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/argv\nexit 1\n')
    recorder.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1", "GIT_SSH_COMMAND": str(recorder)}
    res = subprocess.run(
        ["git", "-c", "protocol.allow=always", "ls-remote", "--", url.url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if url.scheme == "ssh":
        argv = (tmp_path / "argv").read_text().splitlines()
        destination = argv[next(i for i, a in enumerate(argv) if a.startswith("git-upload-pack")) - 1]
        read = destination.rsplit("@", 1)[-1]  # ssh takes the host after the last '@'
    else:
        m = re.search(r"unable to look up (.*) \(port \d+\)", res.stderr) or re.search(
            r"unable to connect to (\S+):", res.stderr
        )
        assert m, res.stderr
        read = m.group(1).strip("[]")
    assert read == judged, f"git reads the host of {url.url} as {read!r}; crewwork judged {judged!r}"
