"""Canonical JSON: the bytes that are signed and hashed are always made the same way, and untrusted JSON is parsed
strictly, by the one parser every door of crewwork uses (crewwork.boundary.jsonvalues: no duplicate keys, no NaN,
Infinity or 1e999, no lone surrogates, no integer past 4300 digits, UTF-8 without a byte order mark, nothing after
the document), with a verifier's bounds on values and nesting counted before anything is parsed, so two parsers
cannot read one document two ways and a hostile one is refused in bounded time and memory."""

from __future__ import annotations

import json
from typing import Any

from crewwork.attestation.format import MAX_JSON_DEPTH, MAX_JSON_VALUES
from crewwork.boundary.jsonvalues import JsonLimits, JsonRefused, loads


def canonical(data: Any) -> bytes:
    """Sorted keys, no insignificant whitespace, UTF-8: the same value always gives the same bytes."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


class StrictJSONError(ValueError):
    """The document is not JSON a verifier accepts; the message says why."""


def strict_loads(data: bytes | str, *, max_depth: int = MAX_JSON_DEPTH, max_values: int = MAX_JSON_VALUES) -> Any:
    """Parse untrusted JSON (crewwork.boundary.jsonvalues) within `max_depth` levels and `max_values` values."""
    try:
        return loads(data, JsonLimits(max_values=max_values, max_depth=max_depth))
    except JsonRefused as exc:
        raise StrictJSONError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise StrictJSONError(f"not valid JSON: {exc}") from None
