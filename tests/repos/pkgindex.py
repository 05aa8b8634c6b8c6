"""A PEP 503 package index on loopback, and a real third-party project's repository rebuilt from its sdist.

The packages come from the cache scripts/test-env.sh filled at install time (`.cache/test-packages`, or
`$CREWWORK_TEST_PACKAGES`); this module never downloads anything. `PackageIndex` writes a `simple/` tree (one
page per normalised project name, links with sha256 fragments) and serves it with `python -m http.server`.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

from crewwork.temporal.devserver import free_port
from tests.repos.servers import GIT_ENV, _wait_port, git

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = Path(os.environ.get("CREWWORK_TEST_PACKAGES") or ROOT / ".cache" / "test-packages")
PINS = [
    tuple(line.split())
    for line in (Path(__file__).parent / "test-packages.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]
WHEEL_PINS = [pin for kind, pin in PINS if kind == "wheel"]
SDIST_PINS = [pin for kind, pin in PINS if kind == "sdist"]
TOOLZ = next(pin for pin in SDIST_PINS if pin.startswith("toolz=="))


def packages_ready() -> tuple[bool, str]:
    """Whether test-env.sh has downloaded the packages (the tests that need them skip, and fail under CI, if not)."""
    missing = [pin for pin in WHEEL_PINS if not list((PACKAGES / "wheels").glob(_glob(pin, "whl")))]
    missing += [pin for pin in SDIST_PINS if not list((PACKAGES / "sdists").glob(_glob(pin, "tar.gz")))]
    if missing:
        return False, f"test packages {missing} are not in {PACKAGES}; run scripts/test-env.sh (make test-env)"
    return True, ""


def _glob(pin: str, ext: str) -> str:
    name, version = pin.split("==")
    return f"{name.replace('-', '_')}-{version}*.{ext}" if ext == "whl" else f"{name}-{version}.{ext}"


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build_simple_tree(files: list[Path], dest: Path) -> Path:
    """`dest/simple/<project>/index.html` for each distribution file (copied to `dest/files/`)."""
    (dest / "files").mkdir(parents=True, exist_ok=True)
    projects: dict[str, list[Path]] = {}
    for f in files:
        shutil.copy(f, dest / "files" / f.name)
        name = f.name.split("-")[0]
        projects.setdefault(normalise(name), []).append(f)
    simple = dest / "simple"
    simple.mkdir(exist_ok=True)
    links = []
    for project, dists in sorted(projects.items()):
        (simple / project).mkdir(exist_ok=True)
        rows = []
        for d in dists:
            digest = hashlib.sha256(d.read_bytes()).hexdigest()
            rows.append(f'<a href="../../files/{html.escape(d.name)}#sha256={digest}">{html.escape(d.name)}</a><br>')
        (simple / project / "index.html").write_text(
            f"<!DOCTYPE html><html><body><h1>{project}</h1>{''.join(rows)}</body></html>\n"
        )
        links.append(f'<a href="{project}/">{project}</a><br>')
    (simple / "index.html").write_text(f"<!DOCTYPE html><html><body>{''.join(links)}</body></html>\n")
    return simple


class PackageIndex:
    """The wheelhouse behind a PEP 503 `simple/` index, served by `python -m http.server` on 127.0.0.1."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/simple/"

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> PackageIndex:
        build_simple_tree(sorted((PACKAGES / "wheels").glob("*.whl")), self.dest)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(self.port), "--bind", "127.0.0.1", "--directory", str(self.dest)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(self.port, self.proc)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)


# A bug planted in the base commit, and the upstream code the agent's change restores: toolz's own
# tests (`test_frequencies` and the doctests) judge the fix.
TOOLZ_FILE = "toolz/itertoolz.py"
TOOLZ_RIGHT = "        d[item] += 1\n"
TOOLZ_BUG = "        d[item] += 2\n"


def toolz_repo(dest: Path) -> tuple[Path, str]:
    """A git repository of the toolz sdist (commit 1, upstream) with a planted bug (commit 2, `main`). Returns
    (work tree, upstream content of TOOLZ_FILE)."""
    return sdist_repo(TOOLZ, dest, TOOLZ_FILE, TOOLZ_RIGHT, TOOLZ_BUG, "frequencies: count twice")


def sdist_repo(pin: str, dest: Path, path: str, right: str, bug: str, what: str) -> tuple[Path, str]:
    """A git repository of the sdist of `pin` (commit 1, upstream) with a planted bug (commit 2, `main`): the one
    occurrence of `right` in `path` replaced by `bug`. Returns (work tree, upstream content of `path`)."""
    sdist = next((PACKAGES / "sdists").glob(_glob(pin, "tar.gz")))
    with tarfile.open(sdist) as tf:
        tf.extractall(dest.parent / "extract", filter="data")
    top = next((dest.parent / "extract").iterdir())
    shutil.move(str(top), dest)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=dest, check=True, env=GIT_ENV)
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", f"{pin} from its sdist")
    upstream = (dest / path).read_text()
    assert upstream.count(right) == 1, "the planted bug's anchor moved; pick another"
    (dest / path).write_text(upstream.replace(right, bug))
    git(dest, "commit", "-qam", f"{what} (planted bug)")
    return dest, upstream


@contextlib.contextmanager
def served_index(dest: Path) -> Iterator[PackageIndex]:
    with PackageIndex(dest) as index:
        yield index
