"""One JSON parser, one set of rules, whatever the door (crewwork.boundary.jsonvalues): what it refuses and why, and
that what it accepts every other reader of the same bytes reads the same way (Python's json, and pydantic-core's
parser, which the MCP SDK reads messages with)."""

from __future__ import annotations

import json

import pydantic_core
import pytest

from crewwork.boundary import jsonvalues
from crewwork.boundary.jsonvalues import JsonLimits, JsonRefused

REFUSED = [
    ('{"a": 1, "a": 2}', "duplicate_key", ""),
    ('{"x": {"y": [1, NaN]}}', "invalid_number", "x.y.1"),
    ('{"x": Infinity}', "invalid_number", "x"),
    ('{"size": 1e999}', "invalid_number", "size"),
    ('{"n": ' + "1" * 5000 + "}", "invalid_number", ""),
    ('{"t": "\\ud800"}', "invalid_text", "t"),
    ('{"\\udfff": 1}', "invalid_text", "\ufffd"),
    ('["a\\ud83d"]', "invalid_text", "0"),
    ("[" * 65 + "]" * 65, "too_deeply_nested", ".".join(["0"] * 64)),
    ("[" * 200_000 + "]" * 200_000, "too_deeply_nested", ""),
]
ACCEPTED = [
    '{"a": [1, -0, 0.5, 1e308, -1.5E-300, 12345678901234567890123, true, false, null]}',
    '{"emoji": "\\ud83d\\ude00", "raw": "é☃", "esc": "\\"\\\\\\/\\b\\f\\n\\r\\t\\u0000"}',
    '  [ {} , [] , "" , {"k": {"k": {"k": []}}} ]  \n',
    "[" * 64 + "]" * 64,
    '"' + "x" * 100_000 + '"',
    "9" * 4300,
]


@pytest.mark.parametrize(("doc", "code", "field"), REFUSED)
def test_what_no_two_readers_would_read_alike_is_refused_naming_why(doc: str, code: str, field: str) -> None:
    with pytest.raises(JsonRefused) as refused:
        jsonvalues.loads(doc)
    assert (refused.value.code, refused.value.field) == (code, field), str(refused.value)


@pytest.mark.parametrize(
    "data",
    [b"\xef\xbb\xbf{}", '{"a": 1}'.encode("utf-16"), '{"a": 1}'.encode("utf-32"), b'{"a": "caf\xe9"}', "\ufeff{}"],
)
def test_only_utf8_without_a_byte_order_mark_is_json(data: bytes | str) -> None:
    with pytest.raises(JsonRefused) as refused:
        jsonvalues.loads(data)
    assert refused.value.code == "invalid_request"


def test_trailing_data_and_malformed_json_are_parse_errors() -> None:
    for doc in ('{"a": 1} {}', '{"a": 1}\x00', "{'a': 1}", '{"a": 01}', '{"a": "x\ny"}', ""):
        with pytest.raises(json.JSONDecodeError):
            jsonvalues.loads(doc)


def test_strings_are_read_past_in_one_pass_whatever_they_hold() -> None:
    """Strings are blanked before the structure is counted. A backtracking pattern did it first, and a string of
    escaped quotes with no closing quote took it quadratic time (12 s for 20 KB, so hours for a bundle): now each
    string is read once, to its closing quote, and the adversarial shapes are read as JSON reads them."""
    limits = JsonLimits(max_values=100)  # below the documents' lengths: the count runs
    for doc in ('"' + '\\"' * 200_000, '["' + "\\\\" * 200_000, '"' + "a" * 400_000 + "\\"):
        with pytest.raises(json.JSONDecodeError, match="Unterminated string"):
            jsonvalues.loads(doc, limits)
    escaped = '["' + '\\"' * 200_000 + '", "[{,:"]'
    assert jsonvalues.loads(escaped, limits) == json.loads(escaped)


def test_values_and_depth_are_counted_before_anything_is_parsed() -> None:
    many = "[" + ",".join(["0"] * 2001) + "]"
    with pytest.raises(JsonRefused) as refused:
        jsonvalues.loads(many, JsonLimits(max_values=2000))
    assert refused.value.code == "too_large"
    keys = "{" + ",".join(f'"k{i}": 0' for i in range(1001)) + "}"
    with pytest.raises(JsonRefused):
        jsonvalues.loads(keys, JsonLimits(max_values=2000))
    # Brackets, commas and colons inside strings are text, not structure.
    assert jsonvalues.loads('["' + "[{,:" * 5000 + '"]', JsonLimits(max_values=10, max_depth=1))
    with pytest.raises(JsonRefused) as refused:
        jsonvalues.loads(b"x" * 11, JsonLimits(max_bytes=10))
    assert refused.value.code == "payload_too_large"


@pytest.mark.parametrize("doc", ACCEPTED)
def test_what_is_accepted_reads_the_same_in_every_parser(doc: str) -> None:
    """The MCP SDK parses a message with pydantic-core (`from_json`) after the edge accepted it: for every document the
    edge accepts, that parser (and Python's own json) reads the same value."""
    ours = jsonvalues.loads(doc)
    assert ours == json.loads(doc)
    assert ours == pydantic_core.from_json(doc, allow_inf_nan=True)
    assert ours == jsonvalues.loads(doc.encode())


def test_the_other_parsers_read_what_is_refused_otherwise() -> None:
    """Why the edge refuses, not leaves it to the SDK: pydantic-core keeps a duplicate key's last value and takes NaN."""
    assert pydantic_core.from_json('{"a": 1, "a": 2}') == {"a": 2}
    assert pydantic_core.from_json("NaN", allow_inf_nan=True) != pydantic_core.from_json("NaN", allow_inf_nan=True)


def test_a_python_value_about_to_be_sent_follows_the_same_rules() -> None:
    cases = {
        "int key": ({1: "a", "1": "b"}, "invalid_request", "1"),
        "nan": ({"a": [1.0, float("nan")]}, "invalid_number", "a.1"),
        "surrogate": ({"a": "\ud800"}, "invalid_text", "a"),
        "surrogate key": ({"\udc80": 1}, "invalid_text", "\ufffd"),
        "huge int": ({"n": 10**5000}, "invalid_number", "n"),
    }
    for what, (value, code, field) in cases.items():
        with pytest.raises(JsonRefused) as refused:
            jsonvalues.refuse(value)
        assert (refused.value.code, refused.value.field) == (code, field), what
    deep: object = 1
    for _ in range(65):
        deep = [deep]
    with pytest.raises(JsonRefused) as refused:
        jsonvalues.refuse({"input": deep}, "")
    assert refused.value.code == "too_deeply_nested"
    jsonvalues.refuse({"ok": [1, 2.5, "é", {"k": None}], "big": 10**4000})


def test_the_python_client_refuses_at_the_call_what_the_api_would() -> None:
    from crewwork.client import Client

    with Client("http://127.0.0.1:9", "cw_none") as c:
        for bad in ({"x": "\ud800"}, {1: 1, "1": 2}, {"n": 10**5000}):
            with pytest.raises(ValueError, match="input"):
                c.submit({"kind": "task", "input": bad})
