"""The API app's state has one typed shape (`ApiState`, crewwork/api/appstate.py), built by the app's lifespan and
read through typed dependencies (crewwork/api/deps.py): no route or front end reads an untyped attribute of
`app.state`, and asking for the state of an app that is not running says so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crewwork.api.appstate import NotRunning, api_state
from crewwork.cli.serve import api_app
from crewwork.config import Settings

PACKAGE = Path(__file__).resolve().parents[2] / "crewwork"
# `app.state.x`, `request.app.state.x`, `self.state.x` handed an app's state: an attribute nothing types.
# `getattr(app.state, "x")` / `getattr(getattr(app, "state"), "x")` are the same read, spelled so a type checker
# cannot see it (one silently stopped charging refused requests when the state moved into ApiState).
UNTYPED = re.compile(
    r"\bapp\.state\.[a-z_]+|\bapp_state\.[a-z_]+|getattr\(\s*[a-z_.]*app\.state\s*,|getattr\(\s*getattr\([^)]*\"state\""
)


def test_nothing_reads_an_untyped_attribute_of_the_apps_state() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "appstate.py"  # where the typed state is kept on the app
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if UNTYPED.search(line)
    ]
    assert found == [], "read the app's state through crewwork/api/deps.py (or api_state(app))"


def test_the_state_of_an_app_that_is_not_running_is_a_clear_error(tmp_path: Path) -> None:
    app = api_app(Settings(data_dir=tmp_path, database_url=f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"))
    with pytest.raises(NotRunning, match="lifespan"):
        api_state(app)
