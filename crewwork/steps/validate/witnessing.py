"""The validate step's side of the outcome witness: put the plugin where the run can import it, tell pytest to load it
first, and read back what it wrote without trusting it (the plugin: crewwork/validation/witness_plugin.py; the
judgement: crewwork/validation/witness.py)."""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from crewwork.boundary import safefs
from crewwork.models import EvidenceCut
from crewwork.sandbox.base import Mount, Sandbox
from crewwork.validation.witness import MAX_STREAMS, MAX_WITNESS_BYTES, PLUGIN_MODULE, WITNESS_DIR
from crewwork.workspace.tree import gitops

PLUGIN_INSIDE = "/crewwork/witness"
"""Where a run sees the directory holding the plugin (read-only), on every backend that remaps paths."""
STREAMS_REL = f"{gitops.PLATFORM_DIR}/{WITNESS_DIR}"
"""The workspace directory the plugin writes its streams to (made by the host, owned by the sandbox user)."""


def install_plugin(data_dir: Path) -> Path:
    """A host directory holding only `crewwork_witness.py`, this crewwork's plugin, world-readable; one per version
    of the plugin's source, written once (atomically) and reused."""
    # Read as a file, never imported here: it imports pytest, which the worker need not have.
    source = importlib.resources.files("crewwork.validation").joinpath("witness_plugin.py").read_bytes()
    target = data_dir.resolve() / "witness" / hashlib.sha256(source).hexdigest()[:16]
    plugin = target / f"{PLUGIN_MODULE}.py"
    if plugin.is_file() and plugin.read_bytes() == source:
        return target
    target.mkdir(parents=True, exist_ok=True)
    target.chmod(0o755)
    tmp = target / f".{PLUGIN_MODULE}.{os.getpid()}.tmp"
    tmp.write_bytes(source)
    tmp.chmod(0o644)
    os.replace(tmp, plugin)
    return target


@dataclass
class WitnessRun:
    """What a test run needs to carry the witness: one more mount and three environment variables."""

    mount: Mount
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def prepare(cls, sandbox: Sandbox, data_dir: Path, workspace: Path, env: dict[str, str]) -> WitnessRun:
        mount = Mount(install_plugin(data_dir), PLUGIN_INSIDE)
        inside = sandbox.inside(mount)
        path = ":".join(p for p in (inside, env.get("PYTHONPATH", "")) if p)
        addopts = " ".join(p for p in (f"-p {PLUGIN_MODULE}", env.get("PYTEST_ADDOPTS", "")) if p)
        streams = f"{sandbox.workspace_inside(workspace)}/{STREAMS_REL}"
        return cls(mount, {"PYTHONPATH": path, "PYTEST_ADDOPTS": addopts, "CREWWORK_WITNESS_DIR": streams})


@dataclass
class Streams:
    """What the host read of the witness directory."""

    streams: dict[str, bytes] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    cut: EvidenceCut | None = None


def read_streams(workspace: Path) -> Streams:
    """Every stream in the witness directory: regular single-link files only, none followed, at most MAX_STREAMS
    files and MAX_WITNESS_BYTES in all (over it: a decisive cut). Anything else there is refused by name."""
    out = Streams()
    root = safefs.open_root(workspace)
    try:
        try:
            pfd = safefs.lookup(root, STREAMS_REL)
        except FileNotFoundError:
            return out
        except safefs.Refused as exc:
            out.refused.append(f"{STREAMS_REL}: {exc.reason}")
            return out
        with safefs.opened(pfd):
            st = os.fstat(pfd)
            if not stat.S_ISDIR(st.st_mode):
                out.refused.append(f"{STREAMS_REL}: {safefs.describe(st)}, not the witness directory")
                return out
            dfd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        with safefs.opened(dfd):
            left = MAX_WITNESS_BYTES
            for name, _est in safefs.entries(dfd)[: MAX_STREAMS + 1]:
                shown = name.decode("utf-8", "replace")
                rel = f"{STREAMS_REL}/{shown}".encode()
                try:
                    fd, _st = safefs.open_child_regular(dfd, name, max_bytes=left, allow_hardlinks=False, rel=rel)
                    with safefs.opened(fd):
                        data = b"".join(safefs.iter_fd(fd, max_bytes=left, rel=rel))
                except safefs.TooLarge:
                    out.cut = EvidenceCut(
                        what="witness streams",
                        bound="MAX_WITNESS_BYTES",
                        limit=MAX_WITNESS_BYTES,
                        unit="bytes",
                        seen=None,
                        kept=MAX_WITNESS_BYTES - left,
                        decisive=True,
                        why="the host reads no more of the outcome witness than its bound, so it could not compare",
                    )
                    return out
                except (safefs.Refused, OSError) as exc:
                    out.refused.append(f"{shown}: {getattr(exc, 'reason', None) or exc}")
                    continue
                left -= len(data)
                out.streams[shown] = data
    finally:
        os.close(root)
    return out
