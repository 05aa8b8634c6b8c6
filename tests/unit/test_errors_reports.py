"""Error reports as the intake reads them (docs/errors-intake.md): the Sentry envelope and store payloads, the
fingerprint that groups repeats, and the bounded decompression of a body."""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

import pytest

from crewwork.errors.reports import ErrorReport, Frame, Refused, decompressed
from crewwork.errors.sentry import auth_key, event_report, parse_envelope, parse_store


def event(kind: str = "KeyError", value: str = "'a'", line: int = 3, **kw: Any) -> dict[str, Any]:
    frames = [
        {"filename": "lib/site-packages/web.py", "function": "dispatch", "lineno": 90, "in_app": False},
        {
            "filename": "shop/cart.py",
            "abs_path": "/srv/app/shop/cart.py",
            "function": "total",
            "lineno": line,
            "module": "shop.cart",
            "in_app": True,
            "context_line": "return prices[key]",
        },
    ]
    return {
        "event_id": "e" * 32,
        "exception": {"values": [{"type": kind, "value": value, "stacktrace": {"frames": frames}}]},
        **kw,
    }


def test_repeats_of_one_error_share_a_fingerprint_and_other_errors_do_not() -> None:
    a = event_report(event(value="'a'", line=3))
    b = event_report(event(value="'b' at 0x7f00aa", line=40))  # another message, another line: the same error
    c = event_report(event(kind="ValueError"))
    assert a is not None and b is not None and c is not None
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    # The event's own fingerprint wins; `{{ default }}` stands for the default.
    d = event_report(event(fingerprint=["checkout-timeout"]))
    e = event_report(event(kind="ValueError", fingerprint=["checkout-timeout"]))
    f = event_report(event(fingerprint=["{{ default }}", "eu"]))
    assert d is not None and e is not None and f is not None
    assert d.fingerprint() == e.fingerprint() and len({a.fingerprint(), d.fingerprint(), f.fingerprint()}) == 3


def test_the_trace_reads_like_pythons_and_names_the_apps_files() -> None:
    r = event_report(event())
    assert r is not None
    trace = r.trace()
    assert 'File "shop/cart.py", line 3, in total' in trace and trace.endswith("KeyError: 'a'")
    assert r.title == "KeyError: 'a'"


def test_what_is_not_an_error_is_none_and_a_logged_error_is_one() -> None:
    assert event_report({"level": "info", "message": "hello"}) is None
    assert event_report({"level": "error"}) is None  # nothing to tell
    r = event_report({"level": "error", "logger": "billing", "logentry": {"formatted": "card declined"}})
    assert r is not None and r.exception_type == "billing" and r.message == "card declined"
    with pytest.raises(Refused):
        event_report([1, 2])


def test_fields_of_the_wrong_type_are_absent_and_long_ones_are_cut() -> None:
    hostile = {
        "exception": {
            "values": [{"type": 7, "value": "x" * 100_000, "stacktrace": {"frames": [1, {"lineno": "x"}] * 100}}]
        }
    }
    r = event_report(hostile)
    assert r is not None and r.exception_type == "Error" and len(r.message) <= 2000
    assert len(r.frames) <= 50 and r.truncated and len(r.trace()) <= 12_000


def test_an_envelope_is_read_item_by_item_with_or_without_lengths() -> None:
    payload = json.dumps(event()).encode()
    body = b"\n".join(
        [
            b'{"event_id":"abc"}',
            json.dumps({"type": "attachment", "length": 5}).encode(),
            b"a\nb\nc",
            json.dumps({"type": "event", "length": len(payload)}).encode(),
            payload,
            b'{"type":"session"}',
            b"{}",
            b'{"type":"event"}',
            payload,
        ]
    )
    env = parse_envelope(body, max_items=10)
    assert env.event_id == "abc" and len(env.events) == 2 and env.dropped == 2
    with pytest.raises(Refused) as too_many:
        parse_envelope(body, max_items=3)
    assert too_many.value.status == 413
    with pytest.raises(Refused) as bad_length:
        parse_envelope(b'{}\n{"type":"event","length":99999}\n{}', max_items=10)
    assert bad_length.value.code == "invalid_envelope"
    assert parse_store(payload).events[0].exception_type == "KeyError"


def test_the_key_is_read_from_the_header_or_the_query() -> None:
    assert auth_key("Sentry sentry_key=abc123, sentry_version=7, sentry_client=x/1", None) == "abc123"
    assert auth_key("Sentry sentry_version=7,sentry_key=abc123", None) == "abc123"
    assert auth_key(None, "q") == "q" and auth_key("Sentry sentry_version=7", None) is None


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda b: zlib.compress(b)[2:-4]),  # raw deflate, as some senders send it
    ],
)
def test_decompression_is_bounded_by_its_output(encoding: str, pack: Any) -> None:
    assert decompressed(pack(b"x" * 1000), encoding, 1000) == b"x" * 1000
    with pytest.raises(Refused) as bomb:
        decompressed(pack(b"\0" * 10_000_000), encoding, 1000)
    assert bomb.value.status == 413 and "decompressed" in str(bomb.value)
    with pytest.raises(Refused) as cut:
        decompressed(pack(b"x" * 1000)[:-8], encoding, 2000)
    assert cut.value.status == 400


def test_an_unknown_encoding_or_an_oversized_plain_body_is_refused() -> None:
    with pytest.raises(Refused) as br:
        decompressed(b"x", "br", 10)
    assert br.value.status == 415
    with pytest.raises(Refused) as big:
        decompressed(b"x" * 11, "", 10)
    assert big.value.status == 413


def test_a_report_without_frames_is_named_by_its_message() -> None:
    one = ErrorReport("Error", "disk full on /var/tmp/abc123def4567890")
    two = ErrorReport("Error", "disk full on /var/tmp/ffff00001111aaaa")
    three = ErrorReport("Error", "quota exceeded")
    assert one.fingerprint() == two.fingerprint() != three.fingerprint()
    with_frames = ErrorReport("Error", "a", (Frame("x.py", "f", 1),))
    assert "x.py" in with_frames.trace()


def otlp_logs(*records: dict[str, str]) -> bytes:
    recs = [{"attributes": [{"key": k, "value": {"stringValue": v}} for k, v in r.items()]} for r in records]
    return json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": recs}]}]}).encode()


PY_TRACE = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/shop/cart.py", line 12, in total\n'
    "    return prices[key]\n"
    '  File "/usr/lib/python3.11/site-packages/x.py", line 3, in get\n'
    "KeyError: 'a'\n"
)


def test_otlp_exception_records_are_reports_and_the_rest_is_dropped() -> None:
    from crewwork.errors.otel import parse_otlp

    body = otlp_logs(
        {"exception.type": "KeyError", "exception.message": "'a'", "exception.stacktrace": PY_TRACE},
        {"other": "x"},
    )
    env = parse_otlp(body, "application/json", "logs")
    assert env.dropped == 1 and len(env.events) == 1
    (r,) = env.events
    assert [f.function for f in r.frames] == ["total", "get"] and r.frames[0].context_line == "return prices[key]"
    assert r.frames[0].in_app and not r.frames[1].in_app
    spans = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "events": [
                                    {
                                        "name": "exception",
                                        "attributes": [
                                            {"key": "exception.type", "value": {"stringValue": "KeyError"}},
                                            {"key": "exception.stacktrace", "value": {"stringValue": PY_TRACE}},
                                        ],
                                    },
                                    {"name": "log"},
                                ]
                            },
                            {},
                        ]
                    }
                ]
            }
        ]
    }
    env = parse_otlp(json.dumps(spans).encode(), "application/json; charset=utf-8", "traces")
    assert len(env.events) == 1 and env.dropped == 2 and env.events[0].fingerprint() == r.fingerprint()
    with pytest.raises(Refused) as media:
        parse_otlp(body, "text/plain", "logs")
    assert media.value.status == 415
    with pytest.raises(Refused) as bad:
        parse_otlp(b"\xff\xff\xff", "application/x-protobuf", "logs")
    assert bad.value.status == 400
