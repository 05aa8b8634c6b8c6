"""Choosing a backend and its limits: the unsafe backend is opt-in, maximums hold, errors say how to fix."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from crewwork.config.sandbox import SandboxSettings, resolve_limits
from crewwork.models import SandboxSpec
from crewwork.sandbox.backends import SANDBOXES, best_available, get_sandbox
from crewwork.sandbox.base import SandboxLimits, SandboxRunResult, SandboxUnavailable
from crewwork.sandbox.cli import main as cli_main


def test_local_backend_is_refused_without_allow_unsafe() -> None:
    with pytest.raises(ValueError, match="unsafe"):
        get_sandbox("local")
    assert get_sandbox("local", allow_unsafe=True).name == "local"


def test_unknown_backend_is_rejected_with_the_known_names() -> None:
    with pytest.raises(ValueError, match="gvisor, docker, bwrap, local"):
        get_sandbox("chroot")


async def test_local_backend_labels_results_unsafe_and_still_times_out(tmp_path: Path) -> None:
    sandbox = get_sandbox("local", allow_unsafe=True)
    r = await sandbox.run(
        ["python", "-c", "import os; print(os.getcwd()); import time; time.sleep(30)"],
        workspace=tmp_path,
        limits=SandboxLimits(timeout_s=1.0),
    )
    assert not r.isolated and r.backend == "local"
    assert r.timed_out and r.killed_by_signal == 9
    assert r.report().isolated is False


async def test_local_backend_does_not_pass_the_worker_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREWWORK_FAKE_SECRET", "do-not-leak")
    r = await get_sandbox("local", allow_unsafe=True).run(
        ["env"], workspace=tmp_path, limits=SandboxLimits(timeout_s=10)
    )
    assert r.exit_code == 0 and b"do-not-leak" not in r.stdout


def test_resolve_limits_rejects_values_above_the_operator_maximum() -> None:
    settings = SandboxSettings(max_memory_mb=2048, max_pids=100, max_cpus=2.0, max_timeout_s=60, pids=50, timeout_s=30)
    with pytest.raises(ValueError, match=r"memory_mb=4096 MiB exceeds the operator maximum of 2048"):
        resolve_limits(SandboxSpec(memory_mb=4096), settings)
    with pytest.raises(ValueError, match="pids=101"):
        resolve_limits(SandboxSpec(pids=101), settings)
    with pytest.raises(ValueError, match=r"cpus=3\.0"):
        resolve_limits(SandboxSpec(cpus=3.0), settings)
    with pytest.raises(ValueError, match="timeout_s=61"):
        resolve_limits(None, settings, timeout_s=61)


def test_resolve_limits_takes_requests_over_defaults() -> None:
    settings = SandboxSettings(memory_mb=512, pids=64, cpus=1.0, timeout_s=100)
    limits = resolve_limits(SandboxSpec(memory_mb=2048, cpus=2.0), settings, timeout_s=30)
    assert (limits.memory_mb, limits.pids, limits.cpus, limits.timeout_s) == (2048, 64, 2.0, 30.0)
    assert resolve_limits(None, settings) == settings.default_limits()


def test_settings_come_from_the_environment_and_defaults_respect_maximums(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CREWWORK_SANDBOX_MEMORY_MB", "300")
    monkeypatch.setenv("CREWWORK_SANDBOX_DOCKER_RUNTIME", "runsc")
    settings = SandboxSettings()
    assert settings.memory_mb == 300 and settings.docker_runtime == "runsc"
    monkeypatch.setenv("CREWWORK_SANDBOX_MEMORY_MB", "99999")
    with pytest.raises(ValueError, match="above CREWWORK_SANDBOX_MAX_MEMORY_MB"):
        SandboxSettings()


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="pids must be positive"):
        SandboxLimits(pids=0)


def test_report_keeps_only_bounded_tails() -> None:
    r = SandboxRunResult(
        backend="bwrap", isolated=True, exit_code=1, duration_s=0.5, stdout=b"a" * 10_000, stderr=b"\xff" * 3
    )
    report = r.report(tail_bytes=16)
    assert report.stdout_tail == "a" * 16
    assert report.stderr_tail == "\ufffd" * 3
    assert r.cause == "exit" and not r.ok


def test_best_available_picks_an_isolating_backend_or_explains_how_to_get_one() -> None:
    name, why = best_available(SandboxSettings())
    assert name in SANDBOXES
    if name == "local":
        assert "install" in why
    else:
        assert SANDBOXES[name].isolating and SANDBOXES[name].available()[0]
        order = ["gvisor", "docker", "bwrap"]
        assert all(not SANDBOXES[n].available()[0] for n in order[: order.index(name)])


def test_configured_backend_that_cannot_run_is_reported_not_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxUnavailable, match="Docker engine"):
        best_available(SandboxSettings(backend="docker"))


@pytest.mark.docker
async def test_missing_image_is_unavailable_with_a_build_hint(tmp_path: Path) -> None:
    ok, why = SANDBOXES["docker"].available()
    if not ok:
        pytest.skip(f"docker not available: {why} (run `.ci/docker-up.sh` as root)")
    # Availability is judged with the settings given: the missing image is refused before any run.
    with pytest.raises(SandboxUnavailable, match="build-image"):
        get_sandbox("docker", settings=SandboxSettings(docker_image="crewwork-no-such-image:nope"))


def test_cli_run_prints_the_typed_result_and_returns_the_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ok, why = SANDBOXES["bwrap"].available()
    if not ok:
        pytest.skip(f"bwrap not available: {why} (apt-get install -y bubblewrap)")
    argv = ["sandbox", "run", "--backend", "bwrap", "--memory", "128", "--pids", "32", "--timeout", "20"]
    code = cli_main([*argv, "--workspace", str(tmp_path), "--json", "--", "sh", "-c", "echo hello; exit 7"])
    assert code == 7
    out = json.loads(capsys.readouterr().out)
    assert out["backend"] == "bwrap" and out["exit_code"] == 7 and out["stdout_tail"] == "hello\n"
    assert out["cause"] == "exit" and out["isolated"] is True


def test_cli_run_refuses_limits_above_maximums_and_local_without_unsafe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["sandbox", "run", "--memory", "999999", "--", "true"]) == 2
    assert "operator maximum" in capsys.readouterr().err
    assert cli_main(["sandbox", "run", "--backend", "local", "--workspace", str(tmp_path), "--", "true"]) == 2
    assert "unsafe" in capsys.readouterr().err
    code = cli_main(["sandbox", "run", "--backend", "local", "--unsafe", "--workspace", str(tmp_path), "--", "true"])
    assert code == 0
    assert "UNSAFE" in capsys.readouterr().err


def test_cli_check_lists_every_backend(capsys: pytest.CaptureFixture[str]) -> None:
    cli_main(["sandbox", "check", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert [b["backend"] for b in out["backends"]] == list(SANDBOXES)


@pytest.mark.docker
def test_image_builds_locally_without_a_registry() -> None:
    ok, why = SANDBOXES["docker"].available()
    if not ok:
        pytest.skip(f"docker not available: {why} (run `.ci/docker-up.sh` as root)")
    import docker

    from crewwork.sandbox.image import build_image

    name = f"crewwork-sandbox-test:{os.getpid()}"
    started = time.monotonic()
    image_id = build_image(name)
    try:
        assert time.monotonic() - started < 120
        client = docker.from_env()
        out = client.containers.run(
            name, ["python", "-m", "pytest", "--version"], remove=True, network_mode="none", stderr=True
        )
        assert b"pytest" in out
    finally:
        docker.from_env().images.remove(image_id, force=True)


async def test_bwrap_without_cgroups_falls_back_to_rlimits_and_says_so(tmp_path: Path) -> None:
    ok, why = SANDBOXES["bwrap"].available()
    if not ok:
        pytest.skip(f"bwrap not available: {why} (apt-get install -y bubblewrap)")
    sandbox = get_sandbox("bwrap", settings=SandboxSettings(bwrap_cgroups=False))
    hog = "chunks = []\nwhile True:\n    chunks.append(b'x' * (16 * 1024 * 1024))\n"
    r = await sandbox.run(["python3", "-c", hog], workspace=tmp_path, limits=SandboxLimits(memory_mb=128, timeout_s=20))
    assert r.enforcement.startswith("rlimit")
    # An address-space rlimit makes allocation fail inside the program instead of summoning the OOM killer.
    assert r.exit_code != 0 and b"MemoryError" in r.stderr
    assert not r.timed_out


def test_each_backend_gets_its_own_config_class_by_type() -> None:
    from crewwork.config.sandbox import BwrapConfig, DockerConfig, LocalConfig

    s = SandboxSettings(docker_image="python:3.11-slim", docker_base_url="unix:///nowhere.sock", bwrap_seccomp=False)
    docker = s.backend_config("docker")
    assert isinstance(docker, DockerConfig) and docker.image == "python:3.11-slim"
    assert docker.base_url == "unix:///nowhere.sock"
    assert isinstance(s.backend_config("gvisor"), DockerConfig)
    bwrap = s.backend_config("bwrap")
    assert isinstance(bwrap, BwrapConfig) and bwrap.seccomp is False
    assert isinstance(s.backend_config("local"), LocalConfig)
    with pytest.raises(ValueError):
        s.backend_config("firecracker")


def test_availability_is_judged_with_the_settings_given_not_the_environment() -> None:
    # An engine address nothing answers on: the docker backend must say so, whatever the environment has.
    s = SandboxSettings(docker_base_url="unix:///nonexistent/docker.sock")
    ok, why = SANDBOXES["docker"].available(s)
    assert not ok, why
