"""The package's import graph: no cycles, counted honestly, and the few layering rules the architecture relies on
(docs/architecture.md, "Layers").

Every import counts: at module level, inside a function (which only hides a cycle from the interpreter, not from a
reader) and under `if TYPE_CHECKING:` (a type is a dependency too). Cycles are looked for between modules and
between packages (`crewwork.X`, a subpackage or a top-level module). `python tests/unit/test_layering.py` prints the
graph's numbers and every cycle, allowlisted edges included.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "crewwork"

Kind = Literal["module", "function", "type_checking"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _target(node: ast.ImportFrom, name: str, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _statements(path: Path, name: str) -> list[tuple[str, Kind, int]]:
    """(crewwork module, kind, line) of every import statement in `path` naming a crewwork module."""
    is_pkg = path.name == "__init__.py"
    found: list[tuple[str, Kind, int]] = []

    def visit(node: ast.AST, kind: Kind) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.body:
                    visit_one(stmt, "type_checking")
                for stmt in child.orelse:
                    visit_one(stmt, kind)
            else:
                visit_one(child, kind)

    def visit_one(node: ast.AST, kind: Kind) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and kind == "module":
            kind = "function"
        if isinstance(node, ast.Import):
            found.extend((a.name, kind, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _target(node, name, is_pkg)
            # `from package import module` imports that module; `from module import name` the module itself.
            named = {f"{module}.{a.name}" for a in node.names} & MODULES.keys()
            found.extend((m, kind, node.lineno) for m in named or {module})
        visit(node, kind)

    visit(ast.parse(path.read_text()), "module")
    return [(m, k, line) for m, k, line in found if m in MODULES and m != name]


STATEMENTS = {name: _statements(path, name) for name, path in MODULES.items()}


def _edges(name: str, targets: Iterable[str]) -> set[str]:
    edges = set(targets)
    # Importing a.b.c runs a/__init__ and a/b/__init__ first (except from inside the package itself).
    for m in list(edges):
        parts = m.split(".")
        edges |= {
            ".".join(parts[:i])
            for i in range(2, len(parts))
            if not name.startswith(".".join(parts[:i]) + ".") and ".".join(parts[:i]) != name
        }
    return edges


GRAPH = {name: _edges(name, (m for m, _, _ in found)) for name, found in STATEMENTS.items()}

# Edges known to close a cycle, each to be removed by a change under way (none now). The cycle tests ignore exactly
# these; a new edge closing a cycle fails them, and so does an entry here that no longer exists.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()

# Package-level edges that still close a cycle, each to be cut by a change under way (none now: a package-level cycle
# is a new one, and fails the tests).
KNOWN_PACKAGE_CYCLE_EDGES: set[tuple[str, str]] = set()


def _without_known(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: {d for d in deps if (m, d) not in KNOWN_CYCLE_EDGES} for m, deps in graph.items()}


def _unit(module: str) -> str:
    """The package a module belongs to for the package-level graph: crewwork.X (a subpackage or a top-level
    module)."""
    return ".".join(module.split(".")[:2])


def _package_graph(graph: dict[str, set[str]], *, known: bool = True) -> dict[str, set[str]]:
    """Packages and their imports; without the known package-level edges unless `known`."""
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(_unit(m), set()).update(_unit(d) for d in deps if _unit(d) != _unit(m))
    if not known:
        out = {p: {d for d in deps if (p, d) not in KNOWN_PACKAGE_CYCLE_EDGES} for p, deps in out.items()}
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_another_in_a_cycle() -> None:
    assert _cycles(_without_known(GRAPH)) == []


def test_no_package_imports_another_in_a_cycle() -> None:
    assert _cycles(_package_graph(_without_known(GRAPH), known=False)) == []


def test_every_known_cycle_edge_still_exists() -> None:
    """An allowlisted edge that is gone must leave the list, so that it cannot come back unnoticed."""
    assert {(m, d) for m, d in KNOWN_CYCLE_EDGES if d not in GRAPH.get(m, set())} == set()
    packages = _package_graph(GRAPH)
    assert {(p, d) for p, d in KNOWN_PACKAGE_CYCLE_EDGES if d not in packages.get(p, set())} == set()


def test_the_cycle_detector_sees_cycles_however_imported() -> None:
    graph = {m: set(deps) for m, deps in GRAPH.items()}
    graph["crewwork.models.ids"].add("crewwork.cli.main")
    assert any("crewwork.models.ids" in c and "crewwork.cli.main" in c for c in _cycles(graph))
    assert any("crewwork.models" in c and "crewwork.cli" in c for c in _cycles(_package_graph(graph)))
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from crewwork.models import ids\n"
        "def f():\n    import crewwork.cli\n"
    )
    path = PACKAGE.parent / "tests" / "unit" / "_layering_probe.py"
    path.write_text(source)
    try:
        kinds = {(m, k) for m, k, _ in _statements(path, "crewwork.probe")}
    finally:
        path.unlink()
    assert kinds == {("crewwork.models.ids", "type_checking"), ("crewwork.cli", "function")}


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
        ("crewwork.models.ids", "crewwork.store"),
        ("crewwork.boundary.masking", "crewwork.store"),
        # Evidence bundles are verified offline: the verifier needs no store, no API, no Temporal.
        ("crewwork.attestation.verify", "crewwork.store"),
        ("crewwork.attestation.verify", "crewwork.config"),
        ("crewwork.attestation", "crewwork.api"),
        ("crewwork.attestation", "crewwork.steps"),
        ("crewwork.attestation", "crewwork.workflows"),
        # The MCP endpoint calls the API's route functions; the API process mounts it (crewwork/cli/serve.py).
        ("crewwork.api", "crewwork.mcp"),
        # The settings tree reads no code that acts on it (the API process reads it without loading any).
        ("crewwork.config", "crewwork.sandbox"),
        ("crewwork.config", "crewwork.repos"),
        ("crewwork.config", "crewwork.agents"),
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


DOCS = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _documented_map() -> dict[str, set[str]]:
    """docs/architecture.md's "The map": package -> the packages it may import."""
    text = DOCS.read_text().split("## The map", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("`"):
            out[f"crewwork.{cells[0].strip('`')}"] = {f"crewwork.{d}" for d in cells[2].split()}
    return out


def test_the_documented_map_names_every_package_and_every_import() -> None:
    """The map in docs/architecture.md is the rule: each package imports only what its row allows, and every
    package has a row. A new dependency between packages is written there first (and must keep the graph acyclic)."""
    documented = _documented_map()
    actual = {
        p: d - {"crewwork"} for p, d in _package_graph(GRAPH).items() if p not in {"crewwork", "crewwork.__main__"}
    }
    assert sorted(set(actual) - set(documented)) == [], "packages missing from docs/architecture.md's map"
    extra = {p: sorted(d - documented[p]) for p, d in actual.items() if d - documented[p]}
    assert extra == {}, "imports docs/architecture.md's map does not allow"


def test_the_documented_map_is_read() -> None:
    documented = _documented_map()
    assert len(documented) >= 20 and documented["crewwork.boundary"] == set()
    assert "crewwork.store" in documented["crewwork.api"]


def report() -> str:
    """The graph's numbers and its cycles, with and without the allowlisted edges."""
    kinds: dict[str, int] = {}
    for found in STATEMENTS.values():
        for _, kind, _ in found:
            kinds[kind] = kinds.get(kind, 0) + 1
    lines = [
        f"modules: {len(MODULES)}; import statements naming a crewwork module: "
        + ", ".join(f"{k} {kinds.get(k, 0)}" for k in ("module", "function", "type_checking")),
        f"known cycle edges (allowlisted): {len(KNOWN_CYCLE_EDGES)} between modules, "
        f"{len(KNOWN_PACKAGE_CYCLE_EDGES)} between packages",
    ]
    for label, graph, known in (("all edges", GRAPH, True), ("without the known edges", _without_known(GRAPH), False)):
        modules, packages = _cycles(graph), _cycles(_package_graph(graph, known=known))
        lines.append(f"{label}: {len(modules)} module cycles, {len(packages)} package cycles")
        lines += [f"  module cycle: {' '.join(c)}" for c in modules]
        lines += [f"  package cycle: {' '.join(c)}" for c in packages]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
