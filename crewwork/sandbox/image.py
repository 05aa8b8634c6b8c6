"""Build the default sandbox image locally, with no registry: host files in a tarball, `docker import`ed.

The image holds this worker's Python interpreter (at the same absolute path, so its compiled-in prefix is
right), the standard library, pytest and pip from this environment (with their dependencies, so
`python -m pytest` works inside), a shell with the basic tools, and exactly the shared libraries all of
those link against.
It builds in seconds and needs nothing from the network.

Production path: point CREWWORK_SANDBOX_DOCKER_IMAGE at any image with a `python` on PATH (for example a
`python:3.11-slim` derivative with your project's dependencies, pulled from your own registry). Nothing in
the docker backend depends on how the image was built.

    python -m crewwork.sandbox.image [--name crewwork-sandbox:latest]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from crewwork.config.sandbox import DEFAULT_IMAGE
from crewwork.sandbox.base import SandboxError, SandboxUnavailable

TOOLS = (
    "sh dash bash cat ls echo true false sleep env mkdir rmdir rm cp mv touch id head tail wc sed grep find "
    "xargs sort uniq tr cut dirname basename readlink realpath chmod ln pwd test [ date stat diff cmp patch "
    "tee uname nproc timeout yes dd seq printf expr which git"
).split()
# ensurepip stays: a repository's environment is a venv created inside the sandbox (crewwork/sandbox/prepare.py).
STDLIB_SKIP = (
    "test", "idlelib", "tkinter", "turtledemo", "lib2to3", "site-packages",
    "config-",  # the static libpython, only for embedding
)  # fmt: skip
STDLIB_SKIP_NESTED = ("test", "tests", "idle_test")
# Development tools of the worker's environment that no sandboxed command needs.
# Distributions (with their dependencies) copied from this environment: enough to run a repository's tests
# and to install a work item's dependencies from mounted wheels. Operators add more with --package.
IMAGE_PACKAGES = ("pytest", "pip", "setuptools", "wheel")
IMAGE_PATH = "/usr/local/bin:/usr/bin:/bin"
# The C and C++ runtimes native programs expect of any Linux (agent CLIs' native binaries, compiled wheels such as
# pydantic-core): copied from the host where present, whether or not the interpreter itself links them.
RUNTIME_LIBS = (
    "libgcc_s.so.1", "libstdc++.so.6", "libpthread.so.0", "libdl.so.2", "libm.so.6", "librt.so.1", "libutil.so.1",
    "libresolv.so.2", "libz.so.1",
)  # fmt: skip
LAYOUT = "3: runtime libraries"
"""Part of the fingerprint: bumped when what the image holds changes (so `--if-stale` rebuilds an older image)."""


class _RootfsTar:
    """A tarball assembled from host paths, keeping each path's canonical location and its symlinks."""

    def __init__(self, fileobj: io.BufferedWriter) -> None:
        self.tar = tarfile.open(fileobj=fileobj, mode="w")
        self.seen: set[str] = set()
        self.written: set[str] = set()

    def _emit(self, info: tarfile.TarInfo, source: str | None = None) -> None:
        # docker import rejects an archive that names a path twice.
        if info.name in self.written:
            return
        self.written.add(info.name)
        if source is not None and info.isreg():
            with open(source, "rb") as f:
                self.tar.addfile(info, f)
        else:
            self.tar.addfile(info)

    def _add_host(self, source: str, arcname: str) -> None:
        self._emit(self.tar.gettarinfo(source, arcname=arcname), source)

    def _dir_chain(self, path: str) -> None:
        parts = Path(path).parts[1:-1]
        cur = ""
        for part in parts:
            cur += "/" + part
            if cur in self.seen:
                continue
            self.seen.add(cur)
            if os.path.realpath(os.path.dirname(cur)) != os.path.dirname(cur):
                # Reached through a symlinked ancestor (/lib -> usr/lib): the canonical chain holds it.
                continue
            if os.path.islink(cur):
                self._symlink(cur)
                continue
            info = tarfile.TarInfo(cur.lstrip("/"))
            info.type = tarfile.DIRTYPE
            # 0755 even for /root: the sandbox user is not root and must traverse to the interpreter.
            info.mode = 0o755
            self._emit(info)

    def _symlink(self, path: str) -> None:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
        info.mode = 0o777
        self._emit(info)

    def add(self, path: str) -> None:
        """Add a file (or a symlink and what it points to), creating parent directories as needed."""
        path = os.path.normpath(path)
        parent = os.path.dirname(path)
        # Store under the canonical parent (/lib/x -> /usr/lib/x) while keeping top-level symlinks.
        self._dir_chain(parent + "/x")
        real_parent = os.path.realpath(parent)
        path = os.path.join(real_parent, os.path.basename(path))
        if path in self.seen:
            return
        self.seen.add(path)
        self._dir_chain(path)
        if os.path.islink(path):
            self._symlink(path)
            self.add(os.path.join(real_parent, os.readlink(path)))
        elif os.path.isfile(path):
            self._add_host(path, path.lstrip("/"))

    def add_tree(
        self, src: str, dest: str | None = None, skip: Iterable[str] = (), skip_nested: Iterable[str] = ()
    ) -> None:
        """Copy a directory tree, skipping top-level names in `skip` and directories named `skip_nested`
        anywhere (test suites), and optimised bytecode nobody runs by default."""
        src = os.path.realpath(src)
        dest = dest or src
        skip_set = tuple(skip)
        nested = set(skip_nested)
        self._dir_chain(dest + "/x")
        for root, dirs, files in os.walk(src):
            rel = os.path.relpath(root, src)
            if rel == ".":
                dirs[:] = [d for d in dirs if not d.startswith(skip_set) and d not in skip_set]
                files = [f for f in files if not f.startswith(skip_set)]
            dirs[:] = [d for d in dirs if d not in nested]
            files = [f for f in files if ".opt-" not in f]
            target_root = os.path.normpath(os.path.join(dest, rel))
            for name in dirs:
                self._add_host(os.path.join(root, name), os.path.join(target_root, name)[1:])
                self.seen.add(os.path.join(target_root, name))
            for name in files:
                self._add_host(os.path.join(root, name), os.path.join(target_root, name)[1:])

    def add_file_as(self, source: str, dest: str) -> None:
        self._dir_chain(dest)
        self._add_host(source, dest.lstrip("/"))

    def add_bytes(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._dir_chain(path)
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size = len(data)
        info.mode = mode
        self.written.add(info.name)
        self.tar.addfile(info, io.BytesIO(data))
        self.seen.add(path)

    def add_dir(self, path: str, mode: int) -> None:
        self._dir_chain(path + "/x")
        info = tarfile.TarInfo(path.lstrip("/"))
        info.type = tarfile.DIRTYPE
        info.mode = mode
        self._emit(info)

    def close(self) -> None:
        self.tar.close()


def _shared_libs(binaries: list[str]) -> set[str]:
    libs: set[str] = set()
    for start in range(0, len(binaries), 200):
        out = subprocess.run(
            ["ldd", *binaries[start : start + 200]], capture_output=True, text=True, check=False
        ).stdout
        for line in out.splitlines():
            line = line.strip()
            if line.endswith(":"):
                continue  # ldd's per-file header when given several files
            if "=>" in line:
                target = line.split("=>", 1)[1].split("(")[0].strip()
            else:
                target = line.split("(")[0].strip()
            if target.startswith("/"):
                libs.add(target)
    return libs


def _host_lib(name: str) -> str | None:
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
              "/lib64", "/usr/lib64", "/lib", "/usr/lib"):  # fmt: skip
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return None


def _elf_files(tree: str) -> list[str]:
    return [
        os.path.join(root, f)
        for root, _, files in os.walk(tree)
        for f in files
        if ".so" in f and not os.path.islink(os.path.join(root, f))
    ]


def distribution_closure(names: Iterable[str]) -> list[Any]:
    """The installed distributions `names` and everything they require (markers evaluated for this host)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, Any] = {}
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[name] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(found.values(), key=lambda d: canonicalize_name(d.metadata["Name"]))


def fingerprint(packages: Sequence[str] = IMAGE_PACKAGES) -> str:
    """What the image is made of: the interpreter and the copied distributions (a stale image differs)."""
    import hashlib

    dists = [f"{d.metadata['Name']}=={d.version}" for d in distribution_closure(packages)]
    text = "\n".join([os.path.realpath(sys.executable), sys.version, repr(STDLIB_SKIP), LAYOUT, *dists])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def image_is_current(name: str, *, base_url: str | None = None, packages: Sequence[str] = IMAGE_PACKAGES) -> bool:
    """True if `name` exists locally and was built from this interpreter and these packages."""
    import docker
    import docker.errors

    try:
        client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
        labels = client.images.get(name).labels or {}
    except docker.errors.DockerException:
        return False
    return labels.get("crewwork.sandbox.fingerprint") == fingerprint(packages)


def write_rootfs_tar(out: io.BufferedWriter, packages: Sequence[str] = IMAGE_PACKAGES) -> dict[str, str]:
    """Write the image's root filesystem as a tar stream. Returns facts for the image's labels."""
    base = os.path.realpath(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    exe = os.path.realpath(sys.executable)
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    image_site = os.path.join(stdlib, "site-packages")
    # (host file, image path) of every file the chosen distributions installed (their RECORD).
    dist_files: list[tuple[str, str]] = []
    for dist in distribution_closure(packages):
        for f in dist.files or []:
            host = os.path.realpath(dist.locate_file(f))
            if os.path.isfile(host) and not str(f).startswith(".."):
                dist_files.append((host, os.path.normpath(os.path.join(image_site, str(f)))))

    rootfs = _RootfsTar(out)
    for top_dir in ("/bin", "/sbin", "/lib", "/lib64"):
        if os.path.islink(top_dir):
            rootfs.add(top_dir)
    tools = [t for t in (shutil.which(n, path="/usr/bin:/bin") for n in TOOLS) if t]
    elf = [exe, *tools, *_elf_files(os.path.join(stdlib, "lib-dynload")), *(h for h, _ in dist_files if ".so" in h)]
    for libdir in ("lib", "lib64"):
        for f in Path(base, libdir).glob("libpython*.so*"):
            rootfs.add(str(f))
            elf.append(str(f))
    runtime = [p for p in (_host_lib(n) for n in RUNTIME_LIBS) if p]
    for path in [*tools, exe, *sorted(_shared_libs(elf + runtime) | set(runtime))]:
        rootfs.add(path)
    # git execs helpers from git-core; without them `git diff` inside fails confusingly.
    if shutil.which("git", path="/usr/bin:/bin") and os.path.isdir("/usr/lib/git-core"):
        rootfs.add_tree("/usr/lib/git-core")
    rootfs.add_tree(stdlib, skip=STDLIB_SKIP, skip_nested=STDLIB_SKIP_NESTED)
    # The worker's venv packages become the image interpreter's own site-packages (no venv in the image).
    for host, image_path in dist_files:
        rootfs.add_file_as(host, image_path)
    for etc_file in ("/etc/ld.so.cache", "/etc/ld.so.conf"):
        if os.path.exists(etc_file):
            rootfs.add(etc_file)
    rootfs.add_bytes(
        "/etc/passwd",
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/usr/sbin/nologin\n",
    )
    rootfs.add_bytes("/etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    rootfs.add_dir("/usr/local/bin", 0o755)
    rootfs.add_dir("/tmp", 0o1777)
    for d in ("/proc", "/dev", "/sys", "/workspace"):
        rootfs.add_dir(d, 0o755)
    for name in ("python3", "python", version):
        info = tarfile.TarInfo(f"usr/local/bin/{name}")
        info.type = tarfile.SYMTYPE
        info.linkname = exe
        rootfs._emit(info)
    rootfs.close()
    return {
        "crewwork.sandbox.python": exe,
        "crewwork.sandbox.python-version": sys.version.split()[0],
        "crewwork.sandbox.fingerprint": fingerprint(packages),
    }


def build_image(
    name: str = DEFAULT_IMAGE, *, base_url: str | None = None, packages: Sequence[str] = IMAGE_PACKAGES
) -> str:
    """Build `name` from host files and import it into the local engine. Returns the image id."""
    import docker
    import docker.errors

    try:
        client = docker.DockerClient(base_url=base_url, timeout=600) if base_url else docker.from_env(timeout=600)
        client.ping()
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(
            f"cannot reach the Docker engine to build {name}: {exc}. Start it (e.g. `.ci/docker-up.sh`)."
        ) from exc
    try:
        old_id: str | None = str(client.images.get(name).id)
    except docker.errors.ImageNotFound:
        old_id = None
    repo, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "latest")
    with tempfile.TemporaryDirectory(prefix="crewwork-image-") as tmp:
        tar_path = os.path.join(tmp, "rootfs.tar")
        with open(tar_path, "wb") as f:
            labels = write_rootfs_tar(f, packages)
        changes = [
            f"ENV PATH={IMAGE_PATH}",
            "ENV LANG=C.UTF-8",
            "ENV HOME=/tmp",
            "WORKDIR /workspace",
            "USER 65534:65534",
            'CMD ["python3"]',
            *(f'LABEL {k}="{v}"' for k, v in labels.items()),
        ]
        try:
            out = client.api.import_image_from_file(tar_path, repository=repo, tag=tag, changes=changes)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"docker import of {name} failed: {exc}") from exc
    try:
        new_id = str(client.images.get(name).id)
    except docker.errors.ImageNotFound as exc:
        raise SandboxError(f"docker import reported {out!r} but image {name} is not there") from exc
    if old_id and old_id != new_id:
        # The rebuilt tag leaves the previous image dangling; drop it unless a container still uses it.
        with contextlib.suppress(docker.errors.DockerException):
            client.images.remove(old_id)
    return new_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the crewwork sandbox image from host files.")
    parser.add_argument("--name", default=DEFAULT_IMAGE, help=f"image name (default {DEFAULT_IMAGE})")
    parser.add_argument("--if-stale", action="store_true", help="build only if missing or built from other packages")
    parser.add_argument(
        "--package",
        action="append",
        default=[],
        metavar="DIST",
        help="also copy this installed distribution and its dependencies (repeatable)",
    )
    args = parser.parse_args(argv)
    packages = [*IMAGE_PACKAGES, *args.package]
    if args.if_stale and image_is_current(args.name, packages=packages):
        print(f"{args.name} is current (fingerprint {fingerprint(packages)})")
        return 0
    started = time.monotonic()
    try:
        image_id = build_image(args.name, packages=packages)
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"built {args.name} ({image_id[:19]}) in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
