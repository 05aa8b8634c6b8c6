"""What a container measured while it ran, read from outside it (the docker and gvisor backends' evidence).

The runtime deletes a container's cgroup, and with it the counters that prove a cap was hit, the moment the container
exits, so `CgroupWatcher` samples them in a thread of its own while it runs. gVisor's processes live in its own
kernel, invisible to host pid cgroups: `RunscCounter` reads gVisor's own list of the sandbox's tasks instead.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

# The runtime deletes a container's cgroup (and its counters) as soon as it exits, and v1 cgroups send no
# notification, so counters are sampled this often while it runs.
CGROUP_POLL_S = 0.01
RUNSC_POLL_S = (0.2, 1.0, 10.0)
"""gVisor's task count is sampled every 0.2 s for the first 10 s of a run, then every 1 s (each sample is a
`runsc debug --ps`, ~45 ms of a process)."""
RUNSC_ROOTS = (
    "/var/run/docker/runtime-runc/moby",
    "/run/docker/runtime-runc/moby",
    "/var/run/docker/runtime-runsc/moby",
    "/run/docker/runtime-runsc/moby",
)
"""Where the engine's runsc keeps its containers' state (the runc shim with runsc as its binary, or runsc's own)."""


class CgroupWatcher:
    """Samples the container's cgroup counters while it runs: the runtime deletes the group at exit.

    Works for a local engine with the cgroupfs driver (v1 or v2) or the systemd driver (v2). Elsewhere the
    counters stay unknown and only Docker's own OOMKilled flag is reported.
    """

    def __init__(self, container_id: str) -> None:
        root = Path("/sys/fs/cgroup")
        self.files: dict[str, list[Path]] = {
            "pids": [
                root / "pids/docker" / container_id / "pids.events",
                root / "docker" / container_id / "pids.events",
                root / "system.slice" / f"docker-{container_id}.scope" / "pids.events",
            ],
            "peak": [
                root / "memory/docker" / container_id / "memory.max_usage_in_bytes",
                root / "docker" / container_id / "memory.peak",
                root / "system.slice" / f"docker-{container_id}.scope" / "memory.peak",
            ],
            "oom": [
                root / "memory/docker" / container_id / "memory.oom_control",
                root / "docker" / container_id / "memory.events",
                root / "system.slice" / f"docker-{container_id}.scope" / "memory.events",
            ],
        }
        self.stop = threading.Event()
        self.pids_limited = False
        self.oom_killed = False
        self.peak_memory_bytes: int | None = None
        self.runsc: RunscCounter | None = None
        self._runsc_at_cap = False

    def sample(self) -> None:
        for kind, paths in self.files.items():
            for p in paths:
                try:
                    text = p.read_text()
                except OSError:
                    continue
                if kind == "pids":
                    self.pids_limited |= _kv(text).get("max", 0) > 0
                elif kind == "oom":
                    self.oom_killed |= _kv(text).get("oom_kill", 0) > 0
                elif text.strip().isdigit():
                    self.peak_memory_bytes = max(self.peak_memory_bytes or 0, int(text))
                break

    def poll(self) -> None:
        """Runs in a thread until `stop` is set; one final sample catches counters of a fast exit. gVisor's task count
        is read in a thread of its own: a `runsc debug --ps` takes ~45 ms, seconds on a loaded host, and while the
        cgroup sampler waited on it a memory hog's container could exit and take its `oom_kill` counter with it (a
        gVisor run killed by its memory cap was reported as a plain SIGKILL: seen in CI)."""
        counter = threading.Thread(target=self._poll_runsc, daemon=True) if self.runsc is not None else None
        if counter is not None:
            counter.start()
        while not self.stop.wait(CGROUP_POLL_S):
            self.sample()
        self.sample()
        if counter is not None:
            counter.join()  # its last `runsc` call is bounded (5 s): what it saw is counted before the result is read
            self.pids_limited |= self._runsc_at_cap

    def _poll_runsc(self) -> None:
        assert self.runsc is not None
        started = time.monotonic()
        fast, slow, until = RUNSC_POLL_S
        while True:
            # Its own flag (one writer per attribute): merged into `pids_limited` once both threads are done.
            self._runsc_at_cap |= self.runsc.at_cap()
            wait = fast if time.monotonic() - started < until else slow
            if self.stop.wait(wait):
                return


class RunscCounter:
    """gVisor's own count of a container's tasks: at `limit`, the process cap was hit. gVisor enforces the cap
    (RLIMIT_NPROC) on tasks, threads included, so they are counted from `runsc debug --ps` (each process with its
    threads); `runsc events --stats` counts processes only and would miss a cap reached partly through threads."""

    def __init__(self, runsc: str, container_id: str, limit: int) -> None:
        self.runsc = runsc
        self.container_id = container_id
        self.limit = limit
        self.root: str | None = None

    def at_cap(self) -> bool:
        for root in [self.root] if self.root else RUNSC_ROOTS:
            try:
                r = subprocess.run(
                    [self.runsc, "--root", root, "debug", "--ps", self.container_id],
                    capture_output=True,
                    timeout=5,
                    env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
                )
            except (OSError, subprocess.SubprocessError):
                return False
            if r.returncode != 0:
                continue
            self.root = root
            return tasks(r.stdout) >= self.limit
        return False


def tasks(ps_output: bytes) -> int:
    """The number of tasks (threads) in `runsc debug --ps` output: a JSON list of processes, each with its `threads`,
    after a few lines of runsc's own chatter. 0 when there is no such list."""
    text = ps_output[:4_000_000].decode("utf-8", "replace")
    m = re.search(r"\[\s*\{", text)
    if m is None:
        return 0
    try:
        procs, _ = json.JSONDecoder().raw_decode(text[m.start() :])
    except ValueError:
        return 0
    if not isinstance(procs, list):
        return 0
    return sum(len(p.get("threads") or [0]) for p in procs if isinstance(p, dict))


def _kv(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out
