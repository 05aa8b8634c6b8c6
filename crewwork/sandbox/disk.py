"""Disk caps for workspaces: each workspace is its own small ext4 file system in a sparse loopback image.

A run can fill its workspace, never the host: the image is `disk_mb` large (sparse, so it costs only what is
written), created with `truncate` + `mkfs.ext4` (no journal, no reserved blocks, root directory owned by the
sandbox user) and mounted `nosuid,nodev,noatime`, which takes about 30 ms. Because the workspace is a file
system of its own, a hard link from it to any host file is impossible (EXDEV), whatever uid the sandbox has.
Inode exhaustion hits the same cap. When the file system is full at the end of a run, the result says
`disk_limited`.

Why loopback images rather than project quotas: quotas need the host file system to be mounted with `prjquota`
(an operator's fstab change on every worker) and still share the host's inode table; a loop image works on
any host where the worker is root, and removing a workspace is one unmount, whatever it holds. Where the worker
is not root (or loop devices are not available), `CREWWORK_SANDBOX_WORKSPACE_DISK=none` runs without a disk
cap and every validation result says so (`sandbox.workspace_disk: none`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from crewwork.config.sandbox import SandboxLimits, SandboxSettings

MOUNT_OPTIONS = "loop,nosuid,nodev,noatime"
# A file system with less than this left is full for any practical purpose: the run hit the cap. Programs write in
# buffers of up to 1 MiB (a 1 MiB write fails with 600 KiB left, and the program stops there), so the margin is 2 MiB.
FULL_BYTES = 2 * 1024 * 1024
FULL_INODES = 8


class DiskError(RuntimeError):
    """The disk cap could not be set up (the message says how to fix it or turn it off)."""


@functools.cache
def loop_available() -> tuple[bool, str]:
    """Whether per-workspace loopback file systems can be made here, and why not."""
    if os.geteuid() != 0:
        return False, "the worker is not root (mounting a loop image needs root)"
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            return False, f"{tool} is not installed (apt-get install -y e2fsprogs mount)"
    if not os.path.exists("/dev/loop-control"):
        return False, "/dev/loop-control is missing (no loop device support)"
    return True, "loopback ext4 images"


def workspace_disk_mb(settings: SandboxSettings, limits: SandboxLimits) -> int | None:
    """The disk size to give a workspace under `settings`, or None for no disk cap."""
    if settings.workspace_disk == "none":
        return None
    if settings.workspace_disk == "auto" and not loop_available()[0]:
        return None
    return limits.disk_mb


def prepare_disk_cap_mb(settings: SandboxSettings) -> int | None:
    """The disk size of a prepared environment entry, or None when workspace disk caps are off (`none`, or `auto`
    where loop images cannot be made): both caps are the same mechanism, on or off together."""
    return workspace_disk_mb(settings, SandboxLimits(disk_mb=settings.prepare_disk_mb))


def _tool(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or name


async def _run(*argv: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace").strip()


@dataclass
class WorkspaceDisk:
    """One mounted workspace image."""

    image: Path
    mountpoint: Path
    size_mb: int

    @classmethod
    async def create(cls, image: Path, mountpoint: Path, size_mb: int, owner: tuple[int, int]) -> WorkspaceDisk:
        ok, why = loop_available()
        if not ok:
            raise DiskError(
                f"cannot give the workspace a disk cap: {why}; set CREWWORK_SANDBOX_WORKSPACE_DISK=none to run "
                "without one (results then say workspace_disk: none)"
            )
        image.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(image, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size_mb * 1024 * 1024)
        finally:
            os.close(fd)
        disk = cls(image, mountpoint, size_mb)
        try:
            code, out = await _run(
                _tool("mkfs.ext4"),
                "-q",
                "-F",
                "-O",
                "^has_journal",
                "-m",
                "0",
                "-L",
                "crewwork-ws",
                "-E",
                f"lazy_itable_init=1,nodiscard,root_owner={owner[0]}:{owner[1]}",
                str(image),
            )
            if code != 0:
                raise DiskError(f"mkfs.ext4 failed: {out}")
            mountpoint.mkdir(parents=True, exist_ok=True)
            code, out = await _run(_tool("mount"), "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(mountpoint))
            if code != 0:
                raise DiskError(f"mounting the workspace image failed: {out}")
            with contextlib.suppress(OSError):
                os.rmdir(mountpoint / "lost+found")  # an empty ext4 artefact that is nobody's change
        except BaseException:
            await asyncio.shield(disk.remove())
            raise
        return disk

    async def remove(self) -> None:
        """Unmount (lazily if something still holds it) and delete the image. Safe to call twice."""
        if is_mountpoint(self.mountpoint):
            await unmount(self.mountpoint)
        with contextlib.suppress(FileNotFoundError):
            self.image.unlink()


async def unmount(path: Path) -> None:
    code, out = await _run(_tool("umount"), str(path))
    if code != 0 and is_mountpoint(path):
        code, out = await _run(_tool("umount"), "-l", str(path))
        if code != 0 and is_mountpoint(path):
            raise DiskError(f"could not unmount {path}: {out}")


def unmount_blocking(path: Path) -> None:
    """`unmount` for synchronous callers (lazily if something still holds it)."""
    import subprocess

    for argv in ([_tool("umount"), str(path)], [_tool("umount"), "-l", str(path)]):
        if not is_mountpoint(path):
            return
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if is_mountpoint(path):
        raise DiskError(f"could not unmount {path}: {(out.stdout + out.stderr).strip()}")


def _mountpoints() -> list[str]:
    out = []
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                fields = line.split(b" ")
                if len(fields) > 4:
                    # mountinfo escapes space, tab, newline and backslash as octal.
                    raw = fields[4].decode("utf-8", "surrogateescape")
                    out.append(
                        raw.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
                    )
    except OSError:
        pass
    return out


def is_mountpoint(path: Path) -> bool:
    return str(path) in _mountpoints()


async def unmount_all_under(root: Path) -> list[str]:
    """Unmount every file system mounted at or below `root` (deepest first), e.g. after a crashed worker."""
    root_s = str(Path(root).resolve())
    found = sorted({m for m in _mountpoints() if m == root_s or m.startswith(root_s + "/")}, key=len, reverse=True)
    for m in found:
        await unmount(Path(m))
    return found


def is_full(path: Path) -> bool:
    """True when the file system holding `path` has (almost) no space or no inodes left."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < FULL_BYTES or (st.f_files > 0 and st.f_favail < FULL_INODES)
