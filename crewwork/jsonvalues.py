"""JSON a client sends, checked once where it enters (every API request body, the CLI's input files, the Python
client's requests): only what the store keeps faithfully gets in.

Python's `json` module accepts more than JSON: `NaN`, `Infinity` and `-Infinity` (not JSON at all), `1e999` (JSON,
but a float that overflows to infinity), and an object naming one key twice (the last one silently wins). None of
these survive the trip: the store's JSON columns and Temporal's payloads hold no non-finite number (a typed field
with one failed the submission with a server error; in `input` or `agent.config` it was stored as `null`), and a
duplicate key is dropped. Each is refused with the field that holds it. Text the store cannot keep (NUL, a lone
surrogate) and nesting depth are checked by crewwork.masking.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel

from crewwork.masking import without_nul


class JsonRefused(ValueError):
    """A JSON document holds something the store cannot keep faithfully; `field` names where ("" for the whole
    document), `code` is the API problem code."""

    def __init__(self, message: str, field: str, code: str) -> None:
        super().__init__(message)
        self.field = field
        self.code = code


def nonfinite_at(value: Any, path: str = "") -> str | None:
    """Where in `value` (JSON-like, or a pydantic model) the first number that is not finite (NaN, +-infinity) is,
    as a dotted path ("budget.max_cost_usd", "input.readings.2"), or None. Iterative, like masking.too_deep_at."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        v, here = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return without_nul(here)
            continue
        if isinstance(v, BaseModel):
            v = v.__dict__
        if isinstance(v, dict):
            items: Any = v.items()
        elif isinstance(v, list | tuple):
            items = enumerate(v)
        else:
            continue
        # Reversed onto the stack: the first offender in document order is the one named.
        for k, child in reversed(list(items)):
            stack.append((child, f"{here}.{k}" if here else str(k)))
    return None


def refuse_nonfinite(value: Any, field_prefix: str = "") -> None:
    """Raise JsonRefused (`invalid_number`) naming the first non-finite number in `value`."""
    where = nonfinite_at(value)
    if where is not None:
        field = f"{field_prefix}{where}"
        raise JsonRefused(
            f"{field}: not a finite number; JSON numbers must be finite (NaN and Infinity are not JSON, and a "
            "number as large as 1e999 overflows to infinity)",
            field,
            "invalid_number",
        )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise JsonRefused(
                f"the key {without_nul(k)!r} appears twice in one object; JSON object keys must be unique",
                "",
                "duplicate_key",
            )
        out[k] = v
    return out


def loads(text: str | bytes) -> Any:
    """Parse a client's JSON document, refusing (JsonRefused) what the store cannot keep faithfully: non-finite
    numbers (named by field), duplicate keys, integers too long for Python to convert (over 4300 digits) and
    nesting too deep for the parser. Malformed JSON raises json.JSONDecodeError, as json.loads does."""
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, JsonRefused):
        raise
    except UnicodeDecodeError as exc:  # a ValueError too: before the check for over-long numbers below
        raise JsonRefused(
            f"the document is not UTF-8 text (JSON is): byte {exc.start} cannot be decoded ({exc.reason})",
            "",
            "invalid_request",
        ) from None
    except RecursionError:
        raise JsonRefused(
            "the document nests objects and lists too deeply to be read", "", "too_deeply_nested"
        ) from None
    except ValueError as exc:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise JsonRefused(f"a number in the document is too long: {exc}", "", "invalid_number") from None
    refuse_nonfinite(value)
    return value
