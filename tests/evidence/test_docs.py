"""docs/evidence.md's examples run as written: its standalone tree digest agrees with crewwork's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from crewwork.attestation.treedigest import tree_digest
from tests.evidence.helpers import git, landed_repo

DOC = Path(__file__).resolve().parents[2] / "docs" / "evidence.md"


def test_the_documented_tree_digest_is_crewworks(tmp_path: Path) -> None:
    block = next(b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if "def tree_digest" in b)
    script = tmp_path / "tree_digest.py"
    script.write_text(block)
    repo, _, commit, _ = landed_repo(tmp_path / "repo")
    # A symbolic link and a file in a subdirectory whose name sorts differently by bytes than git orders trees.
    git(repo, "checkout", "-q", "crewwork/wi_a")
    (repo / "a-b").mkdir()
    (repo / "a-b" / "x").write_text("x\n")
    (repo / "a").mkdir()
    (repo / "a" / "y").write_text("y\n")
    (repo / "link").symlink_to("calc.py")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "more")
    commit = git(repo, "rev-parse", "HEAD")
    out = subprocess.run([sys.executable, str(script), str(repo), commit], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == tree_digest(repo / ".git", commit).sha256
