"""A landed change in a real git repository and the facts a bundle states about it, for the bundle tests."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

from securesystemslib.signer import CryptoSigner

from crewwork.attestation.canonical import canonical
from crewwork.attestation.facts import AttemptFact, Facts, FileFact, LandedFact, ReviewFact, TestFact
from crewwork.attestation.format import run_url
from crewwork.attestation.keys import PublicKey
from crewwork.attestation.sign import sign_bundle
from crewwork.attestation.treedigest import tree_digest
from tests.conftest import GIT_ENV

JUNIT = b'<testsuite tests="2" failures="0"><testcase classname="t" name="a"/><testcase classname="t" name="b"/></testsuite>'


def git(repo: Path, *args: str, input_: bytes | None = None) -> str:
    env = {**GIT_ENV, "GIT_COMMITTER_DATE": "1764590400 +0000", "GIT_AUTHOR_DATE": "1764590400 +0000"}
    return (
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, input=input_, env=env)
        .stdout.decode()
        .strip()
    )


def landed_repo(path: Path, change: str = "def add(a, b):\n    return a + b\n") -> tuple[Path, str, str, bytes]:
    """A repository whose `main` is the base and `crewwork/wi_a` one commit on top (the landed change).
    Returns (repo, base commit, landed commit, diff)."""
    path.mkdir(parents=True)
    (path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (path / "tests").mkdir()
    (path / "tests" / "test_calc.py").write_text("from calc import add\n\ndef test_a():\n    assert add(1, 1) == 2\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "base")
    base = git(path, "rev-parse", "HEAD")
    git(path, "checkout", "-q", "-b", "crewwork/wi_a")
    (path / "calc.py").write_text(change)
    diff = subprocess.run(["git", "diff"], cwd=path, capture_output=True, check=True).stdout
    git(path, "commit", "-qam", "fix add")
    landed = git(path, "rev-parse", "HEAD")
    git(path, "checkout", "-q", "main")
    return path, base, landed, diff


def facts_for(
    repo: Path, base: str, landed: str | None, diff: bytes, *, item: str = "wi_a", mock: bool = True
) -> Facts:
    sandbox = {
        "backend": "bwrap",
        "isolated": True,
        "enforcement": "cgroups+seccomp",
        "network": "none",
        "runner": {"backend": "bwrap"},
        "limits": {"memory_mb": 1024, "pids": 256, "cpus": 1.0, "timeout_s": 60.0},
    }
    environment = {"prepared": False}
    validation = {"command": ["python", "-m", "pytest"], "junit_path": ".crewwork/junit.xml", "protected_reset": []}
    landed_fact = None
    if landed is not None:
        d = tree_digest(repo / ".git", landed)
        landed_fact = LandedFact(
            commit=landed,
            tree=d.tree,
            tree_sha256=d.sha256,
            parent=base,
            branch=f"crewwork/{item}",
            committed_at=1764590400.0,
        )
    return Facts(
        work_item_id=item,
        tenant_id="tn_acme",
        kind="code_change",
        workflow_id=f"work-item-{item}",
        submission={"kind": "code_change", "instruction": "fix add", "budget": {"max_attempts": 3}},
        repo=str(repo),
        ref="main",
        base_commit=base,
        created_at=1764590000.0,
        attempt=2,
        attempt_finished_at=1764590300.0,
        passed=True,
        cause="passed",
        reason="2 tests passed",
        exit_code=0,
        tests=[TestFact("tests/test_calc.py::test_a", "passed"), TestFact("tests/test_calc.py::test_b", "passed")],
        tests_executed=2,
        agent={"name": "scripted", "mock": mock},
        diff=FileFact("landed.patch" if landed else "attempt-2.diff", diff, "text/x-diff", "art_diff"),
        sandbox=FileFact("sandbox.json", canonical(sandbox), "application/json"),
        environment=FileFact("environment.json", canonical(environment), "application/json"),
        validation=FileFact("validation.json", canonical(validation), "application/json"),
        report=FileFact("attempt-2-junit.xml", JUNIT, "application/xml", "art_junit"),
        attempts=[AttemptFact(1, "failed", "test_failure"), AttemptFact(2, "passed", "passed")],
        review=ReviewFact(
            required=True,
            decision="approve",
            reviewer="alice",
            api_key_id="key_1",
            comment="ok",
            decided_at=1764590350.0,
        )
        if landed
        else None,
        landed=landed_fact,
    )


def sign(facts: Facts, *signers: CryptoSigner, embed_max_bytes: int = 8 * 1024 * 1024) -> bytes:
    return sign_bundle(
        facts,
        list(signers),
        builder_id="https://crewwork.test",
        version="0.1.0",
        url=run_url(facts.work_item_id, facts.attempt),
        embed_max_bytes=embed_max_bytes,
    )


def trusted(*signers: CryptoSigner, status: str = "active") -> list[PublicKey]:
    return [PublicKey(s.public_key, status=status) for s in signers]  # type: ignore[arg-type]


def doc(bundle: bytes) -> dict:
    return json.loads(bundle)


def other(facts: Facts, **kw: object) -> Facts:
    return replace(facts, **kw)  # type: ignore[arg-type]
