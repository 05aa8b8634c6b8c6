"""Sandbox containers whose starting process is gone: each Docker sandbox carries its owner's identity (boot id, pid,
process start time), and the host sweep (crewwork/steps/sweep.py) removes the containers of this host whose owner
no longer runs, at once, where the deadline label (`crewwork.sandbox.docker.reap_orphans`) would wait out the run's
whole timeout. bubblewrap sandboxes need nothing of the kind: they die with their parent (`--die-with-parent`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

OWNER_LABEL = "crewwork.owner"


def _pid_namespace() -> str:
    """The inode of this process's PID namespace (`pid:[4026531836]` -> `4026531836`), or "" if unreadable."""
    try:
        return os.readlink("/proc/self/ns/pid").rsplit("[", 1)[1].rstrip("]")
    except (OSError, IndexError):
        return ""


def process_identity(pid: int | None = None) -> str:
    """`<boot id>:<pid namespace>:<pid>:<start time>` of a process (this one by default): unlike a pid alone, never
    the identity of a later process, and a container whose owner identity no live process has is an orphan.

    The PID namespace is part of it because one Docker engine serves processes of many namespaces (a worker in a
    container, the host's own workers): a pid only means something in the namespace that numbered it, and a
    sweeper in another namespace would otherwise take a live owner for a dead one and remove its sandbox mid-run.
    Returns "" when any part cannot be read."""
    pid = os.getpid() if pid is None else pid
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""
    namespace = _pid_namespace()
    if not boot or not namespace:
        return ""
    return f"{boot}:{namespace}:{pid}:{start}"


def reap_dead_owners(client: Any) -> list[str]:
    """Remove sandbox containers that a process of this host started and that process is gone (killed before it
    could remove them): the host sweep's part for Docker (crewwork/steps/sweep.py). Containers of other hosts
    (another boot id) and of other PID namespaces (a worker in a container, or the host's workers seen from one)
    are theirs to sweep, or the deadline's (`reap_orphans`): a pid from another namespace says nothing here. So
    does a label this version cannot read (an older format, or none): it is left to the deadline too."""
    import docker

    mine = process_identity()
    if not mine:
        return []  # cannot tell whose a container is: removing any could kill a live run
    boot, namespace = mine.split(":")[:2]
    removed = []
    try:
        for c in client.containers.list(all=True, filters={"label": OWNER_LABEL}, ignore_removed=True):
            owner = c.labels.get(OWNER_LABEL, "")
            parts = owner.split(":")
            if len(parts) != 4 or parts[0] != boot or parts[1] != namespace or not parts[2].isdigit():
                continue
            # A pid of our own namespace that runs, or ran, another process (start time differs) is gone.
            if process_identity(int(parts[2])) != owner:
                with contextlib.suppress(docker.errors.DockerException):
                    c.remove(force=True)
                    removed.append(c.id)
    except docker.errors.DockerException:
        pass  # housekeeping must never fail a pool
    return removed
