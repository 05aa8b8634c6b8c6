"""A repository's own environment: setup reaches only the operator's allowlist (through the allowlisting proxy),
secrets reach setup only, agents and validation have no network, validation runs the repository's interpreter,
and a real third-party project (toolz, rebuilt from its sdist) is installed from a loopback package index and
judged by its own tests end to end."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from crewwork.config.sandbox import SandboxSettings
from crewwork.sandbox.backends import SANDBOXES, get_sandbox
from crewwork.sandbox.base import Sandbox, SandboxLimits
from crewwork.sandbox.envplan import CacheOwner, SetupFailed, SetupPlan
from crewwork.sandbox.prepare import PreparedEnvCache
from crewwork.temporal.devserver import DevServer, free_port
from tests.conftest import make_settings, running_crew
from tests.repos.pkgindex import TOOLZ_BUG, TOOLZ_FILE, TOOLZ_RIGHT, PackageIndex, packages_ready, toolz_repo
from tests.repos.servers import GitDaemon, _wait_port, bare_from, git

LIMITS = SandboxLimits(memory_mb=512, pids=128, timeout_s=120)
OWNER = CacheOwner(tenant_id="tn_a", repository="rp_a")
# Asks a URL through the proxy the relay exported (urllib honours HTTP_PROXY), then directly without any proxy.
PROBE = (
    "import json, os, sys, urllib.request, socket\n"
    "def get(url, proxy=True):\n"
    "    h = urllib.request.ProxyHandler() if proxy else urllib.request.ProxyHandler({})\n"
    "    try:\n"
    "        return urllib.request.build_opener(h).open(url, timeout=5).read().decode()[:40]\n"
    "    except Exception as exc:\n"
    "        return 'ERR ' + type(exc).__name__ + ' ' + str(getattr(exc, 'code', ''))\n"
    "allowed, denied = sys.argv[1], sys.argv[2]\n"
    "out = {'allowed': get(allowed), 'denied': get(denied), 'direct': get(allowed, proxy=False),\n"
    "       'proxy_env': os.environ.get('HTTP_PROXY', '')}\n"
    "open(sys.argv[3], 'w').write(json.dumps(out))\n"
)


@contextlib.contextmanager
def http_server(directory: Path) -> Iterator[int]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "index.html").write_text("hello from the host\n")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(directory)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(params=[pytest.param("bwrap"), pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    ok, why = SANDBOXES[request.param].available()
    if not ok:
        pytest.skip(f"sandbox backend {request.param} is not available: {why} (see docs/sandbox.md)")
    return get_sandbox(request.param, settings=SandboxSettings())


async def test_setup_reaches_only_the_allowlist_and_later_runs_reach_nothing(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "probe.py").write_text(PROBE)
    with http_server(tmp_path / "allowed") as ok_port, http_server(tmp_path / "denied") as bad_port:
        allowed, denied = f"http://127.0.0.1:{ok_port}/", f"http://127.0.0.1:{bad_port}/"
        cache = PreparedEnvCache(tmp_path / "data" / "prepared")
        plan = SetupPlan(allowlist=(f"127.0.0.1:{ok_port}",))
        setup = [["sh", "-c", 'exec python3 probe.py "$0" "$1" "$CREWWORK_ENV/setup-probe.json"', allowed, denied]]
        prepared = await cache.get_or_prepare(
            owner=OWNER, sandbox=sandbox, repo="r", base_commit="c", setup=setup, source=src, limits=LIMITS, plan=plan
        )
        seen = json.loads((prepared.env_dir / "setup-probe.json").read_text())
        assert seen["allowed"].startswith("hello from the host"), seen
        assert seen["denied"] == "ERR HTTPError 403", seen
        assert seen["direct"].startswith("ERR"), "without the proxy the setup sandbox reaches nothing"
        assert seen["proxy_env"].startswith("http://127.0.0.1:")
        network = prepared.evidence()["network"]
        assert {(d["target"], d["allowed"]) for d in network} == {
            (f"127.0.0.1:{ok_port}", True),
            (f"127.0.0.1:{bad_port}", False),
        }
        # A later run in the same environment (what validation does) has no proxy and no route anywhere.
        ws = tmp_path / "ws"
        ws.mkdir()
        ws.chmod(0o777)
        (ws / "probe.py").write_text(PROBE)
        r = await sandbox.run(
            ["python3", "probe.py", allowed, denied, "out.json"],
            workspace=ws,
            limits=LIMITS,
            env=prepared.env(),
            mounts=prepared.mounts(),
        )
        assert r.ok, r.stderr
        later = json.loads((ws / "out.json").read_text())
        assert later["allowed"].startswith("ERR") and later["direct"].startswith("ERR") and not later["proxy_env"]
    assert not list((cache.root / ".net").glob("*")), "the proxy's socket directory is removed after setup"


async def test_secrets_reach_setup_only_and_are_masked_in_its_log(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    secret = "s3cret-index-token-" + "9" * 12
    plan = SetupPlan(secrets={"INDEX_TOKEN": secret})
    setup = [["sh", "-c", 'echo "token is $INDEX_TOKEN"; test -n "$INDEX_TOKEN" && echo ok > "$CREWWORK_ENV/had-it"']]
    cache = PreparedEnvCache(tmp_path / "prepared")
    prepared = await cache.get_or_prepare(
        owner=OWNER, sandbox=sandbox, repo="r", base_commit="c", setup=setup, source=src, limits=LIMITS, plan=plan
    )
    assert (prepared.env_dir / "had-it").read_text() == "ok\n"
    log = prepared.setup_log().decode()
    assert "token is [REDACTED]" in log and secret not in log
    assert secret not in json.dumps(prepared.meta)
    ws = tmp_path / "ws"
    ws.mkdir()
    ws.chmod(0o777)
    r = await sandbox.run(
        ["sh", "-c", 'echo "[$INDEX_TOKEN]"'],
        workspace=ws,
        limits=LIMITS,
        env=prepared.env(),
        mounts=prepared.mounts(),
    )
    assert r.stdout == b"[]\n", "validation runs never see setup secrets"
    # A failing setup's evidence is masked too.
    with pytest.raises(SetupFailed) as err:
        await cache.get_or_prepare(
            owner=OWNER,
            sandbox=sandbox,
            repo="r",
            base_commit="c2",
            setup=[["sh", "-c", 'echo "leaking $INDEX_TOKEN" >&2; exit 3']],
            source=src,
            limits=LIMITS,
            plan=plan,
        )
    assert secret not in str(err.value) and secret not in err.value.log.decode()
    assert all(secret.encode() not in r.stderr for r in err.value.results)


async def test_validation_runs_the_environments_interpreter_not_crewworks(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    python = "/usr/bin/python3" if sandbox.name == "bwrap" else "python3"
    cache = PreparedEnvCache(tmp_path / "prepared")
    prepared = await cache.get_or_prepare(
        owner=OWNER,
        sandbox=sandbox,
        repo="r",
        base_commit="c",
        setup=[],
        source=src,
        limits=LIMITS,
        plan=SetupPlan(python=python),
    )
    assert prepared.has_venv and (prepared.env_dir / "venv" / "pyvenv.cfg").is_file()
    ws = tmp_path / "ws"
    ws.mkdir()
    ws.chmod(0o777)
    probe = "import sys, importlib.util as u; print(sys.prefix); print(u.find_spec('temporalio') is None)"
    r = await sandbox.run(
        ["python", "-c", probe], workspace=ws, limits=LIMITS, env=prepared.env(), mounts=prepared.mounts()
    )
    assert r.ok, r.stderr
    prefix, isolated = r.stdout.decode().split()
    assert prefix == "/crewwork/env/venv", "`python` is the environment's venv, at a path that says nothing of the host"
    assert isolated == "True", "crewwork's own packages are not importable in the repository's environment"
    r = await sandbox.run(
        ["python", "-m", "pip", "--version"],
        workspace=ws,
        limits=LIMITS,
        env=prepared.env(),
        mounts=prepared.mounts(),
    )
    assert r.ok and "/crewwork/env/venv" in r.stdout.decode(), "setup can pip-install into the venv"


# ------------------------------------------------------------------------------------------------ end to end


@pytest.fixture
def packages() -> None:
    ok, why = packages_ready()
    if not ok:
        pytest.skip(why)


@pytest.mark.postgres
@pytest.mark.temporal
async def test_toolz_installed_from_a_loopback_index_and_judged_by_its_own_tests(
    packages: None, tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str
) -> None:
    work, upstream = toolz_repo(tmp_path / "toolz")
    served = tmp_path / "served"
    bare = bare_from(work, served / "oss" / "toolz.git")
    with PackageIndex(tmp_path / "index") as index, GitDaemon(served, tmp_path / "daemon.log") as daemon:
        settings = make_settings(
            tmp_path / "data",
            temporal_server,
            pg_url,
            sandbox_backend=sandbox_backend,
            setup_network_allowlist=index.hostport,
        )
        environment = {
            "python": "/usr/bin/python3",
            "setup": [
                ["python", "-m", "pip", "install", "--no-cache-dir", "-q", "--index-url", index.url, "pytest==8.3.5"]
            ],
            "network": True,
        }
        wrong = upstream.replace(TOOLZ_RIGHT, "        d[item] = 1\n")
        command = (
            'python -c \'import sys, importlib.util as u; print("prefix", sys.prefix, u.find_spec("temporalio"))\' && '
            "exec python -m pytest -q -p no:cacheprovider --junitxml=.crewwork/junit.xml toolz/tests"
        )
        spec = {
            "kind": "code_change",
            "repo": {"url": daemon.url("oss/toolz.git"), "ref": "main"},
            "instruction": "frequencies() counts every item twice; fix it",
            "environment": environment,
            "validation": {
                "command": ["sh", "-c", command],
                "junit_path": ".crewwork/junit.xml",
                "timeout_s": 300,
                "fail_to_pass": ["toolz/tests/test_itertoolz.py::test_frequencies"],
            },
            "agent": {
                "name": "scripted",
                "config": {"attempts": [{"files": {TOOLZ_FILE: wrong}}, {"files": {TOOLZ_FILE: upstream}}]},
            },
            "budget": {"max_attempts": 3},
        }
        async with running_crew(settings) as crew:
            wid = await crew.submit(spec)
            result = await crew.result(wid, timeout_s=600)
            assert result.state == "succeeded", result.reason
            assert [a.verdict for a in result.attempts] == ["failed", "passed"]
            first, second = (a.validation for a in result.attempts)
            assert first is not None and second is not None
            assert any(t.id.endswith("test_frequencies") and t.outcome == "failed" for t in first.tests)
            assert second.tests_executed > 150, "toolz's own suite ran"
            events = await crew.store.list_events(wid)
            prepared = [e.data for e in events if e.type == "environment_prepared"]
            assert [p["cold"] for p in prepared] == [True, False], "setup ran once; the second attempt reused it"
            assert prepared[0]["venv"] and any(d["allowed"] for d in prepared[0]["network"])
            assert all(d["target"] == index.hostport for d in prepared[0]["network"])
            log_ref = prepared[0]["log_ref"]
            setup_log = (await crew.store.artifact_content(log_ref) or b"").decode()
            assert "pip install" in setup_log
            val_log = (await crew.store.artifact_content(second.log_ref.id) or b"").decode()  # type: ignore[union-attr]
            line = next(ln for ln in val_log.splitlines() if ln.startswith("prefix "))
            assert line == "prefix /crewwork/env/venv None", "tests ran in the environment's venv, not crewwork's"
            landed = git(bare, "show", f"refs/heads/crewwork/{wid}:{TOOLZ_FILE}")
            assert TOOLZ_BUG not in landed + "\n" and TOOLZ_RIGHT.strip() in landed


@pytest.mark.postgres
@pytest.mark.temporal
async def test_environment_asking_for_network_without_an_allowlist_is_rejected(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, calc_repo: Path
) -> None:
    from crewwork.api.service import SubmissionRejected
    from tests.integration.test_lifecycle import code_change

    settings = make_settings(tmp_path / "data", temporal_server, pg_url, sandbox_backend=sandbox_backend)
    async with running_crew(settings) as crew:
        for env, match in [
            ({"network": True, "setup": [["true"]]}, "allows setup no network"),
            ({"secrets": ["nope"]}, "no setup secret named 'nope'"),
            ({"image": "evil:latest"}, "not one the operator allows"),
        ]:
            with pytest.raises(SubmissionRejected, match=match) as err:
                await crew.submit(code_change(calc_repo, [{"files": {"calc.py": "x"}}], environment=env))
            assert err.value.field == "environment"
