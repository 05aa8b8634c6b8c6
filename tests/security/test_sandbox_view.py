"""What a sandbox sees is only what its run needs (docs/sandbox.md, "What a run sees"): its workspace at /workspace,
its prepared environment at /crewwork/env, the setup proxy at /crewwork/net, the sandbox's own clean Python, and the
system directories. Nothing says where the worker keeps its data, its workspaces or its virtualenv, and neither
crewwork nor any package of the worker's environment is importable: a repository's tests, a setup and an agent run
with the sandbox's interpreter (or the repository's own venv), never crewwork's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from crewwork.config.sandbox import SandboxSettings
from crewwork.sandbox.backends import SANDBOXES, get_sandbox
from crewwork.sandbox.base import Sandbox, SandboxLimits
from crewwork.sandbox.envplan import CacheOwner, SetupPlan
from crewwork.sandbox.image import IMAGE_PACKAGES, distribution_closure
from crewwork.sandbox.prepare import PreparedEnvCache
from crewwork.sandbox.toolchain import ensure_toolchain

LIMITS = SandboxLimits(memory_mb=512, pids=128, timeout_s=120)
OWNER = CacheOwner(tenant_id="tn_view", repository="rp_view")
SYSTEM = {"/usr", "/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}
# Every path the run can see outside the system directories, what `python` is, and what it can import.
LOOK = r"""
import importlib.metadata as md, json, os, sys
SYSTEM = ("/usr", "/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
seen = []
for root, dirs, files in os.walk("/", followlinks=False):
    if root.startswith(SYSTEM) or root.startswith(tuple(p for p in sys.argv[1:] if p)):
        dirs[:] = []
        continue
    seen.append(root)
    seen += [os.path.join(root, f) for f in files if root in ("/", "/tmp", "/workspace")]
mods = {}
for m in ("crewwork", "temporalio", "pytest_asyncio", "sqlalchemy", "fastapi", "pytest"):
    try:
        __import__(m)
        mods[m] = True
    except ImportError:
        mods[m] = False
dists = sorted({d.metadata["Name"].lower().replace("_", "-") for d in md.distributions()})
print(json.dumps({"seen": seen, "prefix": sys.prefix, "path": os.environ.get("PATH"), "mods": mods,
                  "dists": dists, "cwd": os.getcwd()}))
"""


@pytest.fixture(params=[pytest.param("bwrap"), pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    ok, why = SANDBOXES[request.param].available()
    if not ok:
        pytest.skip(f"sandbox backend {request.param} is not available: {why} (see docs/sandbox.md)")
    return get_sandbox(request.param, settings=SandboxSettings())


def base_python_dirs(sandbox: Sandbox) -> list[str]:
    """The base interpreter's own prefix, which bwrap shows at its own path (the image holds it too)."""
    return [os.path.realpath(sys.base_prefix)]


def expected_dists() -> list[str]:
    return sorted({d.metadata["Name"].lower().replace("_", "-") for d in distribution_closure(IMAGE_PACKAGES)})


def check_view(out: dict, host_paths: list[str], allowed_tops: set[str]) -> None:
    for path in out["seen"]:
        for host in host_paths:
            assert host not in path, f"the sandbox sees {path}, which names the host's {host}"
        top = "/" + path.strip("/").split("/")[0] if path != "/" else "/"
        assert top in allowed_tops | SYSTEM | {"/.dockerenv"}, f"the sandbox sees {path} outside what its run needs"
    assert out["mods"]["crewwork"] is False and out["mods"]["temporalio"] is False
    assert out["mods"]["pytest_asyncio"] is False, "crewwork's pytest plugins never load in a repository's tests"
    assert out["mods"]["sqlalchemy"] is False and out["mods"]["fastapi"] is False
    assert sys.prefix not in out["prefix"] and sys.prefix not in (out["path"] or "")


async def test_a_validation_run_sees_its_workspace_environment_and_clean_python_only(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    data = tmp_path / "worker-data"
    src = data / "work" / "src"
    src.mkdir(parents=True)
    cache = PreparedEnvCache(data / "prepared")
    setup = [["sh", "-c", 'mkdir -p "$CREWWORK_ENV/lib" && echo built > "$CREWWORK_ENV/lib/marker"']]
    prepared = await cache.get_or_prepare(
        owner=OWNER, sandbox=sandbox, repo="r", base_commit="c", setup=setup, source=src, limits=LIMITS
    )
    ws = data / "work" / "wi_1" / "attempt-1"
    ws.mkdir(parents=True)
    r = await sandbox.run(
        ["python3", "-c", LOOK, *base_python_dirs(sandbox)],
        workspace=ws,
        limits=LIMITS,
        env=prepared.env(),
        mounts=prepared.mounts(),
    )
    assert r.ok, r.stderr.decode()[-3000:]
    out = json.loads(r.stdout.decode().splitlines()[-1])
    tops = {"/", "/workspace", "/crewwork", "/tmp", "/opt", "/root", "/home"}
    check_view(out, [str(tmp_path), str(data), sys.prefix], tops)
    assert out["cwd"] == "/workspace"
    assert "/crewwork/env" in out["seen"] and "/crewwork/env/lib" in out["seen"]
    assert out["dists"] == expected_dists(), "the sandbox's Python holds pytest, pip, setuptools, wheel and their needs"
    if sandbox.name == "bwrap":
        assert out["prefix"] == "/opt/crewwork/python" and out["path"].startswith("/opt/crewwork/python/bin:")


async def test_a_setup_run_sees_its_environment_and_proxy_only(sandbox: Sandbox, tmp_path: Path) -> None:
    data = tmp_path / "worker-data"
    src = data / "src"
    src.mkdir(parents=True)
    (src / "look.py").write_text(LOOK)
    cache = PreparedEnvCache(data / "prepared")
    plan = SetupPlan(allowlist=("127.0.0.1:9",))
    look = 'python3 look.py "$@" > "$CREWWORK_ENV/view.json"'
    prepared = await cache.get_or_prepare(
        owner=OWNER,
        sandbox=sandbox,
        repo="r",
        base_commit="c",
        setup=[["sh", "-c", look, "look", *base_python_dirs(sandbox)]],
        source=src,
        limits=LIMITS,
        plan=plan,
    )
    out = json.loads((prepared.env_dir / "view.json").read_text())
    check_view(out, [str(tmp_path), str(data), sys.prefix], {"/", "/workspace", "/crewwork", "/tmp", "/opt", "/root"})
    assert any(p.startswith("/crewwork/net") for p in out["seen"]), "setup sees the proxy's socket directory"
    assert not any(p.startswith("/crewwork/env/") and "prepared" in p for p in out["seen"])


async def test_the_local_backend_runs_the_clean_python_too(tmp_path: Path) -> None:
    sandbox = get_sandbox("local", allow_unsafe=True)
    ws = tmp_path / "ws"
    ws.mkdir()
    r = await sandbox.run(["python3", "-c", LOOK, "/"], workspace=ws, limits=LIMITS)
    assert r.ok, r.stderr.decode()[-2000:]
    out = json.loads(r.stdout.decode().splitlines()[-1])
    toolchain = ensure_toolchain(SandboxSettings().toolchain_root())
    assert out["prefix"] == str(toolchain.root) and out["path"].startswith(f"{toolchain.root}/bin:")
    assert out["mods"]["crewwork"] is False and out["mods"]["pytest_asyncio"] is False and out["mods"]["pytest"]


def test_the_toolchain_directory_must_be_private(tmp_path: Path) -> None:
    from crewwork.sandbox.base import SandboxUnavailable

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(SandboxUnavailable, match="not be writable by others"):
        ensure_toolchain(shared)


async def test_a_run_cannot_change_the_sandbox_python(tmp_path: Path) -> None:
    ok, why = SANDBOXES["bwrap"].available()
    if not ok:
        pytest.skip(why)
    sandbox = get_sandbox("bwrap")
    ws = tmp_path / "ws"
    ws.mkdir()
    code = (
        "import os, sys\n"
        "site = [p for p in sys.path if p.endswith('site-packages')][0]\n"
        "for target in (os.path.join(site, 'sitecustomize.py'), '/opt/crewwork/python/bin/evil'):\n"
        "    try:\n"
        "        open(target, 'w').write('print(1)')\n"
        "        print('WROTE', target)\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
    )
    r = await sandbox.run(["python3", "-c", code], workspace=ws, limits=LIMITS)
    assert r.ok and b"WROTE" not in r.stdout, r.stdout
