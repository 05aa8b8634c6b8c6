"""How to start a repository's app when the work item does not say: a small table of common Python and
JavaScript apps, decided by a pure function over a few facts read from the workspace (through crewwork.boundary.safefs:
no link followed, each file bounded). `preview.start.framework` picks a row instead; `preview.start.command`
skips the table.

| row | recognised by | command (`{port}` is crewwork's port, also $PORT) |
|---|---|---|
| django | `manage.py` | `python manage.py runserver 127.0.0.1:{port} --noreload` |
| fastapi | a module (`main.py`, `app.py`, `app/main.py`, `src/main.py`) with `FastAPI(` | `python -m uvicorn MODULE:app --host 127.0.0.1 --port {port}` |
| flask | a module (`app.py`, `wsgi.py`, `main.py`) with `Flask(` | `python -m flask --app MODULE run --host 127.0.0.1 --port {port}` |
| vite | `package.json` naming `vite` | `npx --no-install vite --host 127.0.0.1 --port {port} --strictPort` |
| static | `index.html` in `.`, `public`, `dist`, `site` or `docs` | `python -m http.server {port} --bind 127.0.0.1 --directory DIR` |

The first row that matches wins, in the table's order (a Django or FastAPI project may also ship an index.html).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from crewwork.boundary import safefs

MAX_FACT_BYTES = 256 * 1024
PY_MODULES = ("main.py", "app.py", "wsgi.py", "app/main.py", "src/main.py")
STATIC_DIRS = (".", "public", "dist", "site", "docs")
FACT_FILES = (
    "manage.py",
    "package.json",
    *PY_MODULES,
    *(f"{d}/index.html" if d != "." else "index.html" for d in STATIC_DIRS),
)


@dataclass(frozen=True)
class Detected:
    framework: str
    command: list[str]


class NotDetected(ValueError):
    """Nothing in the table matches (the message says what was looked for)."""


def _module(path: str) -> str:
    return path[: -len(".py")].replace("/", ".")


def detect(files: dict[str, bytes], framework: str | None = None, directory: str | None = None) -> Detected:
    """The start command for a workspace whose files (path -> first bytes, only FACT_FILES) are `files`.
    With `framework`, that row only. Pure."""

    def has(path: str) -> bool:
        return path in files

    def module_with(marker: bytes, candidates: tuple[str, ...]) -> str | None:
        return next((m for m in candidates if marker in files.get(m, b"")), None)

    rows: list[tuple[str, Detected | None]] = []
    if framework in (None, "django"):
        rows.append(
            (
                "django",
                Detected("django", ["python", "manage.py", "runserver", "127.0.0.1:{port}", "--noreload"])
                if has("manage.py")
                else None,
            )
        )
    if framework in (None, "fastapi"):
        m = module_with(b"FastAPI(", ("main.py", "app.py", "app/main.py", "src/main.py"))
        rows.append(
            (
                "fastapi",
                Detected(
                    "fastapi",
                    ["python", "-m", "uvicorn", f"{_module(m)}:app", "--host", "127.0.0.1", "--port", "{port}"],
                )
                if m
                else None,
            )
        )
    if framework in (None, "flask"):
        m = module_with(b"Flask(", ("app.py", "wsgi.py", "main.py"))
        rows.append(
            (
                "flask",
                Detected(
                    "flask",
                    [
                        "python",
                        "-m",
                        "flask",
                        "--app",
                        _module(m) if m else "app",
                        "run",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        "{port}",
                    ],
                )
                if m or framework == "flask"
                else None,
            )
        )
    if framework in (None, "vite"):
        pkg = files.get("package.json", b"")
        vite = re.search(rb'"vite"\s*:', pkg) is not None
        rows.append(
            (
                "vite",
                Detected(
                    "vite", ["npx", "--no-install", "vite", "--host", "127.0.0.1", "--port", "{port}", "--strictPort"]
                )
                if vite or (framework == "vite" and has("package.json"))
                else None,
            )
        )
    if framework in (None, "static"):
        dirs = (directory,) if directory else STATIC_DIRS
        found = next((d for d in dirs if has("index.html" if d == "." else f"{d}/index.html")), None)
        if found is None and framework == "static" and directory:
            found = directory
        rows.append(
            (
                "static",
                Detected(
                    "static", ["python", "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", found]
                )
                if found
                else None,
            )
        )
    for _name, hit in rows:
        if hit is not None:
            return hit
    looked = framework or "django, fastapi, flask, vite or static"
    raise NotDetected(
        f"no start command given and no {looked} app found (looked for manage.py, a FastAPI( or Flask( module in "
        f"{', '.join(PY_MODULES)}, vite in package.json, index.html in {', '.join(STATIC_DIRS)}); set "
        "validation.preview.start.command"
    )


def read_facts(workspace: Path, directory: str | None = None) -> dict[str, bytes]:
    """The first bytes of each FACT_FILES entry that is a plain regular file in the workspace (links refused)."""
    wanted = list(FACT_FILES) + ([f"{directory}/index.html"] if directory else [])
    out: dict[str, bytes] = {}
    root = safefs.open_root(workspace)
    try:
        for rel in wanted:
            rel = rel.removeprefix("./")
            try:
                fd, _st = safefs.open_regular(root, rel)
            except (FileNotFoundError, NotADirectoryError, safefs.Refused):
                continue
            with safefs.opened(fd):
                out[rel] = os.read(fd, MAX_FACT_BYTES)
    finally:
        os.close(root)
    return out


def with_port(argv: list[str], port: int) -> list[str]:
    return [a.replace("{port}", str(port)) for a in argv]
