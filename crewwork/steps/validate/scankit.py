"""The scanner kit: how Bandit and detect-secrets get into the sandbox without installing anything at run time.

The worker has them installed (the `scanners` extra of crewwork's pyproject; the local package mirror provides them,
nothing is downloaded when a scan runs). The kit is a host directory holding

- `crewwork_scan.py`, the runner (crewwork/validation/scanners/sandbox_scan.py, read as a file, never imported here),
- `site/`, the files of the installed `bandit` and `detect-secrets` distributions and everything they require,
  copied from their RECORD as the sandbox toolchain is (crewwork/sandbox/toolchain.py),

compiled to bytecode by the worker's interpreter (the sandbox's Python is made from the same one), built once per
content fingerprint (runner source, interpreter and distribution versions) into a temporary directory renamed into
place, world-readable, owned by the worker. Runs mount it read-only at KIT_INSIDE; the sandbox's own Python runs the
runner with `-I`, so neither the workspace nor PYTHON* variables come before the kit on `sys.path`. Only these
packages' files are in it: no worker configuration, no credentials, nothing of crewwork's virtualenv besides them.
"""

from __future__ import annotations

import compileall
import contextlib
import fcntl
import hashlib
import importlib.resources
import os
import shutil
import sys
import uuid
from pathlib import Path

from crewwork.sandbox.base import Mount

KIT_INSIDE = "/crewwork/scanners"
"""Where a run sees the kit (read-only), on every backend that remaps paths."""
RUNNER = "crewwork_scan.py"
PACKAGES = ("bandit", "detect-secrets")
READY = "crewwork-scanners.ready"


class KitUnavailable(RuntimeError):
    """The worker cannot build the kit (the scanners are not installed, or the directory is not writable)."""


def _dists() -> list[object]:
    from importlib import metadata

    from crewwork.sandbox.image import distribution_closure

    for name in PACKAGES:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise KitUnavailable(
                f"the scanner {name!r} is not installed on this worker: install crewwork with its `scanners` extra "
                "(pip install 'crewwork[scanners]') from your package mirror"
            ) from None
    return list(distribution_closure(PACKAGES))


def kit_fingerprint(source: bytes, dists: list[object]) -> str:
    names = sorted(f"{d.metadata['Name']}=={d.version}" for d in dists)  # type: ignore[attr-defined]
    return hashlib.sha256(b"\n".join([source, sys.version.encode(), *(n.encode() for n in names)])).hexdigest()[:16]


def ensure_kit(data_dir: Path) -> Path:
    """The kit directory for this worker's scanners under `data_dir/scanners`, built first if missing."""
    source = importlib.resources.files("crewwork.validation.scanners").joinpath("sandbox_scan.py").read_bytes()
    dists = _dists()
    root = data_dir.resolve() / "scanners"
    dest = root / kit_fingerprint(source, dists)
    if (dest / READY).is_file():
        return dest
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o755)
        root.chmod(0o755)
        lock = os.open(root / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    except OSError as exc:
        raise KitUnavailable(f"cannot create the scanner kit under {root}: {exc}") from exc
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (dest / READY).is_file():
            _build(root, dest, source, dists)
    finally:
        os.close(lock)
    return dest


def _build(root: Path, dest: Path, source: bytes, dists: list[object]) -> None:
    tmp = root / f".tmp-{uuid.uuid4().hex[:12]}"
    try:
        site = tmp / "site"
        site.mkdir(parents=True)
        for dist in dists:
            for f in dist.files or []:  # type: ignore[attr-defined]
                rel = str(f)
                if rel.startswith("..") or os.path.isabs(rel) or "__pycache__" in Path(rel).parts:
                    continue
                src = Path(dist.locate_file(f))  # type: ignore[attr-defined]
                if not src.is_file():
                    continue
                target = site / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, target)
        (tmp / RUNNER).write_bytes(source)
        # Bytecode now, by this interpreter (the sandbox's Python is the same one: the toolchain and the image are
        # made from it): the mount is read-only, so without it every scan would compile Bandit, detect-secrets,
        # requests, rich and pygments again (~1 s).
        compileall.compile_dir(str(site), quiet=1, workers=1)
        for path in [tmp, *tmp.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)
        (tmp / READY).write_text("ready\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except OSError as exc:
        raise KitUnavailable(f"building the scanner kit under {root} failed: {exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)


def kit_mount(data_dir: Path) -> Mount:
    return Mount(ensure_kit(data_dir), KIT_INSIDE)
