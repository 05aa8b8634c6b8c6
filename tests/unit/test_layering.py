"""The package's import graph: no cycles (counting imports inside functions too, which only hide one), and the few
layering rules the architecture relies on (docs/architecture.md, "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "crewwork"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, name: str) -> set[str]:
    """crewwork modules `path` imports anywhere except under `if TYPE_CHECKING:` (annotations only)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    found: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}
    edges = {m for m in found if m in MODULES and m != name}
    # Importing a.b.c runs a/__init__ and a/b/__init__ first (except from inside the package itself).
    for m in list(edges):
        parts = m.split(".")
        edges |= {
            ".".join(parts[:i])
            for i in range(2, len(parts))
            if not name.startswith(".".join(parts[:i]) + ".") and ".".join(parts[:i]) != name
        }
    return edges


GRAPH = {name: _imports(path, name) for name, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle() -> None:
    assert _cycles() == []


def test_the_cycle_detector_sees_a_cycle() -> None:
    GRAPH["crewwork.ids"].add("crewwork.cli")
    try:
        assert any("crewwork.ids" in c and "crewwork.cli" in c for c in _cycles())
    finally:
        GRAPH["crewwork.ids"].discard("crewwork.cli")


@pytest.mark.parametrize(
    ("lower", "upper"),
    [
        ("crewwork.transport", "crewwork.agents"),  # the model transport knows nothing of agents
        ("crewwork.store", "crewwork.api"),  # the store serves every layer and imports none of them
        ("crewwork.store", "crewwork.steps"),
        ("crewwork.store", "crewwork.workflows"),
        ("crewwork.validation", "crewwork.steps"),  # grading is pure
        ("crewwork.sandbox", "crewwork.steps"),
        ("crewwork.workflows", "crewwork.api"),
        ("crewwork.ids", "crewwork.store"),
        ("crewwork.masking", "crewwork.store"),
        # Evidence bundles are verified offline: the verifier needs no store, no API, no Temporal.
        ("crewwork.evidence.verify", "crewwork.store"),
        ("crewwork.evidence.verify", "crewwork.config"),
        ("crewwork.evidence", "crewwork.api"),
        ("crewwork.evidence", "crewwork.steps"),
        ("crewwork.evidence", "crewwork.workflows"),
    ],
)
def test_lower_layers_do_not_import_upper_ones(lower: str, upper: str) -> None:
    offenders = {
        f"{m} -> {d}"
        for m, deps in GRAPH.items()
        if m == lower or m.startswith(lower + ".")
        for d in deps
        if d == upper or d.startswith(upper + ".")
    }
    assert offenders == set()
