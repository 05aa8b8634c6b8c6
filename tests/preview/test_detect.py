"""The detection table: each framework it names is recognised from a repository's files, a row can be forced,
and the workspace is read without following links (a pure function over facts read through safefs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crewwork.preview.detect import NotDetected, detect, read_facts, with_port

FASTAPI = b"from fastapi import FastAPI\n\napp = FastAPI()\n"
FLASK = b"from flask import Flask\n\napp = Flask(__name__)\n"


@pytest.mark.parametrize(
    ("files", "framework", "command"),
    [
        ({"manage.py": b"#!/usr/bin/env python\n", "index.html": b""}, "django",
         "python manage.py runserver 127.0.0.1:{port} --noreload"),
        ({"main.py": FASTAPI}, "fastapi", "python -m uvicorn main:app --host 127.0.0.1 --port {port}"),
        ({"app/main.py": FASTAPI, "index.html": b""}, "fastapi", "python -m uvicorn app.main:app --host 127.0.0.1 --port {port}"),
        ({"app.py": FLASK}, "flask", "python -m flask --app app run --host 127.0.0.1 --port {port}"),
        ({"wsgi.py": FLASK}, "flask", "python -m flask --app wsgi run --host 127.0.0.1 --port {port}"),
        ({"package.json": b'{"devDependencies": {"vite": "^5"}}', "index.html": b""}, "vite",
         "npx --no-install vite --host 127.0.0.1 --port {port} --strictPort"),
        ({"index.html": b"<h1>hi</h1>"}, "static", "python -m http.server {port} --bind 127.0.0.1 --directory ."),
        ({"public/index.html": b""}, "static", "python -m http.server {port} --bind 127.0.0.1 --directory public"),
    ],
)  # fmt: skip
def test_each_row_of_the_table_is_detected(files: dict[str, bytes], framework: str, command: str) -> None:
    found = detect(files)
    assert found.framework == framework and " ".join(found.command) == command


def test_a_row_can_be_forced_and_the_port_filled_in() -> None:
    files = {"app.py": FLASK, "index.html": b""}
    assert detect(files).framework == "flask"
    forced = detect(files, framework="static")
    assert forced.framework == "static"
    assert with_port(forced.command, 31337)[3] == "31337"
    assert detect({}, framework="static", directory="site").command[-1] == "site"


def test_nothing_to_detect_says_what_was_looked_for() -> None:
    with pytest.raises(NotDetected, match=r"validation\.preview\.start\.command"):
        detect({"README.md": b""})
    with pytest.raises(NotDetected, match="no django app"):
        detect({"app.py": FLASK}, framework="django")


def test_facts_are_read_without_following_links(tmp_path: Path) -> None:
    secret = tmp_path / "secret.py"
    secret.write_bytes(FLASK)
    ws = tmp_path / "ws"
    (ws / "public").mkdir(parents=True)
    (ws / "app.py").symlink_to(secret)
    os.symlink(tmp_path, ws / "dist")
    (ws / "public" / "index.html").write_bytes(b"<p>")
    facts = read_facts(ws)
    assert facts == {"public/index.html": b"<p>"}
    assert detect(facts).framework == "static"
