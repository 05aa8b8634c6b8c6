"""The sandbox's own Python on the host-filesystem backends (`bwrap`, `local`): a clean interpreter with the standard
library and the sandbox packages (pytest, pip, setuptools, wheel and what they require), and nothing else.

The worker itself runs in crewwork's virtualenv. A sandbox must never run a repository's tests, a setup or an agent
with that interpreter: crewwork's packages (and its pytest plugins) would be on their path, and a repository could
import, or shadow, what the worker runs. The docker image holds the same set of packages by construction
(crewwork/sandbox/image.py, `IMAGE_PACKAGES`); this module makes that set a virtualenv on the host:

- created from the *base* interpreter (`sys._base_executable`, never the worker's venv) with `--without-pip`, so its
  `sys.path` is the standard library plus its own site-packages (no user site, no system site-packages);
- the distributions' files copied from where they are installed (their RECORD), so nothing is downloaded;
- its console scripts are small shell launchers relative to their own directory (`pytest`, `pip`), so the venv works
  wherever a backend mounts it (bwrap mounts it read-only at TOOLCHAIN_INSIDE; `local` runs it where it is);
- built once per host and fingerprint (interpreter and distribution versions) in a temporary directory renamed into
  place under a lock, so a half-built toolchain is never used and concurrent workers build it once.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import uuid
from dataclasses import dataclass
from pathlib import Path

from crewwork.sandbox.base import SandboxUnavailable
from crewwork.sandbox.image import IMAGE_PACKAGES, distribution_closure, fingerprint

TOOLCHAIN_INSIDE = "/opt/crewwork/python"
"""Where the bwrap backend shows the toolchain inside the sandbox."""
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
READY = "crewwork-toolchain.ready"
# The modules (`python -m NAME`) each launcher in bin/ runs.
LAUNCHERS = {"pytest": "pytest", "py.test": "pytest", "pip": "pip", "pip3": "pip"}


def base_interpreter() -> str:
    """The interpreter the worker's virtualenv was made from (the worker's own when it runs in none)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def base_prefixes() -> list[str]:
    """Host directories the base interpreter needs at their own paths (its prefix and its binary's directory),
    leaving out those under /usr, which every backend shows anyway."""
    dirs = {os.path.realpath(sys.base_prefix), os.path.dirname(base_interpreter())}
    return sorted(d for d in dirs if not (d == "/usr" or d.startswith("/usr/")))


def base_site_packages() -> list[str]:
    """The base interpreter's own site-packages under `base_prefixes()`: whatever was installed into it globally
    (crewwork itself, in some deployments) is hidden from sandboxes."""
    prefixes = base_prefixes()
    paths = {os.path.realpath(sysconfig.get_paths(vars={"base": sys.base_prefix})[k]) for k in ("purelib", "platlib")}
    return sorted(p for p in paths if any(p.startswith(d + "/") for d in prefixes) and os.path.isdir(p))


@dataclass(frozen=True)
class Toolchain:
    """A built toolchain: `root` holds a venv (bin/, lib/, pyvenv.cfg)."""

    root: Path
    fingerprint: str

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def path(self, inside: str | None = None) -> str:
        """PATH for a run: the toolchain's bin (as seen at `inside`, default where it is on the host) first."""
        return f"{inside or self.root}/bin:{SYSTEM_PATH}"


@functools.cache
def toolchain_fingerprint() -> str:
    # The image's fingerprint covers the interpreter, the stdlib selection and every distribution's version.

    return fingerprint()


def ensure_toolchain(root: Path) -> Toolchain:
    """The toolchain for this interpreter and these packages under `root` (`SandboxSettings.toolchain_root()`),
    built first if it is not there. Raises SandboxUnavailable if it cannot be built (the message says why)."""
    root = Path(root)
    fp = toolchain_fingerprint()
    dest = root / fp
    if (dest / READY).is_file():
        return Toolchain(dest, fp)
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o755)
        _check_private(root)
        lock = os.open(root / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    except OSError as exc:
        raise SandboxUnavailable(f"cannot create the sandbox's Python under {root}: {exc}") from exc
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (dest / READY).is_file():
            _build(root, dest)
    finally:
        os.close(lock)
    return Toolchain(dest, fp)


def _check_private(root: Path) -> None:
    """Refuse a toolchain directory another user could write to: what is in it runs every repository's tests."""
    st = os.stat(root)
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SandboxUnavailable(
            f"{root} must belong to uid {os.geteuid()} and not be writable by others "
            "(set CREWWORK_SANDBOX_TOOLCHAIN_DIR to a private directory)"
        )


def _build(root: Path, dest: Path) -> None:
    tmp = root / f".tmp-{uuid.uuid4().hex[:12]}"
    try:
        # `-I`: the base interpreter itself ignores PYTHON* variables and the user site while it makes the venv.
        made = subprocess.run(
            [base_interpreter(), "-I", "-m", "venv", "--without-pip", str(tmp)],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if made.returncode != 0:
            raise SandboxUnavailable(f"making the sandbox's Python failed: {made.stderr.strip()[-2000:]}")
        site = Path(
            subprocess.run(
                [str(tmp / "bin" / "python"), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout.strip()
        )
        for dist in distribution_closure(IMAGE_PACKAGES):
            for f in dist.files or []:
                rel = str(f)
                if rel.startswith("..") or os.path.isabs(rel):
                    continue  # console scripts live outside site-packages; bin/ gets launchers instead
                src = Path(dist.locate_file(f))
                if not src.is_file() or "__pycache__" in Path(rel).parts:
                    continue
                target = site / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, target)
        for name, module in LAUNCHERS.items():
            launcher = tmp / "bin" / name
            # Relative to the launcher's own directory, so it works wherever the toolchain is mounted.
            launcher.write_text(f'#!/bin/sh\nexec "${{0%/*}}/python" -m {module} "$@"\n')
        for path in [tmp, *tmp.rglob("*")]:
            if path.is_symlink():
                continue
            mode = 0o755 if path.is_dir() or path.parent.name == "bin" else 0o644
            path.chmod(mode)
        (tmp / READY).write_text(toolchain_fingerprint() + "\n")
        if dest.exists():  # a leftover without its marker (a crash between the two renames' effects)
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"making the sandbox's Python under {root} failed: {exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
