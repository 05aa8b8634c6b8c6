"""The package's layout rules (docs/architecture.md, "The map"), so the house cannot drift back:

- the top level holds packages only (no loose modules beside `__init__` and `__main__`): `ls crewwork/` reads as the
  architecture;
- every package's `__init__.py` is its face: a docstring saying what the package is for and listing its modules, and
  at most re-exports of names defined in its modules (`__all__`); nothing is defined there;
- no module is over 550 lines unless its docstring says why ("Over 550 lines: ...");
- a module name repeats across packages only for a role every such package has (a step's `contract`/`activity`),
  for one resource seen from two layers (the API's router and the store's aggregate of work items), or as a package's
  facet in another layer (config/sandbox.py); anything else that repeats is a new collision.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "crewwork"
MAX_LINES = 550

# Module names that several packages hold on purpose, and why.
SHARED_NAMES = {
    "__init__": "every package",
    "__main__": "the root package only, but listed for completeness",
    "contract": "each step's input, result and policy (crewwork/steps/<step>/contract.py)",
    "activity": "each step's activity (crewwork/steps/<step>/activity.py)",
    "errors": "a layer's own failure classes (models: agents and capture; transport: providers; steps: step outcomes)",
    "base": "a plugin interface (agents, sandbox backends)",
    "common": "what a package's modules share (the CLI's output helpers, the forge dialects' error)",
    "client": "a client of another system (Temporal's, a model provider's)",
    "local": "the on-host variant (the unsafe local sandbox, local-path repositories)",
    "app": "an application (the API's FastAPI app, the preview's app under test)",
    # One resource seen from two layers: the API's router and the store's aggregate, the CLI's commands, ...
    "work_items": "API router / store aggregate / MCP tools",
    "repositories": "API router / store aggregate",
    "webhooks": "API router / client calls",
    "bundles": "API routes / CLI commands of evidence bundles",
    "repos": "configuration / MCP tools / CLI commands of repositories",
    "pools": "the worker pools / their instruments",
}


def _modules() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts and "migrations" not in p.parts]


def test_the_top_level_holds_packages_only() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in {"__init__.py", "__main__.py"})
    assert loose == [], f"modules at the top of crewwork/ (put each in the package of its role): {loose}"


def test_every_package_init_is_a_face() -> None:
    bad: list[str] = []
    for init in PACKAGE.rglob("__init__.py"):
        if "migrations" in init.parts:
            continue
        tree = ast.parse(init.read_text())
        rel = init.relative_to(PACKAGE.parent)
        if not ast.get_docstring(tree):
            bad.append(f"{rel}: no docstring saying what the package is for")
        for node in tree.body[1:]:
            if isinstance(node, ast.ImportFrom | ast.Import):
                continue
            if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] in (
                ["__all__"],
                ["__version__"],
            ):
                continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue
            bad.append(f"{rel}:{node.lineno}: defines something (move it into a module; the face re-exports it)")
    assert bad == []


def test_no_module_is_over_550_lines_without_a_reason() -> None:
    long = []
    for path in _modules():
        lines = path.read_text().count("\n")
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if lines > MAX_LINES and "Over 550 lines:" not in doc:
            long.append(f"{path.relative_to(PACKAGE.parent)}: {lines}")
    assert long == []


def test_module_names_repeat_only_on_purpose() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        where[path.stem].append(str(path.relative_to(PACKAGE.parent)))
    for d in PACKAGE.rglob("*"):
        if d.is_dir() and d.name != "__pycache__" and "migrations" not in d.parts and d != PACKAGE:
            where[d.name].append(str(d.relative_to(PACKAGE.parent)) + "/")
    # A module named for a package is that package seen from another layer (config/sandbox.py is the sandbox's
    # settings, models/preview.py what a work item declares of a preview, sandbox/cli.py its commands): one package
    # and modules beside it are allowed; two packages, or two modules, of one name are not.
    repeated = {
        name: places
        for name, places in where.items()
        if len(places) > 1
        and name not in SHARED_NAMES
        and not (sum(p.endswith("/") for p in places) == 1 and len(set(places)) == len(places))
    }
    assert repeated == {}


def test_every_shared_name_is_still_shared() -> None:
    """An allowance that no longer applies leaves the list, so the name cannot come back as a collision unnoticed."""
    counts: dict[str, int] = defaultdict(int)
    for path in _modules():
        counts[path.stem] += 1
    assert [n for n in SHARED_NAMES if n != "__main__" and counts[n] < 2] == []
