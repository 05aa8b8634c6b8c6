"""The store's boundary (docs/architecture.md, "The store"): its tables and SQLAlchemy stay inside crewwork/store/, and
what it hands out is a view (crewwork/store/views.py), never an ORM row.

Two checks: no module outside crewwork/store/ imports `crewwork.store.tables` or `sqlalchemy` (at module level, in a
function or under TYPE_CHECKING alike), and no public method of the store's classes is annotated to return a row."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import crewwork.store
from crewwork.store.tables import Base

PACKAGE = Path(__file__).resolve().parents[2] / "crewwork"
STORE = PACKAGE / "store"

# Modules allowed to read the tables directly, none now. An entry that no longer imports them fails
# `test_every_allowed_module_still_needs_its_entry`, so the list only shrinks.
ALLOWED: set[str] = set()

# Store methods annotated to return a row, none now.
ALLOWED_ROW_RETURNS: set[str] = set()

FORBIDDEN = re.compile(r"^(sqlalchemy(\..*)?|crewwork\.store\.tables)$")


def _imports(source: str) -> set[str]:
    """Every module an import statement in `source` names, anywhere in the file (`from a import b` names `a` and
    `a.b`, which is the module when b is one)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _offenders() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(STORE):
            continue
        bad = {m for m in _imports(path.read_text()) if FORBIDDEN.match(m)}
        if bad:
            out[str(path.relative_to(PACKAGE.parent))] = bad
    return out


def test_no_module_outside_the_store_imports_its_tables_or_sqlalchemy() -> None:
    assert {p: sorted(m) for p, m in _offenders().items() if p not in ALLOWED} == {}


def test_every_allowed_module_still_needs_its_entry() -> None:
    assert ALLOWED - _offenders().keys() == set()


def test_the_import_check_sees_every_form() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from crewwork.store.tables import WorkItem\n"
        "def f():\n    import sqlalchemy.orm\n"
        "from crewwork.store import tables\n"
        "from crewwork.store import views\n"
    )
    assert {m for m in _imports(source) if FORBIDDEN.match(m)} == {"crewwork.store.tables", "sqlalchemy.orm"}


def test_store_methods_return_views_not_rows() -> None:
    """No public method of a class of crewwork/store/ is annotated to return a row (mypy holds the code to it)."""
    tables = {m.class_.__name__ for m in Base.registry.mappers}
    named = re.compile(r"\b(" + "|".join(sorted(tables)) + r")\b")
    returning_rows = set()
    # Every module of the store, its subpackages' included (crewwork/store/fencing/).
    for info in pkgutil.walk_packages(crewwork.store.__path__, prefix="crewwork.store."):
        if ".migrations" in info.name:
            continue
        module = importlib.import_module(info.name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            returning_rows |= {
                f"{cls_name}.{name}"
                for name, fn in inspect.getmembers(cls, inspect.isfunction)
                if not name.startswith("_") and named.search(str(inspect.signature(fn).return_annotation))
            }
    assert returning_rows == ALLOWED_ROW_RETURNS
