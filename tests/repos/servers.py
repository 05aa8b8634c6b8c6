"""Real git servers on loopback for tests and benchmarks: `git daemon` (git://), smart HTTP through
`git http-backend` behind a small threaded HTTP server with basic auth (http://), and Debian's `sshd` on a high port
with its own host key and an AuthorizedKeysFile (ssh://).

Each serves the bare repositories under one directory (`root`); `url(name)` is the repository's URL.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from crewwork.boundary.outbound import parse_networks
from crewwork.repos.address import RemoteAddressPolicy
from crewwork.temporal.devserver import free_port

# The servers here listen on loopback, which the address policy refuses unless the operator allows it.
LOOPBACK = RemoteAddressPolicy(parse_networks("127.0.0.0/8,::1/128"))

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@x",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@x",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
}


def git(cwd: Path | str, *args: str, check: bool = True) -> str:
    res = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {res.stderr}")
    return res.stdout.strip()


def bare_from(work: Path, bare: Path) -> Path:
    """A bare repository `bare` holding every branch of the working repository `work`."""
    bare.parent.mkdir(parents=True, exist_ok=True)
    git(bare.parent, "clone", "--quiet", "--bare", "--no-local", str(work), str(bare))
    git(bare, "config", "http.receivepack", "true")
    return bare


def _wait_port(
    port: int, proc: subprocess.Popen[bytes] | None = None, timeout_s: float = 20, host: str = "127.0.0.1"
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {host}:{port}")


class GitDaemon:
    """`git daemon` serving `root` over git:// with push enabled."""

    def __init__(self, root: Path, log: Path) -> None:
        self.root = root
        self.port = free_port()
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def __enter__(self) -> GitDaemon:
        self.root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                "git",
                "daemon",
                f"--base-path={self.root}",
                "--export-all",
                "--enable=receive-pack",
                "--listen=127.0.0.1",
                f"--port={self.port}",
                "--reuseaddr",
                "--informative-errors",
                str(self.root),
            ],
            env=GIT_ENV,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
        )
        _wait_port(self.port, self.proc)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            if self.proc.poll() is None:
                self.proc.kill()


@dataclass
class HttpRequestLog:
    method: str
    path: str
    authorization: str | None


@dataclass
class SmartHttp:
    """Smart HTTP: `git http-backend` as a CGI program behind a threaded HTTP server requiring basic auth."""

    root: Path
    user: str = "crew"
    password: str = ""
    port: int = field(default_factory=free_port)
    requests: list[HttpRequestLog] = field(default_factory=list)
    host: str = "127.0.0.1"
    """The loopback address it listens on (`::1` for IPv6)."""
    _server: ThreadingHTTPServer | None = None

    def url(self, name: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/{name}"

    def __enter__(self) -> SmartHttp:
        backend = Path(subprocess.run(["git", "--exec-path"], capture_output=True, text=True).stdout.strip())
        expected = "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _serve(self) -> None:
                auth = self.headers.get("Authorization")
                owner.requests.append(HttpRequestLog(self.command, self.path, auth))
                if owner.password and auth != expected:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = self._body()
                path, _, query = self.path.partition("?")
                env = {
                    **GIT_ENV,
                    "GIT_PROJECT_ROOT": str(owner.root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "REQUEST_METHOD": self.command,
                    "PATH_INFO": path,
                    "QUERY_STRING": query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "REMOTE_ADDR": "127.0.0.1",
                    "REMOTE_USER": owner.user if owner.password else "",
                    "GATEWAY_INTERFACE": "CGI/1.1",
                    "SERVER_PROTOCOL": "HTTP/1.1",
                }
                for h in ("Content-Encoding", "Git-Protocol"):
                    if self.headers.get(h):
                        env["HTTP_" + h.upper().replace("-", "_")] = self.headers[h]
                res = subprocess.run([str(backend / "git-http-backend")], input=body, env=env, capture_output=True)
                head, _, payload = res.stdout.partition(b"\r\n\r\n")
                if not _:
                    head, _, payload = res.stdout.partition(b"\n\n")
                status = 200
                headers = []
                for line in head.decode(errors="replace").splitlines():
                    name, _, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.strip().split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            break
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    return b"".join(chunks)
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            do_GET = _serve
            do_POST = _serve

        server_class = ThreadingHTTPServer
        if ":" in self.host:

            class V6(ThreadingHTTPServer):
                address_family = socket.AF_INET6

            server_class = V6
        self._server = server_class((self.host, self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        _wait_port(self.port, host=self.host)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class Sshd:
    """Debian's OpenSSH server on a high loopback port: its own host key, one authorized client key, root login by
    key only. `known_hosts` and `client_key` are what crewwork's operator configuration points at."""

    def __init__(self, workdir: Path, keydir: Path) -> None:
        self.dir = workdir
        self.keydir = keydir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.known_hosts = keydir / "known_hosts"
        self.client_key = keydir / "client_ed25519"

    @staticmethod
    def available() -> tuple[bool, str]:
        if not os.path.exists("/usr/sbin/sshd"):
            return False, "sshd is not installed (apt-get install -y openssh-server; scripts/test-env.sh does it)"
        if os.geteuid() != 0:
            return False, "the sshd test server runs as root (it logs in as the current user root)"
        return True, ""

    def url(self, path: Path) -> str:
        return f"ssh://root@127.0.0.1:{self.port}{path}"

    def __enter__(self) -> Sshd:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keydir.mkdir(parents=True, exist_ok=True, mode=0o700)
        host_key = self.dir / "host_ed25519"
        for key in (host_key, self.client_key):
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        authorized = self.dir / "authorized_keys"
        shutil.copy(f"{self.client_key}.pub", authorized)
        authorized.chmod(0o600)
        host_pub = Path(f"{host_key}.pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        config = self.dir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {host_key}",
                    f"AuthorizedKeysFile {authorized}",
                    f"PidFile {self.dir / 'sshd.pid'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "PrintMotd no",
                    "AcceptEnv no",
                    "LogLevel VERBOSE",
                    "",
                ]
            )
        )
        Path("/run/sshd").mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=(self.dir / "sshd.log").open("ab"),
        )
        _wait_port(self.port, self.proc)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            if self.proc.poll() is None:
                self.proc.kill()


@contextlib.contextmanager
def all_servers(root: Path, logs: Path, password: str) -> Iterator[tuple[GitDaemon, SmartHttp]]:
    with GitDaemon(root, logs / "git-daemon.log") as daemon, SmartHttp(root, password=password) as http:
        yield daemon, http


class Listener:
    """A TCP port that accepts connections and counts them (and closes each at once): proof that nothing dialled
    an address, or that something did."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, 0), family=family)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def __enter__(self) -> Listener:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
