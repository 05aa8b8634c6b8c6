"""Hosts that die: four hosts (network namespaces, tests/deploy/netns.py), each with its own disk for workspaces and
mirrors and one process running the control, agent and validate pools; nothing is shared but PostgreSQL and Temporal
(and the git server every host reaches over the network). Three items are submitted; the host running the first
item's agent attempt, the host running the second's validation and the host running the third's landing are each
killed (cut off and frozen) in the middle of it, all at once. Every item ends correctly on the host that remains;
then the dead hosts come back and carry on from where they stopped: no write of theirs is accepted (their attempts
learn they were superseded and stop before writing; a write they still make is refused), nothing they do changes an
item's result or delivery branch, no lease is held, and no workspace or sandbox is left on any host (the survivors'
attempts clean up after themselves, the hosts that came back are swept). The invariant checker (tests/invariants.py)
reads the store, the histories and the remote afterwards.

The three deaths are simultaneous on purpose: a retry that lands on a host that dies later spends another of the
step's three tries (EXECUTION_RETRY), which a real sequence of deaths would too."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from crewwork.cli.demo import BUGGY, RIGHT, TEST
from crewwork.repos.address import RemoteAddressPolicy
from crewwork.temporal.devserver import DevServer, free_port
from tests.conftest import make_repo, make_settings, running_crew
from tests.deploy.netns import PYTHON, NetHost, Network, available
from tests.deploy.procs import pending_activity_workers, pool_env
from tests.integration.test_lifecycle import VALIDATION
from tests.invariants import check_invariants, completed_steps, summarize
from tests.repos.servers import GIT_ENV, bare_from, git

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

HOSTS = 4
SLOW_AGENT_S = 16
SLOW_VALIDATION_S = 12
SLOW_PUSH_S = 8
"""Long enough that the three steps are in flight at once: their hosts die together, so every retry runs on a
survivor (a retry on a host that died later would spend one of the step's three tries on each death)."""


def spec(url: str, *, agent_delay_s: float = 0, validation_sleep_s: float = 0, branch: str) -> dict[str, Any]:
    validation = dict(VALIDATION)
    if validation_sleep_s:
        validation["command"] = ["sh", "-c", f"sleep {validation_sleep_s} && " + " ".join(VALIDATION["command"])]
    return {
        "kind": "code_change",
        "repo": {"url": url, "ref": "main"},
        "target_branch": branch,
        "instruction": "Fix add() so the tests pass",
        "validation": validation,
        "agent": {
            "name": "scripted",
            "config": {"attempts": [{"files": {"calc.py": RIGHT}, "delay_s": agent_delay_s}]},
        },
        "review": {"required": False},
        "budget": {"max_attempts": 2},
    }


def host_of(hosts: list[NetHost], identity: str) -> NetHost | None:
    pid = int(identity.split("@", 1)[0]) if identity.split("@", 1)[0].isdigit() else -1
    return next((h for h in hosts if any(p.proc is not None and p.proc.pid == pid for p in h.procs)), None)


def left_on(h: NetHost) -> list[str]:
    """Workspaces (and their lock files) on the host's disk (read while its sweep may be removing them)."""
    found = []
    root = h.root / "worktrees"
    for item in os.listdir(root) if root.is_dir() else []:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            found += [str(root / item / name) for name in os.listdir(root / item)]
    return found


@pytest.fixture
def network(tmp_path: Path) -> Any:
    why = available()
    if why:
        pytest.skip(why)
    net = Network(tmp_path / "hosts")
    try:
        yield net
    finally:
        net.close()


async def test_items_end_correctly_when_hosts_die_mid_agent_mid_validation_and_mid_landing(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, network: Network
) -> None:
    net = network
    # The services, on the one address every host reaches.
    pg_port = net.relay(free_port(), ("127.0.0.1", 5432))
    temporal_port = net.relay(free_port(), ("127.0.0.1", temporal_server.port))
    work = make_repo(tmp_path / "work", {"calc.py": BUGGY, "tests/test_calc.py": TEST, "conftest.py": ""})
    served = tmp_path / "served"
    bare = bare_from(work, served / "calc.git")
    git_port = free_port()
    daemon = subprocess.Popen(
        [
            "git",
            "daemon",
            f"--base-path={served}",
            "--export-all",
            "--enable=receive-pack",
            f"--listen={net.service}",
            f"--port={git_port}",
            "--reuseaddr",
            str(served),
        ],
        env=GIT_ENV,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "git-daemon.log").open("ab"),
    )
    url = f"git://{net.service}:{git_port}/calc.git"
    settings = make_settings(
        tmp_path / "api-host", temporal_server, pg_url, sandbox_backend=sandbox_backend, repo_allow_networks=net.cidr
    )
    env = {
        **pool_env(settings),
        "CREWWORK_DATABASE_URL": pg_url.replace("127.0.0.1:5432", f"{net.service}:{pg_port}"),
        "CREWWORK_TEMPORAL_ADDRESS": f"{net.service}:{temporal_port}",
        "CREWWORK_RETENTION_INTERVAL_S": "0",
        "CREWWORK_SWEEP_INTERVAL_S": "2",
        "CREWWORK_SWEEP_MIN_AGE_S": "1",
    }
    hosts = [net.host() for _ in range(HOSTS)]
    try:
        for h in hosts:
            host_env = {
                **env,
                "CREWWORK_DATA_DIR": str(h.root / "data"),
                "CREWWORK_WORKTREE_DIR": str(h.root / "worktrees"),
                "CREWWORK_MIRROR_DIR": str(h.root / "mirrors"),
            }
            h.start("pools", [PYTHON, "-m", "crewwork", "worker", "--pool", "control,agent,validate"], host_env)
        deadline = time.monotonic() + 90
        while not all(
            (h.root / "pools.log").exists() and (h.root / "pools.log").read_text().count("polling") >= 3 for h in hosts
        ):
            assert time.monotonic() < deadline, [(h.root / "pools.log").read_text()[-2000:] for h in hosts]
            await asyncio.sleep(0.2)

        async with running_crew(settings, pools=()) as crew:
            agent_item = await crew.submit(spec(url, agent_delay_s=SLOW_AGENT_S, branch="a"))
            validation_item = await crew.submit(spec(url, validation_sleep_s=SLOW_VALIDATION_S, branch="v"))
            landing_item = await crew.submit(spec(url, branch="l"))
            items = [agent_item, validation_item, landing_item]
            # The remote takes SLOW_PUSH_S to accept a push of the landing item's branch.
            hook = bare / "hooks" / "pre-receive"
            hook.write_text(f"#!/bin/sh\ngrep -q 'crewwork/{landing_item}' && sleep {SLOW_PUSH_S}\nexit 0\n")
            hook.chmod(0o755)
            rows = {wid: await crew.store.get_work_item(wid) for wid in items}
            targets = {agent_item: "run_agent", validation_item: "validate_change", landing_item: "land_change"}
            killed: dict[str, NetHost] = {}
            deadline = time.monotonic() + 120
            while len(killed) < len(targets):
                assert time.monotonic() < deadline, f"the three steps were never in flight at once: {sorted(killed)}"
                killed = {}
                for wid, activity in targets.items():
                    running = await pending_activity_workers(crew.client, rows[wid].workflow_id)  # type: ignore[union-attr]
                    h = host_of(hosts, running.get(activity, ""))
                    if h is not None:
                        killed[wid] = h
                await asyncio.sleep(0.1)
            for h in {h.name: h for h in killed.values()}.values():
                h.freeze()
            assert any(not h.frozen for h in hosts)

            results = {wid: await crew.result(wid, timeout_s=180) for wid in items}
            for wid, res in results.items():
                assert res.state == "succeeded", f"{targets[wid]}: {res.reason}"
                assert git(bare, "rev-parse", f"refs/heads/crewwork/{wid}") == res.landed_commit
            dead = {h.name for h in killed.values()}
            survivors = [h for h in hosts if h.name not in dead]
            assert survivors

            # The dead hosts come back and carry on where they stopped. Their attempts learn they were superseded
            # (Temporal refuses their heartbeats, the store says a later attempt wrote or the item ended) and stop;
            # whatever one still writes is refused. No write of theirs is accepted: nothing after this moment.
            back = await crew.store.db_now()
            for h in {h.name: h for h in killed.values()}.values():
                h.thaw()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(left_on(h) for h in hosts):
                await asyncio.sleep(0.5)
            refused = 0
            for wid, res in results.items():
                row = await crew.store.get_work_item(wid)
                assert row is not None and (row.state, row.landed_commit) == ("succeeded", res.landed_commit)
                assert git(bare, "rev-parse", f"refs/heads/crewwork/{wid}") == res.landed_commit
                late = [e for e in await crew.store.list_events(wid) if e.created_at > back]
                assert [e for e in late if e.rank is not None and not e.type.endswith("_rejected")] == [], late
                refused += sum(1 for e in late if e.type.endswith("_rejected"))
            print(f"dead hosts: {sorted({h.name for h in killed.values()})}; late writes refused: {refused}")

            histories = {}
            for wid, row in rows.items():
                assert row is not None
                histories[wid] = completed_steps(await crew.client.get_workflow_handle(row.workflow_id).fetch_history())
            report = await check_invariants(
                crew.store,
                items,
                check_git=True,
                histories=histories,
                address=RemoteAddressPolicy.from_settings(settings),
            )
            assert report.ok, summarize(report)

            # Nothing left behind on the survivors (nor, after their own sweep, on the hosts that came back). A host
            # that came back may still be finishing its stale attempt (holding its workspace's lock until its refused
            # write): on a loaded machine that took over 30 s, so the bound is generous.
            deadline = time.monotonic() + 120
            left: list[str] = []
            while time.monotonic() < deadline:
                left = [p for h in hosts for p in left_on(h)]
                sandboxes = [
                    pid
                    for h in hosts
                    for pid in h.pids()
                    if "bwrap" in Path(f"/proc/{pid}/comm").read_text(errors="replace")
                ]
                if not left and not sandboxes:
                    break
                await asyncio.sleep(0.5)
            assert left == [] and sandboxes == [], (left, sandboxes)
    finally:
        daemon.terminate()
        daemon.wait(10)
