"""A real repository's test suite validated through crewwork, next to the same command run bare on the same checkout.

The repository is toolz 1.0.0, rebuilt from its sdist (tests/repos/pkgindex.py) with a planted bug, served by
`git daemon` on loopback; the change under validation is the upstream fix. Its environment is a venv from
/usr/bin/python3 with pytest installed by setup from a PEP 503 index on loopback, reached through crewwork's
allowlisting proxy. Three things are timed, interleaved round by round so both see the same machine noise:

- **bare**: `python -m pytest -q -p no:cacheprovider --junitxml=... toolz/tests` with the environment's own venv
  python, in a checkout of the base commit with the fix applied, as a plain subprocess;
- **crewwork warm**: crewwork's validation of that change (`crewwork.steps.validate.activity.validate`: mirror check, a workspace from
  the mirror (a private git directory reading its objects), prepared environment, apply the diff and put protected
  test infrastructure back, write the workspace, run the command in a fresh bwrap sandbox, save the log and
  report, grade), with the mirror and the environment already on this host;
- **crewwork cold environment**: the same with an empty prepared-environment cache (setup builds the venv and
  installs pytest from the index), a few times.

Then one instrumented pass of the same building blocks gives the phases (mirror fetch cold and warm, workspace,
setup cold and warm, apply, workspace writes, sandbox start, tests, report parsing). Prerequisites are checked first.

    .venv/bin/python bench/realrepo.py [--rounds 15] [--cold 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import machine, table, write_results  # noqa: E402
from crewwork.config import Settings  # noqa: E402
from crewwork.config.sandbox import SandboxSettings  # noqa: E402
from crewwork.models import (  # noqa: E402
    ArtifactRef,
    EnvironmentSpec,
    SandboxSpec,
    TenantRef,
    ValidationSpec,
    WorkItemSpec,
)
from crewwork.repos.worker import Repositories  # noqa: E402
from crewwork.sandbox.backends import get_sandbox  # noqa: E402
from crewwork.sandbox.base import SandboxLimits  # noqa: E402
from crewwork.sandbox.envplan import CacheOwner  # noqa: E402
from crewwork.sandbox.prepare import PreparedEnvCache  # noqa: E402
from crewwork.steps.attempt import AttemptWriter  # noqa: E402
from crewwork.steps.ports import Ports  # noqa: E402
from crewwork.steps.validate import ValidateInput  # noqa: E402
from crewwork.steps.validate.activity import validate  # noqa: E402
from crewwork.steps.validate.setup import setup_plan  # noqa: E402
from crewwork.store.db import upgrade  # noqa: E402
from crewwork.store.store import Store  # noqa: E402
from crewwork.validation.grading import ValidationEvidence, grade  # noqa: E402
from crewwork.workspace.tree import Workspace  # noqa: E402

PYTHON = "/usr/bin/python3"
JUNIT = ".crewwork/junit.xml"
COMMAND = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={JUNIT}", "toolz/tests"]


def prerequisites() -> list[str]:
    from crewwork.sandbox.bwrap import BwrapSandbox
    from tests.repos.pkgindex import packages_ready

    problems = []
    ok, why = BwrapSandbox.available()
    if not ok:
        problems.append(f"bwrap sandbox: {why}")
    if subprocess.run([PYTHON, "-c", "import ensurepip, venv"], capture_output=True).returncode != 0:
        problems.append(f"{PYTHON} cannot make venvs (apt-get install -y python3-venv)")
    if shutil.which("git") is None:
        problems.append("git is not installed")
    ok, why = packages_ready()
    if not ok:
        problems.append(why)
    return problems


async def run(rounds: int, cold_runs: int) -> dict[str, Any]:
    from tests.repos.pkgindex import TOOLZ, PackageIndex, toolz_repo
    from tests.repos.servers import GitDaemon, bare_from, git

    tmp = Path(tempfile.mkdtemp(prefix="crewwork-realrepo-"))
    try:
        work, upstream = toolz_repo(tmp / "toolz")
        bare_from(work, tmp / "served" / "oss" / "toolz.git")
        base = git(work, "rev-parse", "HEAD")
        fixed = tmp / "fixed"
        shutil.copytree(work, fixed, symlinks=True)
        (fixed / "toolz" / "itertoolz.py").write_text(upstream)
        diff = subprocess.run(["git", "diff", "--binary"], cwd=fixed, capture_output=True, text=True, check=True).stdout
        with PackageIndex(tmp / "index") as index, GitDaemon(tmp / "served", tmp / "daemon.log") as daemon:
            url = daemon.url("oss/toolz.git")
            settings = Settings(
                data_dir=tmp / "data",
                database_url=f"sqlite+aiosqlite:///{tmp / 'crewwork.db'}",
                sandbox=SandboxSettings(backend="bwrap"),
                setup_network_allowlist=index.hostport,
            )
            await upgrade(settings.resolved_database_url())
            store = Store(settings.resolved_database_url())
            env = EnvironmentSpec(
                python=PYTHON,
                setup=[
                    [
                        "python",
                        "-m",
                        "pip",
                        "install",
                        "--no-cache-dir",
                        "-q",
                        "--index-url",
                        index.url,
                        "pytest==8.3.5",
                    ]
                ],
                network=True,
            )
            validation = ValidationSpec(command=COMMAND, junit_path=JUNIT, timeout_s=300)
            spec = WorkItemSpec(
                kind="code_change",  # type: ignore[arg-type]
                repo={"url": url, "ref": "main"},  # type: ignore[arg-type]
                instruction="fix frequencies",
                validation=validation,
                environment=env,
            )
            tenant = await store.ensure_tenant("bench")
            row, _ = await store.create_work_item(tenant_id=tenant, spec=spec, base_commit=base, repo_path=url)
            art = await store.put_artifact(work_item_id=row.id, tenant_id=tenant, name="fix.diff", data=diff.encode())
            diff_ref = ArtifactRef(id=art.id, name=art.name, size=art.size, sha256=art.sha256)
            ports = Ports.build(store, settings)

            def validate_input(attempt: int) -> ValidateInput:
                return ValidateInput(
                    work_item_id=row.id,
                    tenant_id=tenant,
                    step=attempt,
                    attempt=attempt,
                    repo_path=url,
                    base_commit=base,
                    validation=validation,
                    sandbox=SandboxSpec(backend="bwrap"),
                    diff_ref=diff_ref,
                    environment=env,
                )

            counter = iter(range(1, 10**6))

            async def crewwork_validate() -> float:
                started = time.perf_counter()
                inp = validate_input(next(counter))
                out = await validate(ports, inp, AttemptWriter.of(store, inp), lambda *a: None)
                elapsed = time.perf_counter() - started
                if not out.passed:
                    raise SystemExit(f"crewwork validation did not pass: {out.reason}")
                return elapsed

            # The first validation clones the mirror and builds the environment (cold everything).
            first = await crewwork_validate()
            prepared_root = settings.data_dir.resolve() / "prepared"
            venv_python = next(prepared_root.glob("*/env/venv/bin/python"))
            checkout = tmp / "bare-checkout"
            git(tmp, "clone", "--quiet", "--no-local", str(work), str(checkout))
            git(checkout, "checkout", "--quiet", base)
            (checkout / "toolz" / "itertoolz.py").write_text(upstream)
            (checkout / ".crewwork").mkdir()

            def bare() -> float:
                started = time.perf_counter()
                r = subprocess.run([str(venv_python), *COMMAND[1:]], cwd=checkout, capture_output=True)
                elapsed = time.perf_counter() - started
                if r.returncode != 0:
                    raise SystemExit(f"bare run failed: {r.stdout[-500:]!r}")
                return elapsed

            bare()  # warm the page cache the same way for both
            pairs: list[tuple[float, float]] = []
            for _ in range(rounds):
                b = bare()
                c = await crewwork_validate()
                pairs.append((b, c))
            cold: list[float] = []
            for _ in range(cold_runs):
                # An empty environment cache (the mirror stays): setup runs again, through the proxy. Entries are
                # loop images while disk caps are on, so they are evicted (unmounted), not just deleted.
                PreparedEnvCache(prepared_root, max_bytes=0).evict()
                cold.append(await crewwork_validate())
            phases = await phase_pass(settings, url, base, diff, env, tenant, tmp / "phases")
            await store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    b_med = statistics.median(b for b, _ in pairs)
    c_med = statistics.median(c for _, c in pairs)
    return {
        "repository": TOOLZ,
        "command": " ".join(COMMAND),
        "rounds": rounds,
        "bare_s": [b for b, _ in pairs],
        "crewwork_warm_s": [c for _, c in pairs],
        "crewwork_cold_env_s": cold,
        "first_run_cold_everything_s": first,
        "median": {
            "bare": b_med,
            "warm": c_med,
            "cold_env": statistics.median(cold) if cold else None,
            "warm_ratio": c_med / b_med,
            "paired_warm_ratio": statistics.median(c / b for b, c in pairs),
            "cold_env_ratio": statistics.median(cold) / b_med if cold else None,
        },
        "phases": phases,
    }


async def phase_pass(
    settings: Settings, url: str, base: str, diff: str, env: EnvironmentSpec, tenant: str, tmp: Path
) -> dict[str, float]:
    """The building blocks of a validation, timed one by one on a fresh host (cold) and again (warm)."""
    settings = settings.model_copy(update={"data_dir": tmp / "data"})
    repos = Repositories(settings)
    tenant_ref = TenantRef(id=tenant, name="bench")
    remote = repos.remote(repos.locate(url), tenant_ref)
    out: dict[str, float] = {}
    t = time.perf_counter()
    gitdir, _ = await repos.mirrors.ensure(remote, base)
    out["mirror fetch (cold: first clone)"] = time.perf_counter() - t
    t = time.perf_counter()
    await repos.mirrors.ensure(remote, base)
    out["mirror fetch (warm: commit present)"] = time.perf_counter() - t
    t = time.perf_counter()
    workspace = await Workspace.create(
        git_dir=gitdir,
        home=tmp / "ws-home",
        commit=base,
        disk_mb=None,
        owner=SandboxSettings().owner(),
        materialise=False,
    )
    out["workspace: private git dir and base tree from the mirror"] = time.perf_counter() - t
    t = time.perf_counter()
    changed, err = await workspace.apply(diff.encode())
    assert changed is not None, err
    out["apply the diff (private index)"] = time.perf_counter() - t
    t = time.perf_counter()
    await workspace.write_entries(workspace.base)
    out["write the base tree into the workspace"] = time.perf_counter() - t
    ws = workspace.path
    sandbox = get_sandbox("bwrap")
    limits = SandboxLimits(timeout_s=300)
    cache = PreparedEnvCache(settings.data_dir.resolve() / "prepared")
    plan = setup_plan(env, settings, tenant_ref)
    for label in ("setup (cold: venv + pip install via proxy)", "setup (warm: cache hit)"):
        t = time.perf_counter()
        prepared = await cache.get_or_prepare(
            owner=CacheOwner(tenant_id="tn_bench", repository="rp_bench"),
            sandbox=sandbox, repo=url, base_commit=base, setup=env.setup, source=ws, limits=limits, plan=plan,
        )  # fmt: skip
        out[label] = time.perf_counter() - t
    t = time.perf_counter()
    await workspace.update(workspace.base, changed)
    out["update the workspace to the change"] = time.perf_counter() - t
    t = time.perf_counter()
    await sandbox.run(["true"], workspace=ws, limits=limits, env=prepared.env(), mounts=prepared.mounts())
    out["sandbox start (`true` in bwrap)"] = time.perf_counter() - t
    workspace.make_dir(".crewwork")
    t = time.perf_counter()
    r = await sandbox.run(COMMAND, workspace=ws, limits=limits, env=prepared.env(), mounts=prepared.mounts())
    out["tests in the sandbox (start + suite)"] = time.perf_counter() - t
    report = (ws / JUNIT).read_bytes()
    t = time.perf_counter()
    verdict = grade(
        ValidationEvidence(
            diff_nonempty=True, patch_applied=True, exit_code=r.exit_code, report=report, report_format="junit"
        )
    )
    out["report parsing and grading"] = time.perf_counter() - t
    assert verdict.passed, verdict.reason
    t = time.perf_counter()
    await workspace.remove()
    out["workspace removal"] = time.perf_counter() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15, help="interleaved bare/crewwork-warm pairs")
    ap.add_argument("--cold", type=int, default=3, help="validations with an empty environment cache")
    args = ap.parse_args()
    problems = prerequisites()
    if problems:
        print("bench/realrepo.py cannot run here:\n  " + "\n  ".join(problems), file=sys.stderr)
        raise SystemExit(2)
    load_before = os.getloadavg()
    result = asyncio.run(run(args.rounds, args.cold))
    result["machine"] = machine()
    result["loadavg_at_end"] = os.getloadavg()
    m = result["median"]
    print(f"\n{result['repository']}: `{result['command']}` ({result['rounds']} interleaved rounds)\n")
    rows = [
        ["bare (venv python, plain subprocess)", m["bare"], 1.0],
        ["crewwork, warm environment", m["warm"], m["warm_ratio"]],
        ["crewwork, cold environment (setup runs)", m["cold_env"], m["cold_env_ratio"]],
        [
            "crewwork, first run (mirror clone + setup)",
            result["first_run_cold_everything_s"],
            result["first_run_cold_everything_s"] / m["bare"],
        ],
    ]
    print(table(["run", "median s", "x bare"], rows))
    print(f"\npaired warm ratio (median of per-round crewwork/bare): {m['paired_warm_ratio']:.3f}")
    print("\nphases (one instrumented pass, fresh host):\n")
    print(table(["phase", "s"], [[k, v] for k, v in result["phases"].items()]))
    print(
        f"\nload average: {load_before} at start, {result['loadavg_at_end']} at end; {result['machine']['cpus']} cores"
    )
    write_results("realrepo", result)


if __name__ == "__main__":
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    main()
