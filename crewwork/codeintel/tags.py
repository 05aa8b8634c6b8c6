"""Definitions and references of one source file, from tree-sitter (grammars from tree-sitter-language-pack 0.13,
which ships every grammar inside its wheel: nothing is downloaded, ever; tests/codeintel prove it with no network).

Per language: a query whose captures are `def.<kind>` (the name node of a definition), and the node types whose text
counts as a reference (identifiers). A reference is any such node that is not itself a definition's name; the
repository map keeps only references to names some file defines (crewwork.codeintel.repomap).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any

# extension -> tree-sitter-language-pack name
EXTENSIONS = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".jsx": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".hpp": "cpp",
    ".hh": "cpp",
    ".rb": "ruby",
}

_JS_DEFS = """
(function_declaration name: (identifier) @def.function)
(generator_function_declaration name: (identifier) @def.function)
(method_definition name: (property_identifier) @def.method)
(variable_declarator name: (identifier) @def.function value: [(arrow_function) (function_expression)])
"""
_C_DEFS = """
(function_definition declarator: (function_declarator declarator: (identifier) @def.function))
(struct_specifier name: (type_identifier) @def.struct body: (_))
(enum_specifier name: (type_identifier) @def.enum body: (_))
(type_definition declarator: (type_identifier) @def.type)
"""

DEFINITIONS = {
    "python": """
(class_definition name: (identifier) @def.class)
(function_definition name: (identifier) @def.function)
""",
    "javascript": _JS_DEFS + "(class_declaration name: (identifier) @def.class)",
    "typescript": _JS_DEFS
    + """
(class_declaration name: (type_identifier) @def.class)
(abstract_class_declaration name: (type_identifier) @def.class)
(interface_declaration name: (type_identifier) @def.interface)
(type_alias_declaration name: (type_identifier) @def.type)
(enum_declaration name: (identifier) @def.enum)
""",
    "go": """
(function_declaration name: (identifier) @def.function)
(method_declaration name: (field_identifier) @def.method)
(type_spec name: (type_identifier) @def.type)
""",
    "rust": """
(function_item name: (identifier) @def.function)
(struct_item name: (type_identifier) @def.struct)
(enum_item name: (type_identifier) @def.enum)
(trait_item name: (type_identifier) @def.trait)
(type_item name: (type_identifier) @def.type)
(mod_item name: (identifier) @def.module)
(macro_definition name: (identifier) @def.macro)
""",
    "java": """
(class_declaration name: (identifier) @def.class)
(interface_declaration name: (identifier) @def.interface)
(enum_declaration name: (identifier) @def.enum)
(record_declaration name: (identifier) @def.class)
(method_declaration name: (identifier) @def.method)
""",
    "c": _C_DEFS,
    "cpp": _C_DEFS
    + """
(class_specifier name: (type_identifier) @def.class body: (_))
(function_definition declarator: (function_declarator declarator: (field_identifier) @def.method))
(function_definition declarator: (function_declarator declarator: (qualified_identifier name: (identifier) @def.method)))
(namespace_definition name: (namespace_identifier) @def.module)
""",
    "ruby": """
(class name: (constant) @def.class)
(module name: (constant) @def.module)
(method name: (identifier) @def.method)
(singleton_method name: (identifier) @def.method)
""",
}
DEFINITIONS["tsx"] = DEFINITIONS["typescript"]

REFERENCE_NODES = {
    "python": ("identifier",),
    "javascript": ("identifier", "property_identifier"),
    "typescript": ("identifier", "property_identifier", "type_identifier"),
    "tsx": ("identifier", "property_identifier", "type_identifier"),
    "go": ("identifier", "field_identifier", "type_identifier"),
    "rust": ("identifier", "field_identifier", "type_identifier"),
    "java": ("identifier", "type_identifier"),
    "c": ("identifier", "field_identifier", "type_identifier"),
    "cpp": ("identifier", "field_identifier", "type_identifier", "namespace_identifier"),
    "ruby": ("identifier", "constant"),
}

MAX_NAME_CHARS = 120
MAX_LINE_CHARS = 160
MAX_DEFINITIONS_PER_FILE = 2_000
"""Definitions kept of one file (the first by line); a generated file must not dominate the index."""
MAX_REFERENCE_NAMES_PER_FILE = 5_000
"""Distinct referenced names kept of one file (the most used)."""


def language_of(path: str) -> str | None:
    return EXTENSIONS.get(os.path.splitext(path)[1].lower())


@dataclass
class Definition:
    name: str
    kind: str
    line: int
    """1-based."""
    text: str
    """The definition's first source line, stripped and cut to MAX_LINE_CHARS."""


@dataclass
class FileTags:
    path: str
    language: str
    definitions: list[Definition] = field(default_factory=list)
    references: dict[str, int] = field(default_factory=dict)
    """name -> how often the file uses it."""


@functools.cache
def _compiled(language: str) -> tuple[Any, Any, Any]:
    import tree_sitter
    from tree_sitter_language_pack import get_language, get_parser

    lang = get_language(language)  # type: ignore[arg-type]
    refs = " ".join(f"({t})" for t in REFERENCE_NODES[language])
    return (
        get_parser(language),  # type: ignore[arg-type]
        tree_sitter.Query(lang, DEFINITIONS[language]),
        tree_sitter.Query(lang, f"[{refs}] @ref"),
    )


def extract(path: str, source: bytes) -> FileTags | None:
    """The tags of one file, or None when its language is not one crewwork indexes. tree-sitter holds the
    interpreter lock while it parses: a serving process never calls this itself (crewwork.codeintel.parsepool)."""
    import tree_sitter

    language = language_of(path)
    if language is None:
        return None
    parser, defs_query, refs_query = _compiled(language)
    tree = parser.parse(source)
    lines = source.split(b"\n")
    tags = FileTags(path, language)
    seen: set[int] = set()
    for capture, nodes in tree_sitter.QueryCursor(defs_query).captures(tree.root_node).items():
        kind = capture.split(".", 1)[1] if "." in capture else "definition"
        for node in nodes:
            name = node.text.decode("utf-8", "replace") if node.text else ""
            if not name or len(name) > MAX_NAME_CHARS or node.start_byte in seen:
                continue
            seen.add(node.start_byte)
            row = node.start_point[0]
            text = lines[row].decode("utf-8", "replace").strip() if row < len(lines) else name
            tags.definitions.append(Definition(name, kind, row + 1, text[:MAX_LINE_CHARS]))
    for nodes in tree_sitter.QueryCursor(refs_query).captures(tree.root_node).values():
        for node in nodes:
            if node.start_byte in seen or not node.text or len(node.text) > MAX_NAME_CHARS:
                continue
            name = node.text.decode("utf-8", "replace")
            tags.references[name] = tags.references.get(name, 0) + 1
    tags.definitions.sort(key=lambda d: d.line)
    del tags.definitions[MAX_DEFINITIONS_PER_FILE:]
    if len(tags.references) > MAX_REFERENCE_NAMES_PER_FILE:
        kept = sorted(tags.references.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_REFERENCE_NAMES_PER_FILE]
        tags.references = dict(kept)
    return tags
