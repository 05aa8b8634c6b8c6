"""Fixtures for repository tests: bare repositories served by real git servers on loopback, and operator
credentials kept outside every directory a sandbox or the data directory could expose."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from crewwork.cli.demo import BUGGY, TEST
from tests.conftest import make_repo
from tests.repos.servers import GitDaemon, SmartHttp, Sshd, bare_from


@dataclass
class Served:
    """One bare repository `acme/calc.git` under `root`, its working source, and the servers exposing it."""

    root: Path
    work: Path
    bare: Path
    name: str = "acme/calc.git"


@pytest.fixture
def served(tmp_path: Path) -> Served:
    work = make_repo(tmp_path / "src" / "calc", {"calc.py": BUGGY, "tests/test_calc.py": TEST, "conftest.py": ""})
    root = tmp_path / "served"
    bare = bare_from(work, root / "acme" / "calc.git")
    return Served(root=root, work=work, bare=bare)


@pytest.fixture
def secret_dir(tmp_path: Path) -> Path:
    d = tmp_path / "secrets"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def http_password() -> str:
    # Distinctive, so a leak anywhere is found by a plain substring search.
    return "tok-" + secrets.token_hex(16)


@pytest.fixture
def daemon(served: Served, tmp_path: Path) -> Iterator[GitDaemon]:
    with GitDaemon(served.root, tmp_path / "git-daemon.log") as d:
        yield d


@pytest.fixture
def smart_http(served: Served, http_password: str) -> Iterator[SmartHttp]:
    with SmartHttp(served.root, password=http_password) as s:
        yield s


@pytest.fixture
def sshd(tmp_path: Path, secret_dir: Path) -> Iterator[Sshd]:
    ok, why = Sshd.available()
    if not ok:
        pytest.skip(why)
    with Sshd(tmp_path / "sshd", secret_dir) as s:
        yield s
