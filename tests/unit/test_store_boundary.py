"""The store is the only place with SQL and ORM rows: the modules that read it through its methods import neither
SQLAlchemy nor the store's tables, at module level, inside a function or for typing alike."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Modules that used to build queries or handle ORM rows themselves; the store now answers them with frozen values.
CLIENTS_OF_THE_STORE = [
    "crewwork/reconcile.py",
    "crewwork/invariants.py",
    "crewwork/api/webhooks.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "crewwork" / "webhooks").glob("*.py")),
]
FORBIDDEN = ("sqlalchemy", "crewwork.store.tables")


def _is_forbidden(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


def forbidden(source: str) -> set[int]:
    """The lines of the import statements in `source` that import SQLAlchemy or the tables, wherever they are (a
    `from x import y` imports x and, when it is a module, x.y)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        if any(_is_forbidden(n) for n in names):
            lines.add(node.lineno)
    return lines


@pytest.mark.parametrize("path", CLIENTS_OF_THE_STORE)
def test_reads_the_store_only_through_its_methods(path: str) -> None:
    assert forbidden((ROOT / path).read_text()) == set()


def test_the_check_sees_every_kind_of_import() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from crewwork.store.tables import WorkItem\n"
        "def f():\n    import sqlalchemy.orm\n"
        "from crewwork.store import tables\n"
    )
    assert forbidden(source) == {3, 5, 6}
