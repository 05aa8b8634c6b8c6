"""The host sweep's Docker part (crewwork/sandbox/orphans.py) removes a sandbox container only when it can prove
the process that started it is gone: same boot, same PID namespace, and that pid no longer the same process.

One engine serves processes of many PID namespaces (a pool in a container next to pools on the host; the compose
deployment runs several). A pid means nothing outside the namespace that numbered it, so a sweeper in another
namespace must leave a container alone, however dead its owner looks from there. A CI run lost a live gVisor
sandbox mid-run to exactly that: a containerised pool's start-up sweep removed the host's running container.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid

import pytest

from crewwork.config.sandbox import SandboxSettings
from crewwork.sandbox.orphans import OWNER_LABEL, process_identity, reap_dead_owners
from tests.sandbox.conftest import require_backend

pytestmark = pytest.mark.docker

MARK = "crewwork.test.sweep"


@pytest.fixture
def client():  # type: ignore[no-untyped-def]
    require_backend("docker")
    import docker

    c = docker.from_env()
    # This test's own mark: the clean-up must never remove another test's containers (the suite runs in parallel,
    # and removing a parallel test's live container is exactly what these tests look for).
    c.crewwork_test_mark = uuid.uuid4().hex
    yield c
    mine = f"{MARK}={c.crewwork_test_mark}"
    for leftover in c.containers.list(all=True, filters={"label": mine}, ignore_removed=True):
        leftover.remove(force=True)


def _container(client, owner: str, name: str):  # type: ignore[no-untyped-def]
    # Created, never started: the sweep judges the label, not what runs.
    return client.containers.create(
        SandboxSettings().docker_image,
        ["true"],
        labels={
            "crewwork.sandbox": "docker",
            OWNER_LABEL: owner,
            MARK: client.crewwork_test_mark,
            f"{MARK}.role": name,
        },
        network_mode="none",
    )


def _exists(client, container) -> bool:  # type: ignore[no-untyped-def]
    import docker

    try:
        client.containers.get(container.id)
    except docker.errors.NotFound:
        return False
    return True


def _dead_identity() -> str:
    """The identity a process of this namespace had; that process has exited since."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    identity = process_identity(child.pid)
    assert child.stdin is not None
    child.stdin.close()
    child.wait()
    assert identity.count(":") == 3
    return identity


def _sweep_elsewhere(*ids: str) -> list[str]:
    """Run the sweep in a fresh PID namespace (as a pool in a container would), over these containers only."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is needed to make a PID namespace")
    script = (
        "import json, sys, docker\n"
        "from crewwork.sandbox.orphans import reap_dead_owners\n"
        "c = docker.from_env()\n"
        "print(json.dumps(reap_dead_owners(c)))\n"
    )
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0 and "Operation not permitted" in done.stderr:
        pytest.skip(f"cannot make a PID namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    removed: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return [r for r in removed if r in ids]


def test_a_live_owners_container_stays_and_a_dead_owners_goes(client) -> None:  # type: ignore[no-untyped-def]
    live = _container(client, process_identity(), "live")
    dead = _container(client, _dead_identity(), "dead")
    removed = reap_dead_owners(client)
    # Another test's sweep in this namespace (the suite runs in parallel) may have removed the dead one first.
    assert not _exists(client, dead)
    assert live.id not in removed and _exists(client, live)


def test_a_sweeper_in_another_pid_namespace_removes_nothing_of_ours(client) -> None:  # type: ignore[no-untyped-def]
    live = _container(client, process_identity(), "live")
    dead = _container(client, _dead_identity(), "dead")
    # From a new PID namespace this process's pid is unknown or another process: it must not count as dead there.
    # (Whether the dead one still exists afterwards is not this sweep's to say: a parallel test's sweep in our own
    # namespace rightly removes it.)
    assert _sweep_elsewhere(live.id, dead.id) == []
    assert _exists(client, live)
    # Back in our own namespace, the dead owner's container is ours to remove and goes.
    reap_dead_owners(client)
    assert not _exists(client, dead) and _exists(client, live)


def test_labels_it_cannot_read_are_left_to_the_deadline(client) -> None:  # type: ignore[no-untyped-def]
    boot = process_identity().split(":", 1)[0]
    # The format before the PID namespace was part of it (boot:pid:start), with a pid that surely is not running,
    # and plain garbage: neither proves its owner dead here.
    old = _container(client, f"{boot}:999999999:1", "old-format")
    garbage = _container(client, "x:y:z:w", "garbage")
    removed = reap_dead_owners(client)
    assert old.id not in removed and garbage.id not in removed
    assert _exists(client, old) and _exists(client, garbage)


def test_removing_a_container_someone_else_removed_is_not_an_error(client) -> None:  # type: ignore[no-untyped-def]
    # A run's own clean-up after a sweep (or a deadline reap, or an operator) got there first: the container is
    # gone, which is what the clean-up wanted. It once raised SandboxError and failed a finished run.
    from crewwork.sandbox.docker import _remove

    gone = _container(client, process_identity(), "gone")
    gone.remove(force=True)
    _remove(gone)
    assert not _exists(client, gone)
