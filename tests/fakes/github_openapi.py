"""GitHub's official OpenAPI description (`@octokit/openapi` from npm, installed by scripts/test-env.sh into
.cache/node, never fetched while the tests run) as a checker for the local GitHub (tests/fakes/github_server.py):
every operation the fake serves must be one GitHub documents, every request crewwork sends must match the
operation's request body schema, and every answer the fake gives must match the documented response schema for its
status. So the fake cannot drift from the real API, and neither can crewwork's calls.

Also GitHub's own example webhook payloads (`@octokit/webhooks-examples`), which the intake tests send, signed as
GitHub signs them.

OpenAPI 3.0 schemas are JSON Schema draft 4 plus `nullable`; `nullable: true` is rewritten as a union with null
once, when the description is loaded, and the schemas are then checked with jsonschema's draft 4 validator.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

NODE = Path(__file__).resolve().parents[2] / ".cache" / "node" / "node_modules" / "@octokit"
OPENAPI = NODE / "openapi" / "generated" / "api.github.com.json"
WEBHOOK_EXAMPLES = NODE / "webhooks-examples" / "api.github.com" / "index.json"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is not installed: run scripts/test-env.sh (npm @octokit/openapi, webhooks-examples)")
    return path


def _nullable(node: Any) -> Any:
    if isinstance(node, list):
        return [_nullable(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable(v) for k, v in node.items()}
    if out.pop("nullable", False) is True:
        t = out.get("type")
        if isinstance(t, str):
            out["type"] = [t, "null"]
            if "enum" in out:
                out["enum"] = [*out["enum"], None]
        else:
            return {"anyOf": [out, {"type": "null"}]}
    return out


@functools.cache
def description() -> dict[str, Any]:
    doc = json.loads(_need(OPENAPI).read_text())
    return {"paths": doc["paths"], "components": _nullable(doc["components"]), "info": doc["info"]}


@functools.cache
def _paths() -> dict[str, Any]:
    # `paths` keep their `$ref`s to components; their inline schemas are rewritten too.
    return _nullable(description()["paths"])  # type: ignore[no-any-return]


def _pointer(*parts: str) -> str:
    return "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def operation(method: str, template: str) -> dict[str, Any]:
    """The documented operation, or an AssertionError: the fake serves nothing GitHub does not document."""
    op = _paths().get(template, {}).get(method.lower())
    assert op is not None, f"GitHub's OpenAPI description has no {method} {template}"
    return op  # type: ignore[no-any-return]


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        parts = node["$ref"].removeprefix("#/").split("/")
        found: Any = description()
        for p in parts:
            found = found[p.replace("~1", "/").replace("~0", "~")]
        node = found
    return node


def _validate(schema_pointer: str, value: Any) -> list[str]:
    root = {"$ref": schema_pointer, "paths": _paths(), "components": description()["components"]}
    validator = jsonschema.Draft4Validator(root)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"[:300] for e in validator.iter_errors(value)]


def check_request(method: str, template: str, body: Any) -> list[str]:
    op = operation(method, template)
    if "requestBody" not in op:
        return [] if body is None else [f"{method} {template} takes no body"]
    return _validate(
        _pointer("paths", template, method.lower(), "requestBody", "content", "application/json", "schema"), body
    )


def check_response(method: str, template: str, status: int, body: Any) -> list[str]:
    op = operation(method, template)
    responses = op["responses"]
    if str(status) not in responses:
        return [f"{method} {template}: GitHub documents no {status} answer ({sorted(responses)})"]
    response = _resolve(responses[str(status)])
    if "content" not in response:
        return []
    if "$ref" in responses[str(status)]:
        ref = responses[str(status)]["$ref"].removeprefix("#/").split("/")
        return _validate(_pointer(*ref, "content", "application/json", "schema"), body)
    return _validate(
        _pointer("paths", template, method.lower(), "responses", str(status), "content", "application/json", "schema"),
        body,
    )


def example_response(method: str, template: str, status: int) -> dict[str, Any]:
    """The first example GitHub documents for this answer (a copy to change)."""
    content = _resolve(operation(method, template)["responses"][str(status)])["content"]["application/json"]
    value = _resolve(next(iter(content["examples"].values())))["value"]
    while isinstance(value, dict) and set(value) == {"$ref"}:  # an example whose value is another example
        value = _resolve(value)["value"]
    return copy.deepcopy(value)


@functools.cache
def _webhook_examples() -> list[dict[str, Any]]:
    return json.loads(_need(WEBHOOK_EXAMPLES).read_text())  # type: ignore[no-any-return]


def webhook_example(event: str, action: str | None = None) -> dict[str, Any]:
    """The first of GitHub's example payloads of `event` (with `action`), a copy to change."""
    for entry in _webhook_examples():
        if entry["name"] == event:
            for example in entry["examples"]:
                if action is None or example.get("action") == action:
                    return copy.deepcopy(example)
    raise LookupError(f"no example {event}.{action}")


def webhook_examples() -> list[tuple[str, dict[str, Any]]]:
    """Every example payload, with its event name."""
    return [(e["name"], copy.deepcopy(x)) for e in _webhook_examples() for x in e["examples"]]


_TEMPLATE_PART = re.compile(r"\{[^}]+\}")


def template_of(path: str, templates: list[str]) -> str | None:
    """The first of `templates` that `path` fits."""
    for t in templates:
        if re.fullmatch(_TEMPLATE_PART.sub("[^/]+", t), path):
            return t
    return None
