"""Protected test infrastructure: what judges a change cannot be changed by it.

Before validation every protected path is put back to its content at the base commit, and every protected file
the change *created* is removed. The decision is made on trees (the base tree and the tree with the change
applied), before anything is written into the validation workspace. What is protected:

- the spec's `test_files` (exact paths, or directories and everything under them);
- by default, anywhere in the repository: every `conftest.py`, `pytest.ini`, `.pytest.ini`, `pytest.toml`,
  `.pytest.toml`, `tox.ini`, `setup.cfg`;
- every `pyproject.toml` whose pytest configuration differs from the base (`[tool.pytest]`,
  `[tool.pytest.ini_options]`, or a `pytest11` entry point): the **whole file** is restored, because rewriting
  part of a TOML document could change what the rest means; a change to other tables of a pyproject.toml that
  leaves the pytest tables alone is kept;
- the pytest plugins the repository ships: modules named in a base `conftest.py`'s `pytest_plugins` or by `-p`
  in the base configuration's `addopts`, as `name.py` or a `name/` package at the root, under `src/` or next to
  a conftest (also when the change creates them: a new file cannot shadow an installed plugin);
- modules that would shadow the test runner when the repository root (or `src/`, in an editable install) is on
  `sys.path` (`pytest.py`, `pytest/`, `_pytest/`, `py.py`, `pluggy`, and `json`, `unittest`, which the outcome
  witness imports, there), and interpreter start-up hooks anywhere
  (`sitecustomize.py`, `usercustomize.py`: imported before pytest and its plugins wherever their directory is on
  `sys.path`);
- the configuration of each checker the validation command names (`ruff`, `mypy`, `flake8`, `pylint`, `pyright`,
  `coverage` or `pytest --cov`): its own files (`ruff.toml`, `mypy.ini`, `.flake8`, `.pylintrc`,
  `pyrightconfig.json`, `.coveragerc`, ...) anywhere, and a pyproject.toml whose `[tool.NAME]` table changed (the
  whole file, as for pytest's tables);
- compiled bytecode anywhere (`__pycache__/`, `*.pyc`, `*.pyo`): an unchecked-hash `.pyc` is imported instead
  of its (restored) source.

A submission widens the set with `validation.protect.paths` and narrows the *default* part with
`validation.protect.exclude` (or drops all defaults with `validation.protect.defaults: false`); `test_files` and
`protect.paths` always hold. Each reset is reported with its reason.

Code under test still runs inside the test process, so a change can tamper with the runner from a module the tests
import; protection removes the configuration and plugin routes, and the rest is the outcome witness's and the scan's
(crewwork.validation.witness, crewwork.validation.reach; docs/lifecycle.md says what remains).
"""

from __future__ import annotations

import ast
import configparser
import re
import shlex
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from crewwork.boundary.paths import PLATFORM_DIR, PathPattern
from crewwork.models import ResetPath, ValidationSpec
from crewwork.workspace.gitops import PrivateGit, Tree

CONFIG_NAMES = frozenset(
    {"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg"}
)
RUNNER_SHADOWS = frozenset(
    {"pytest.py", "pytest", "_pytest", "py.py", "pluggy", "pluggy.py", "sitecustomize.py", "usercustomize.py",
     # the standard modules the outcome witness imports (crewwork/validation/witness_plugin.py)
     "json.py", "json", "unittest.py", "unittest"}
)  # fmt: skip
STARTUP_HOOKS = frozenset({"sitecustomize.py", "usercustomize.py"})
CHECKER_CONFIGS: dict[str, frozenset[str]] = {
    "ruff": frozenset({"ruff.toml", ".ruff.toml"}),
    "mypy": frozenset({"mypy.ini", ".mypy.ini"}),
    "flake8": frozenset({".flake8"}),
    "pylint": frozenset({".pylintrc", "pylintrc"}),
    "coverage": frozenset({".coveragerc"}),
    "pyright": frozenset({"pyrightconfig.json"}),
}
"""The configuration files of each checker a validation command can run (setup.cfg and tox.ini are protected anyway);
its `[tool.NAME]` table in a pyproject.toml counts too."""
_CHECKER_WORD = re.compile(r"(?<![\w.-])(ruff|mypy|flake8|pylint|coverage|pyright)(?![\w-])|--cov\b")


def checkers_in(command: Iterable[str]) -> set[str]:
    """The checkers a validation command names (`pytest --cov` runs coverage)."""
    found = set()
    for m in _CHECKER_WORD.finditer(" ".join(command)):
        found.add(m.group(1) or "coverage")
    return found


INTERPRETERS = re.compile(r"^(python[0-9.]*|sh|bash|dash|node|ruby|perl)$")


def programs_in(command: list[str]) -> list[str]:
    """Repository paths a check's command runs as its program: `./tools/lint.sh`, `python tools/lint.py`,
    `python -m tools.lint` (its module or package). What it is run *on* (`mypy calc.py`) is not among them."""
    out: list[str] = []
    head = command[0]
    if "/" in head:
        out.append(head)
    elif INTERPRETERS.match(head) and len(command) > 1:
        if command[1] == "-m" and len(command) > 2:
            mod = command[2].replace(".", "/")
            out += [f"{mod}.py", f"{mod}/"]
        elif not command[1].startswith("-"):
            out.append(command[1])
    cleaned = []
    for path in out:
        while path.startswith("./"):
            path = path[2:]
        if path and not path.startswith("/") and ".." not in path.split("/"):
            cleaned.append(path)
    return cleaned


MAX_CONFIG_BYTES = 1024 * 1024


@dataclass
class Protection:
    """The protected set of one validation, from its spec plus what the base commit ships."""

    test_files: list[str] = field(default_factory=list)
    paths: list[PathPattern] = field(default_factory=list)
    exclude: list[PathPattern] = field(default_factory=list)
    defaults: bool = True
    checkers: set[str] = field(default_factory=set)
    """Checkers the validation command runs, whose configuration is protected like pytest's."""
    plugin_modules: set[str] = field(default_factory=set)
    plugin_roots: set[str] = field(default_factory=lambda: {"", "src/"})
    check_programs: dict[str, str] = field(default_factory=dict)
    """Repository paths a named check runs as its program -> the check's name (validation.checks)."""

    @classmethod
    def from_spec(cls, spec: ValidationSpec) -> Protection:
        return cls(
            test_files=[str(t) for t in spec.test_files],
            paths=list(spec.protect.paths),
            exclude=list(spec.protect.exclude),
            defaults=spec.protect.defaults,
            checkers=set().union(checkers_in(spec.command), *(checkers_in(c.command) for c in spec.checks)),
            check_programs={path: c.name for c in spec.checks for path in programs_in(c.command)},
        )

    def explicit_reason(self, path: str) -> str | None:
        for t in self.test_files:
            if path == t or path.startswith(t + "/"):
                return f"listed in validation.test_files ({t})"
        for program, name in sorted(self.check_programs.items()):
            if path == program or (program.endswith("/") and path.startswith(program)):
                return f"the program check `{name}` runs ({program.rstrip('/')})"
        for p in self.paths:
            if p.matches(path):
                return f"listed in validation.protect.paths ({p})"
        return None

    def default_reason(self, path: str) -> str | None:
        if not self.defaults or any(p.matches(path) for p in self.exclude):
            return None
        parts = path.split("/")
        name = parts[-1]
        if name in CONFIG_NAMES:
            return f"test configuration ({name})"
        if "__pycache__" in parts or name.endswith((".pyc", ".pyo")):
            return "compiled bytecode (imported instead of its source)"
        for checker in sorted(self.checkers):
            if name in CHECKER_CONFIGS[checker]:
                return f"configuration of {checker}, which the validation command runs ({name})"
        if name in STARTUP_HOOKS:
            return (
                f"an interpreter start-up hook ({name}), imported before the test runner wherever its directory is on "
                "sys.path"
            )
        if parts[0] in RUNNER_SHADOWS:
            return f"would shadow the test runner ({parts[0]} at the repository root)"
        if parts[0] == "src" and len(parts) > 1 and parts[1] in RUNNER_SHADOWS:
            return f"would shadow the test runner ({parts[1]} under src/, on sys.path in an editable install)"
        for mod in self.plugin_modules:
            rel = mod.replace(".", "/")
            for root in self.plugin_roots:
                if path == f"{root}{rel}.py" or path.startswith(f"{root}{rel}/"):
                    return f"pytest plugin {mod!r} shipped by the repository"
        return None


def _text(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def conftest_plugins(source: str) -> set[str]:
    """Module names in a conftest's top-level `pytest_plugins = ...` (a string or a list/tuple of strings)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        # A repository's file that Python's own parser gives up on (`x = a.b.b...` 200,000 deep is a RecursionError,
        # 200,000 unary minus signs a MemoryError): pytest could not import it either.
        return set()
    out: set[str] = set()
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if not any(isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in targets):
            continue
        value = getattr(node, "value", None)
        items = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
        for item in items:
            if isinstance(item, ast.Constant) and isinstance(item.value, str):
                out.add(item.value.strip())
    return {m for m in out if m}


def addopts_plugins(addopts: Iterable[str]) -> set[str]:
    """Plugins named with `-p NAME` / `-pNAME` (not `-p no:NAME`) in addopts."""
    args: list[str] = []
    for chunk in addopts:
        try:
            args += shlex.split(chunk)
        except ValueError:
            continue
    out: set[str] = set()
    for i, a in enumerate(args):
        name = None
        if a == "-p" and i + 1 < len(args):
            name = args[i + 1]
        elif a.startswith("-p") and len(a) > 2 and not a.startswith("--"):
            name = a[2:]
        if name and not name.startswith("no:"):
            out.add(name)
    return out


def _ini_addopts(text: str, section: str) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text)
    except configparser.Error:
        return []
    return [parser.get(section, "addopts")] if parser.has_option(section, "addopts") else []


def pytest_tables(data: bytes | None) -> Any:
    """The parts of a pyproject.toml that configure pytest, or a marker when it cannot be parsed."""
    text = _text(data)
    if text is None:
        return ("unreadable",)
    try:
        doc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, MemoryError):
        # tomllib recurses per nested array or inline table: `a = [[[[...` is a RecursionError, not a decode error.
        return ("unparseable",)
    tool = doc.get("tool", {}) if isinstance(doc.get("tool"), dict) else {}
    project = doc.get("project", {}) if isinstance(doc.get("project"), dict) else {}
    eps = project.get("entry-points", {}) if isinstance(project.get("entry-points"), dict) else {}
    return {"tool.pytest": tool.get("pytest"), "pytest11": eps.get("pytest11")}


def tool_tables(data: bytes | None, names: Iterable[str]) -> Any:
    """The `[tool.NAME]` tables of a pyproject.toml for each of `names`, or a marker when it cannot be parsed."""
    text = _text(data)
    if text is None:
        return ("unreadable",)
    try:
        doc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, MemoryError):
        return ("unparseable",)
    tool = doc.get("tool", {}) if isinstance(doc.get("tool"), dict) else {}
    return {name: tool.get(name) for name in sorted(names)}


def _pyproject_addopts(data: bytes | None) -> list[str]:
    tables = pytest_tables(data)
    if not isinstance(tables, dict) or not isinstance(tables.get("tool.pytest"), dict):
        return []
    pt = tables["tool.pytest"]
    out: list[str] = []
    for section in (pt, pt.get("ini_options") if isinstance(pt.get("ini_options"), dict) else {}):
        opts = section.get("addopts")
        if isinstance(opts, str):
            out.append(opts)
        elif isinstance(opts, list):
            out.append(" ".join(shlex.quote(str(o)) for o in opts))
    return out


async def _blob(git: PrivateGit, tree: Tree, path: bytes) -> bytes | None:
    e = tree.get(path)
    if e is None or e.mode not in ("100644", "100755"):
        return None
    return await git.read_blob(e.sha, MAX_CONFIG_BYTES)


async def discover_plugins(git: PrivateGit, base: Tree, prot: Protection) -> None:
    """Fill in the plugin modules and their roots from the base commit's conftests and configuration. Each distinct
    conftest is read and parsed once, however many paths hold it."""
    parsed: dict[str, set[str]] = {}
    for path in base:
        name = path.rsplit(b"/", 1)[-1]
        if name == b"conftest.py":
            sha = base[path].sha
            if sha not in parsed:
                text = _text(await _blob(git, base, path))
                parsed[sha] = conftest_plugins(text) if text else set()
            prot.plugin_modules |= parsed[sha]
            parent = path[: -len(name)].decode("utf-8", "replace")
            prot.plugin_roots.add(parent)
    addopts: list[str] = []
    for cfg, section in (
        (b"pytest.ini", "pytest"),
        (b".pytest.ini", "pytest"),
        (b"tox.ini", "pytest"),
        (b"setup.cfg", "tool:pytest"),
    ):
        text = _text(await _blob(git, base, cfg))
        if text:
            addopts += _ini_addopts(text, section)
    for cfg in (b"pyproject.toml", b"pytest.toml", b".pytest.toml"):
        addopts += _pyproject_addopts(await _blob(git, base, cfg))
    prot.plugin_modules |= addopts_plugins(addopts)


WITNESS_NAMES = frozenset({b"crewwork_witness.py", b"crewwork_witness"})
"""Names that would shadow the outcome witness plugin (`-p crewwork_witness`) wherever a directory of the tree is on
sys.path, as the workspace root is under `python -m pytest`: the platform's, at any depth."""


def _shadows_witness(raw: bytes) -> bool:
    return any(part in WITNESS_NAMES for part in raw.split(b"/"))


def report_paths(spec: ValidationSpec) -> list[str]:
    """Where the validation's runs write reports: the tests' JUnit report and each check's."""
    paths = [spec.junit_path, *(c.report_path for c in spec.checks)]
    return [str(p) for p in paths if p is not None]


def _platform_owned(report_paths: Iterable[str]) -> Callable[[bytes], bool]:
    reserved = {PLATFORM_DIR.encode()}
    for report_path in report_paths:
        parts = report_path.split("/")
        reserved |= {"/".join(parts[:i]).encode() for i in range(1, len(parts) + 1)}
    prefix = PLATFORM_DIR.encode() + b"/"
    return lambda raw: raw in reserved or raw.startswith(prefix) or _shadows_witness(raw)


def strip_platform(tree: Tree, report_paths: Iterable[str]) -> tuple[Tree, list[ResetPath]]:
    """`tree` without what belongs to the platform: `.crewwork/`, each report path and its parent directories
    (whatever a repository or a change holds there, a symlink to a host directory say, never reaches the
    workspace)."""
    owned = _platform_owned(report_paths)
    out: Tree = {}
    removed: list[ResetPath] = []
    for raw, entry in sorted(tree.items()):
        if not owned(raw):
            out[raw] = entry
            continue
        if _shadows_witness(raw) and not raw.startswith(PLATFORM_DIR.encode() + b"/"):
            why = "named like crewwork's outcome witness (crewwork_witness), which would shadow it: the platform's name"
        else:
            where = f"{PLATFORM_DIR}/" if raw.startswith(PLATFORM_DIR.encode() + b"/") else "the report location"
            why = f"in {where}, which belongs to the platform (a change or a commit cannot ship evidence there)"
        removed.append(ResetPath(path=raw.decode("utf-8", "replace"), action="removed", why=why))
    return out, removed


async def apply_protection(
    git: PrivateGit,
    base: Tree,
    changed: Tree,
    prot: Protection,
    *,
    report_paths: Iterable[str] = (),
) -> tuple[Tree, list[ResetPath]]:
    """`changed` with every protected path put back to `base` (or removed), and what was reset and why.

    Also drops anything the change put in the platform directory, at the report path or under the outcome witness's
    name: the diff cannot ship evidence, nor shadow what gathers it."""
    await discover_plugins(git, base, prot)
    report_paths = list(report_paths)
    out, resets = strip_platform(changed, report_paths)
    platform_owned = _platform_owned(report_paths)
    touched = sorted(p for p in set(base) | set(changed) if base.get(p) != changed.get(p))
    for raw in touched:
        if platform_owned(raw):
            continue
        path = raw.decode("utf-8", "surrogateescape")
        why = prot.explicit_reason(path)
        if why is None:
            why = prot.default_reason(path)
        if why is None and path.split("/")[-1] == "pyproject.toml" and prot.defaults:
            if not any(p.matches(path) for p in prot.exclude):
                none = pytest_tables(b"")
                before = pytest_tables(await _blob(git, base, raw)) if raw in base else none
                after = pytest_tables(await _blob(git, changed, raw)) if raw in changed else none
                if before != after:
                    why = "its pytest configuration ([tool.pytest...] or a pytest11 entry point) changed; " + (
                        "the whole file is restored" if raw in base else "a new one cannot add any"
                    )
                elif prot.checkers:
                    was = tool_tables(await _blob(git, base, raw) if raw in base else b"", prot.checkers)
                    now = tool_tables(await _blob(git, changed, raw) if raw in changed else b"", prot.checkers)
                    if was != now:
                        tables = ", ".join(f"tool.{c}" for c in sorted(prot.checkers))
                        why = (
                            f"the configuration of a checker the validation command runs ([{tables}]) changed; the "
                            "whole file is restored"
                        )
        if why is None:
            continue
        if raw in base:
            out[raw] = base[raw]
            # A restored file must not collide with a directory (or file) the change put in its place.
            for other in [p for p in out if p.startswith(raw + b"/") or raw.startswith(p + b"/")]:
                del out[other]
                resets.append(
                    ResetPath(path=other.decode("utf-8", "replace"), action="removed", why=f"in the way of {path}")
                )
            resets.append(ResetPath(path=path, action="restored", why=why))
        else:
            out.pop(raw, None)
            resets.append(ResetPath(path=path, action="removed", why=why))
    return out, resets
