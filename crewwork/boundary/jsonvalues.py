"""JSON from outside, parsed once where it enters, by one parser with one set of rules, whatever the door: every API
request body (crewwork.api.bodies), every MCP message (crewwork.mcp.server), the CLI's input files, the Python
client's requests (`refuse`, the same rules on a value about to be sent), and the evidence bundles and keys documents a verifier reads
(crewwork.attestation.canonical, with tighter bounds). Only what every later reader sees the same way, and what the
store keeps faithfully, gets in.

Python's `json` module accepts more than JSON: `NaN`, `Infinity` and `-Infinity` (not JSON at all), `1e999` (JSON,
but a float that overflows to infinity), an object naming one key twice (the last one silently wins, where another
parser may keep the first), `\\ud800` (a lone surrogate: no Unicode text, no UTF-8 encoder takes it), UTF-16 and
UTF-32 bytes (detected by guessing; JSON between systems is UTF-8) and integers of any length (converting 5,000
digits raises). None of these survive the trip to the store, to Temporal or to another parser. Each is refused:

| what | code | field named |
|---|---|---|
| bytes that are not UTF-8, or that start with a byte order mark | `invalid_request` | no |
| larger than the caller's `max_bytes` | `payload_too_large` | no |
| more than MAX_VALUES values (and keys), counted before parsing | `too_large` | no |
| nested deeper than MAX_DEPTH objects and lists, counted before parsing | `too_deeply_nested` | no |
| an integer of more than MAX_INT_DIGITS digits | `invalid_number` | no |
| a key given twice in one object | `duplicate_key` | no |
| a number that is not finite (`NaN`, `Infinity`, `1e999`) | `invalid_number` | yes |
| a string or key holding a lone surrogate (`\\ud800`) | `invalid_text` | yes |

Malformed JSON (and trailing data after the document) raises json.JSONDecodeError, as json.loads does. The counts
before parsing are what keep a hostile document bounded in time and memory: a 60 MiB array of one-digit numbers is
30 million Python objects; it is refused after one linear pass over its text, before one of them is made (a
document of fewer characters than MAX_VALUES cannot hold more values, and is parsed directly). NUL in text is
the store's own rule (crewwork.boundary.masking), not JSON's.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from crewwork.boundary.masking import MAX_NESTING, without_nul

MAX_DEPTH = MAX_NESTING
"""Objects and lists one document may nest (64): what the store and pydantic's serializer take, far beyond any real
input."""
MAX_VALUES = 1_000_000
"""Values and keys one document may hold (counted from its commas, colons and opening brackets before parsing). A
1 MiB API body holds at most ~500,000; a verifier's bound is its own (crewwork.attestation.format)."""
MAX_INT_DIGITS = 4300
"""Digits one integer may have (Python's own limit for converting text to int, made explicit here so that no
process setting moves it)."""

_BOMS = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")
_STRING_BODY = re.compile(r'(?:[^"\\]++|\\.)*+', re.DOTALL)
"""A string's characters up to its closing quote: possessive, so it never backtracks (a backtracking pattern over
`"\\"\\"\\"…` with no closing quote took quadratic time: 12 s for 20 KB)."""
_BRACKETS = re.compile(r"[\[\]{}]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class JsonRefused(ValueError):
    """A JSON document holds something the store cannot keep faithfully; `field` names where ("" for the whole
    document), `code` is the API problem code."""

    def __init__(self, message: str, field: str, code: str) -> None:
        super().__init__(message)
        self.field = field
        self.code = code


@dataclass(frozen=True)
class JsonLimits:
    """The bounds one door parses with (the defaults are every API request's and MCP message's)."""

    max_bytes: int | None = None
    max_values: int = MAX_VALUES
    max_depth: int = MAX_DEPTH


DEFAULT_LIMITS = JsonLimits()


INT_MAX_BITS = math.ceil(MAX_INT_DIGITS / math.log10(2))
"""An int of more bits than this has more than MAX_INT_DIGITS digits (checked without converting it to text)."""


def _offence(v: Any) -> str | None:
    """What is wrong with one value (not its children): a number that is not finite, an integer too long, text
    with a lone surrogate."""
    if isinstance(v, float):
        return None if math.isfinite(v) else "number"
    if isinstance(v, str):
        return "text" if _SURROGATE.search(v) else None
    if isinstance(v, int) and not isinstance(v, bool):
        return "integer" if v.bit_length() > INT_MAX_BITS else None
    return None


def _key_offence(k: Any) -> str | None:
    if isinstance(k, str):
        return "text" if _SURROGATE.search(k) else None
    return "key"  # json.dumps would write {1: .., "1": ..} as one key twice


def _finite(v: Any) -> str | None:
    return "number" if isinstance(v, float) and not math.isfinite(v) else None


def _children(v: Any) -> Iterator[tuple[Any, Any]] | None:
    if isinstance(v, BaseModel):
        v = v.__dict__
    if isinstance(v, dict):
        return iter(v.items())
    if isinstance(v, list | tuple):
        return iter(enumerate(v))
    return None


def _first(
    value: Any, offence: Callable[[Any], str | None], *, keys: bool, max_depth: int | None = None
) -> tuple[list[Any], str] | None:
    """(path, what) of the first value (or key, with `keys`) in document order that `offence` names (or the first
    container deeper than `max_depth`), or None. Iterative, with one iterator per level open: its memory is the
    document's depth, not its size."""
    what = offence(value)
    if what is not None:
        return [], what
    top = _children(value)
    if top is None:
        return None
    iters: list[Iterator[tuple[Any, Any]]] = [top]
    path: list[Any] = []
    while iters:
        item = next(iters[-1], None)
        if item is None:
            iters.pop()
            if path:
                path.pop()
            continue
        key, child = item
        if keys and isinstance(iters[-1], _DictItems) and (what := _key_offence(key)) is not None:
            return [*path, key], what
        what = offence(child)
        if what is not None:
            return [*path, key], what
        below = _children(child)
        if below is not None:
            if max_depth is not None and len(iters) >= max_depth:
                return [*path, key], "depth"
            iters.append(below)
            path.append(key)
    return None


_DictItems: type = type(iter({}.items()))


def _dotted(path: list[Any], prefix: str = "") -> str:
    """ "budget.max_cost_usd", "input.readings.2": the keys and indexes of `path`, after `prefix`."""
    return without_nul(".".join([prefix, *map(str, path)] if prefix else map(str, path)))


def nonfinite_at(value: Any, path: str = "") -> str | None:
    """Where in `value` (JSON-like, or a pydantic model) the first number that is not finite (NaN, +-infinity) is,
    as a dotted path ("budget.max_cost_usd", "input.readings.2"), or None."""
    found = _first(value, _finite, keys=False)
    return None if found is None else _dotted(found[0], path)


def refuse_nonfinite(value: Any, field_prefix: str = "") -> None:
    """Raise JsonRefused (`invalid_number`) naming the first non-finite number in `value`."""
    where = nonfinite_at(value)
    if where is not None:
        raise _refused("number", f"{field_prefix}{where}")


def refuse(value: Any, field_prefix: str = "", *, max_depth: int = MAX_DEPTH) -> None:
    """The rules above for a value about to be sent as JSON (the Python client's requests), as `loads` applies them
    to one received: JsonRefused naming the first offender and where it is."""
    found = _first(value, _offence, keys=True, max_depth=max_depth)
    if found is not None:
        raise _refused(found[1], _dotted(found[0], field_prefix.rstrip(".")), max_depth)


def _refused(what: str, field: str, max_depth: int = MAX_DEPTH) -> JsonRefused:
    where = field or "the document"
    if what == "number":
        return JsonRefused(
            f"{where}: not a finite number; JSON numbers must be finite (NaN and Infinity are not JSON, and a number "
            "as large as 1e999 overflows to infinity)",
            field,
            "invalid_number",
        )
    if what == "integer":
        return JsonRefused(f"{where}: an integer of more than {MAX_INT_DIGITS} digits", field, "invalid_number")
    if what == "key":
        return JsonRefused(f"{where}: an object key that is not text (JSON keys are strings)", field, "invalid_request")
    if what == "depth":
        return JsonRefused(
            f"{where}: nested deeper than {max_depth} levels (objects and lists)", field, "too_deeply_nested"
        )
    return JsonRefused(
        f"{where}: text must not contain a lone surrogate (U+D800-U+DFFF): it is no Unicode text, and nothing can "
        "store or encode it",
        field,
        "invalid_text",
    )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise JsonRefused(
                f"the key {without_nul(k)[:200]!r} appears twice in one object; JSON object keys must be unique",
                "",
                "duplicate_key",
            )
        out[k] = v
    return out


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise JsonRefused(
            f"a number in the document is too long: an integer of {digits} digits (at most {MAX_INT_DIGITS})",
            "",
            "invalid_number",
        )
    return int(text)


def _text(data: str | bytes) -> str:
    if isinstance(data, str):
        if data.startswith("\ufeff"):
            raise JsonRefused("the document starts with a byte order mark (JSON text has none)", "", "invalid_request")
        return data
    if data.startswith(_BOMS):
        raise JsonRefused(
            "the document starts with a byte order mark (JSON is UTF-8 text without one)", "", "invalid_request"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonRefused(
            f"the document is not UTF-8 text (JSON is): byte {exc.start} cannot be decoded ({exc.reason})",
            "",
            "invalid_request",
        ) from None


def _too_many(limits: JsonLimits, about: int) -> JsonRefused:
    return JsonRefused(
        f"the document holds more than {limits.max_values} values (about {about}); it is not read", "", "too_large"
    )


def _without_strings(text: str, limits: JsonLimits) -> str:
    """`text` with every string's contents removed (they hold no structure), in one pass: each string is found by
    its opening quote and read to its closing one without backtracking; an unterminated string ends the text (the
    parser refuses it). More strings than values allowed are refused here, which bounds the loop."""
    parts: list[str] = []
    pos, strings, end_of_text = 0, 0, len(text)
    while True:
        quote = text.find('"', pos)
        if quote < 0:
            parts.append(text[pos:])
            break
        parts.append(text[pos:quote])
        strings += 1
        if strings > limits.max_values:
            raise _too_many(limits, strings + text.count('"', quote + 1) // 2)
        m = _STRING_BODY.match(text, quote + 1)
        end = m.end() if m is not None else quote + 1
        if end >= end_of_text or text[end] != '"':
            break
        parts.append('""')
        pos = end + 1
    return "".join(parts)


def _shape(text: str, limits: JsonLimits) -> None:
    """Refuse a document with more values or deeper nesting than `limits`, before anything of it is parsed: strings
    are blanked, then the structural characters are counted. Linear in the text, whatever it holds."""
    bare = _without_strings(text, limits)
    values = 1 + bare.count(",") + bare.count(":") + bare.count("[") + bare.count("{")
    if values > limits.max_values:
        raise _too_many(limits, values)
    brackets = "".join(_BRACKETS.findall(bare))
    if not brackets:
        return
    deepest = max(itertools.accumulate(1 if c in "[{" else -1 for c in brackets))
    if deepest > limits.max_depth:
        raise JsonRefused(
            f"the document nests objects and lists deeper than {limits.max_depth} levels", "", "too_deeply_nested"
        )


def loads(data: str | bytes, limits: JsonLimits = DEFAULT_LIMITS) -> Any:
    """Parse a JSON document from outside by the rules above: JsonRefused naming why (and, where it can, the field),
    json.JSONDecodeError for malformed JSON."""
    if limits.max_bytes is not None and len(data) > limits.max_bytes:
        raise JsonRefused(
            f"the document is {len(data)} bytes; at most {limits.max_bytes} are read", "", "payload_too_large"
        )
    text = _text(data)
    if len(text) > limits.max_values:
        # Each value takes at least one character: a shorter document cannot hold too many, and parsing it costs
        # no more than reading it (its nesting is checked by the parser's own recursion bound and `refuse`).
        _shape(text, limits)
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_int=_int)
    except RecursionError:  # far deeper than max_depth (the parser's recursion bound): never a traceback
        raise JsonRefused(
            f"the document nests objects and lists deeper than {limits.max_depth} levels", "", "too_deeply_nested"
        ) from None
    refuse(value, max_depth=limits.max_depth)
    return value
