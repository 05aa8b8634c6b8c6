"""Pools on different "hosts" with no common disk: each pool process has its own data, mirror and worktree
directories and its own copy of the operator's credential; the repository is reached only over the network (smart
HTTP with basic auth), and the diff travels between hosts in the store. Where each step ran is read from Temporal's
own history (worker identity PID@host)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from crewwork.cli.demo import RIGHT, WRONG
from crewwork.cli.stack import ManagedProcess
from crewwork.config import Settings
from crewwork.temporal.devserver import DevServer
from tests.conftest import make_settings, running_crew
from tests.deploy.procs import PoolProcesses, activity_identities, pool_env
from tests.integration.test_lifecycle import VALIDATION
from tests.repos.conftest import Served
from tests.repos.servers import SmartHttp, git

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

HOSTS = {"host-a": ("control",), "host-b": ("agent",), "host-c": ("validate",), "host-d": ("agent", "validate")}
ITEMS = 4


class Host:
    """One machine: its own directories (nothing shared with the others) and its own pool processes."""

    def __init__(self, name: str, base: Path, settings: Settings, scope: str, password: str) -> None:
        self.name = name
        self.root = base / name
        self.data = self.root / "data"
        secret = self.root / "run-secrets" / "git-token"
        secret.parent.mkdir(parents=True)
        secret.write_text(password + "\n")
        creds = {"git": {"kind": "https_token", "match": [scope], "secret_file": str(secret), "username": "crew"}}
        self.env = {
            **pool_env(settings),
            "CREWWORK_DATA_DIR": str(self.data),
            "CREWWORK_WORKTREE_DIR": str(self.root / "worktrees"),
            "CREWWORK_REPO_CREDENTIALS": json.dumps(creds),
        }
        self.procs = PoolProcesses(settings, self.root / "logs")

    def start(self, pool: str) -> ManagedProcess:
        p = ManagedProcess(
            f"{pool}-{self.name}",
            [sys.executable, "-m", "crewwork", "worker", "--pool", pool],
            dict(self.env),
            self.root / "logs" / f"{pool}.log",
        )
        p.start()
        self.procs.procs.append(p)
        self.procs.wait_polling(p)
        return p


async def test_pools_on_hosts_with_no_common_disk_work_one_remote_repository(
    tmp_path: Path,
    temporal_server: DevServer,
    pg_url: str,
    sandbox_backend: str,
    smart_http: SmartHttp,
    served: Served,
    secret_dir: Path,
    http_password: str,
) -> None:
    scope = f"http://127.0.0.1:{smart_http.port}/"
    (secret_dir / "token").write_text(http_password + "\n")
    from crewwork.config.repos import RepoCredential

    # The API "host" (this test process): it only checks submissions (ls-remote), with its own credential copy.
    api_settings = make_settings(
        tmp_path / "api-host" / "data",
        temporal_server,
        pg_url,
        sandbox_backend=sandbox_backend,
        repo_credentials={
            "git": RepoCredential(kind="https_token", match=[scope], secret_file=secret_dir / "token", username="crew")
        },
    )
    hosts = {name: Host(name, tmp_path / "hosts", api_settings, scope, http_password) for name in HOSTS}
    identity: dict[str, str] = {}
    try:
        for name, pools in HOSTS.items():
            for pool in pools:
                p = hosts[name].start(pool)
                identity[hosts[name].procs.identity(p)] = name
        async with running_crew(api_settings, pools=()) as crew:
            url = smart_http.url(served.name)
            ids = []
            for _ in range(ITEMS):
                spec = {
                    "kind": "code_change",
                    "repo": {"url": url, "ref": "main"},
                    "instruction": "Fix add() so the tests pass",
                    "validation": VALIDATION,
                    "agent": {
                        "name": "scripted",
                        "config": {"attempts": [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": RIGHT}}]},
                    },
                    "budget": {"max_attempts": 3},
                }
                ids.append(await crew.submit(spec))
            ran: dict[str, set[str]] = {"run_agent": set(), "validate_change": set(), "land_change": set()}
            for wid in ids:
                result = await crew.result(wid, timeout_s=300)
                assert result.state == "succeeded", result.reason
                assert git(served.bare, "rev-parse", f"refs/heads/crewwork/{wid}") == result.landed_commit
                row = await crew.store.get_work_item(wid)
                assert row is not None
                for activity, runs in (await activity_identities(crew.client, row.workflow_id)).items():
                    if activity in ran:
                        ran[activity] |= {identity[ident] for _, ident in runs}
    finally:
        for h in hosts.values():
            h.procs.stop_all()
    # Each step ran only on hosts that run its pool (which agent or validate host took an item is up to Temporal).
    assert ran["land_change"] == {"host-a"}
    assert ran["run_agent"] <= {"host-b", "host-d"} and ran["validate_change"] <= {"host-c", "host-d"}
    # Every host that did repository work has its own mirror; none saw another's directories.
    for name in {*ran["run_agent"], *ran["validate_change"], *ran["land_change"]}:
        mirrors = list((hosts[name].data / "mirrors").glob("*.git"))
        assert len(mirrors) == 1, (name, mirrors)
        assert json.loads((mirrors[0] / "crewwork-mirror.json").read_text())["url"] == url
        worktrees = mirrors[0] / "worktrees"
        assert not worktrees.exists() or not list(worktrees.iterdir()), f"{name} left worktrees behind"
        # Each pool removes its workspaces when its activity ends; the per-item directory they were made in is
        # removed by the item's cleanup, which runs on the control host only (docs/repositories.md, limits).
        left = [p for p in (hosts[name].root / "worktrees").rglob("*") if not p.is_dir()]
        assert not left, f"{name} left workspace files behind: {left[:5]}"
    assert not (tmp_path / "api-host" / "data" / "mirrors").exists(), "submission needs no mirror, only ls-remote"
    for h in hosts.values():
        for other in hosts.values():
            if other is not h:
                for log in (h.root / "logs").glob("*.log"):
                    assert str(other.root) not in log.read_text(errors="replace")
        for log in (h.root / "logs").glob("*.log"):
            assert http_password not in log.read_text(errors="replace")
