"""Canonical JSON: the bytes that are signed and hashed are always made the same way, and untrusted JSON is parsed
strictly (no duplicate keys, no NaN or Infinity, bounded nesting), so two parsers cannot read one document two ways."""

from __future__ import annotations

import json
from typing import Any


def canonical(data: Any) -> bytes:
    """Sorted keys, no insignificant whitespace, UTF-8: the same value always gives the same bytes."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


class StrictJSONError(ValueError):
    """The document is not JSON a verifier accepts; the message says why."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise StrictJSONError(f"duplicate key {key!r} (a document with two values for one key is ambiguous)")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not JSON")


def strict_loads(data: bytes | str, *, max_depth: int) -> Any:
    """Parse untrusted JSON: duplicate keys, NaN/Infinity and nesting deeper than `max_depth` are refused."""
    try:
        value = json.loads(data, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError:
        raise StrictJSONError("nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise StrictJSONError(f"not UTF-8: {exc.reason}") from None
    except json.JSONDecodeError as exc:
        raise StrictJSONError(f"not valid JSON: {exc}") from None
    if _depth(value) > max_depth:
        raise StrictJSONError(f"nested deeper than {max_depth} levels")
    return value


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest
