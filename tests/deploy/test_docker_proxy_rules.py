"""The Docker API allowlist of the compose `docker-proxy` service is exactly wide enough for real sandbox runs.

A real docker-backend sandbox run (and its availability probe, and the orphan reaper) goes through a recording
forwarder to the real engine; every request it made must match the proxy's `-allow<METHOD>` rules from
docker-compose.yml, and calls a pool must never make (exec, build, pulls, volumes, networks, swarm) must not match.
So a change to the docker backend that needs a new endpoint fails here, not in production behind the proxy.

The rules are Go regular expressions that socket-proxy anchors with ^...$; the ones used here mean the same in
Python's `re`."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

import pytest

from crewwork.config.sandbox import SandboxSettings
from crewwork.sandbox.backends import get_sandbox
from crewwork.sandbox.base import SandboxLimits

ROOT = Path(__file__).resolve().parents[2]
DOCKER_SOCKET = "/var/run/docker.sock"
REQUEST_LINE = re.compile(rb"(GET|HEAD|POST|PUT|PATCH|DELETE) (/[^ \r\n]*) HTTP/1\.[01]\r\n")


def proxy_rules() -> dict[str, list[re.Pattern[str]]]:
    # The rules are double-quoted YAML strings in the docker-proxy service's command (only `\\` is escaped in them).
    rules: dict[str, list[re.Pattern[str]]] = {}
    for line in (ROOT / "docker-compose.yml").read_text().splitlines():
        m = re.fullmatch(r'\s*- "-allow(GET|HEAD|POST|PUT|PATCH|DELETE)=(.*)"', line)
        if m:
            rules.setdefault(m.group(1), []).append(re.compile(f"^(?:{m.group(2).replace(chr(92) * 2, chr(92))})$"))
    assert {"GET", "POST", "DELETE"} <= set(rules), rules
    return rules


def allowed(rules: dict[str, list[re.Pattern[str]]], method: str, path: str) -> bool:
    return any(r.match(path.split("?", 1)[0]) for r in rules.get(method, []))


class RecordingForwarder:
    """TCP -> Docker socket, byte for byte (so attach/hijacked streams work), noting every HTTP request line the
    client sends."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(DOCKER_SOCKET)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, record: bool) -> None:
            tail = b""
            try:
                while chunk := await src.read(65536):
                    if record:
                        buf = tail + chunk
                        for m in REQUEST_LINE.finditer(buf):
                            if m.end() > len(tail):  # not already seen in the previous chunk's tail
                                self.requests.append((m.group(1).decode(), m.group(2).decode()))
                        tail = buf[-512:]
                    dst.write(chunk)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))

    def __enter__(self) -> RecordingForwarder:
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def test_the_allowlist_refuses_what_a_pool_never_needs() -> None:
    rules = proxy_rules()
    for method, path in [
        ("POST", "/v1.41/containers/abc/exec"),
        ("POST", "/v1.41/exec/abc/start"),
        ("POST", "/v1.41/build"),
        ("POST", "/v1.41/images/create"),
        ("DELETE", "/v1.41/images/crewwork-sandbox:latest"),
        ("POST", "/v1.41/volumes/create"),
        ("POST", "/v1.41/networks/create"),
        ("GET", "/v1.41/secrets"),
        ("POST", "/v1.41/swarm/init"),
        ("POST", "/v1.41/plugins/pull"),
        ("POST", "/v1.41/containers/abc/update"),
        ("PUT", "/v1.41/containers/abc/archive"),
        ("POST", "/v1.41/commit"),
    ]:
        assert not allowed(rules, method, path), f"{method} {path} must be refused"


@pytest.mark.docker
async def test_a_real_sandbox_run_through_the_proxy_rules_needs_nothing_they_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not Path(DOCKER_SOCKET).exists():
        pytest.skip("no Docker engine (run .ci/docker-up.sh)")
    with RecordingForwarder() as fwd:
        url = f"tcp://127.0.0.1:{fwd.port}"
        monkeypatch.setenv("CREWWORK_SANDBOX_DOCKER_BASE_URL", url)
        settings = SandboxSettings(docker_base_url=url)
        from crewwork.sandbox import docker as docker_backend

        # The availability probe a pool runs before choosing the backend (uncached, through the forwarder).
        ok, why = await asyncio.to_thread(docker_backend.DockerSandbox.available, settings)
        if not ok:
            pytest.skip(f"docker sandbox unavailable: {why}")
        sandbox = get_sandbox("docker", settings=settings)
        ws = tmp_path / "ws"
        ws.mkdir()
        (ws / "x.txt").write_text("hello")
        # The reaper runs at most every few minutes per process: force it, as a long-lived pool eventually does.
        await asyncio.to_thread(docker_backend.reap_orphans, sandbox.client(), force=True)  # type: ignore[attr-defined]
        result = await sandbox.run(
            ["sh", "-c", "cat x.txt; echo out > y.txt"],
            workspace=ws,
            limits=SandboxLimits(memory_mb=128, pids=32, cpus=0.5, timeout_s=30),
        )
        assert result.exit_code == 0, result
        assert b"hello" in result.stdout and (ws / "y.txt").read_text().strip() == "out"
    rules = proxy_rules()
    assert fwd.requests, "the sandbox run made no request through the forwarder"
    refused = sorted({(m, p) for m, p in fwd.requests if not allowed(rules, m, p)})
    assert not refused, f"the docker-proxy allowlist would refuse calls a sandbox run makes: {refused}"
    made = {(m, re.sub(r"/containers/[0-9a-f]{12,64}", "/containers/ID", p.split("?")[0])) for m, p in fwd.requests}
    for call in ("/containers/create", "/containers/ID/start", "/containers/ID/wait"):
        assert any(m == "POST" and p.endswith(call) for m, p in made), (call, made)
    assert any(m == "DELETE" for m, _ in made), made
