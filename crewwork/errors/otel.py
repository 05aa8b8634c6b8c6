"""OpenTelemetry exception events, as OTLP/HTTP delivers them (`POST <endpoint>/v1/logs`, `/v1/traces`), JSON
(`application/json`) or protobuf (`application/x-protobuf`, what the Python SDK's exporter sends; read with the
`opentelemetry-proto` package when it is installed, else refused with 415 asking for http/json).

An exception is a log record, or a span event named `exception`, whose attributes carry `exception.type` or
`exception.message` (the semantic conventions; `exception.stacktrace` is the trace as text: a Python traceback is
read into frames, another language's is kept as text and its `at ...` lines name it). Everything else in the batch
(ordinary logs, spans) is counted as dropped. Values are the sender's: checked for their type, cut to their bounds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from crewwork.boundary import jsonvalues
from crewwork.errors.reports import (
    MAX_MESSAGE_CHARS,
    MAX_TRACE_CHARS,
    MAX_TYPE_CHARS,
    ErrorReport,
    Refused,
    clip,
    python_frames,
)
from crewwork.errors.sentry import Envelope

JSON = "application/json"
PROTOBUF = "application/x-protobuf"
MAX_RECORDS = 10_000
"""Log records or span events one request may carry (the SDK's exporters send at most 512 at a time)."""


def _load(body: bytes, content_type: str, signal: str) -> dict[str, Any]:
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime == JSON:
        try:
            data = jsonvalues.loads(body)
        except json.JSONDecodeError as exc:
            raise Refused(400, "invalid_otlp", f"the body is not JSON: {exc.msg} at {exc.pos}") from None
        except jsonvalues.JsonRefused as exc:
            raise Refused(400, "invalid_otlp", str(exc)) from None
    elif mime == PROTOBUF:
        data = _from_protobuf(body, signal)
    else:
        raise Refused(415, "unsupported_media_type", f"send OTLP as {JSON} or {PROTOBUF}")
    if not isinstance(data, dict):
        raise Refused(400, "invalid_otlp", "an OTLP export request is a JSON object")
    return data


def _from_protobuf(body: bytes, signal: str) -> Any:
    try:
        from google.protobuf.json_format import MessageToDict
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    except ImportError:  # the `otel` extra is not installed
        raise Refused(
            415,
            "unsupported_media_type",
            f"this server reads OTLP as {JSON} only (OTEL_EXPORTER_OTLP_PROTOCOL=http/json)",
        ) from None
    message = ExportLogsServiceRequest() if signal == "logs" else ExportTraceServiceRequest()
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
        raise Refused(400, "invalid_otlp", f"the body is not an OTLP {signal} export request: {exc}") from None
    return MessageToDict(message)


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _attributes(attrs: Any) -> dict[str, str]:
    """The string attributes of a list of OTLP KeyValues (others are not read)."""
    out: dict[str, str] = {}
    for kv in _list(attrs):
        kv = _dict(kv)
        key, value = kv.get("key"), _dict(kv.get("value")).get("stringValue")
        if isinstance(key, str) and key.startswith("exception.") and isinstance(value, str):
            out[key] = value
    return out


def _records(data: dict[str, Any], signal: str) -> Iterator[dict[str, str]]:
    """Each record's (or span event's) exception attributes, or {} for one that carries none."""
    if signal == "logs":
        for rl in _list(data.get("resourceLogs")):
            for sl in _list(_dict(rl).get("scopeLogs")):
                for rec in _list(_dict(sl).get("logRecords")):
                    yield _attributes(_dict(rec).get("attributes"))
    else:
        for rs in _list(data.get("resourceSpans")):
            for ss in _list(_dict(rs).get("scopeSpans")):
                for span in _list(_dict(ss).get("spans")):
                    events = _list(_dict(span).get("events"))
                    if not events:
                        yield {}
                    for ev in events:
                        ev = _dict(ev)
                        yield _attributes(ev.get("attributes")) if ev.get("name") == "exception" else {}


def report_of(attrs: dict[str, str]) -> ErrorReport | None:
    kind, message = attrs.get("exception.type", ""), attrs.get("exception.message", "")
    if not kind and not message:
        return None
    trace = clip(attrs.get("exception.stacktrace", ""), 4 * MAX_TRACE_CHARS)
    frames = python_frames(trace)
    return ErrorReport(
        exception_type=clip(kind or "Error", MAX_TYPE_CHARS),
        message=clip(message, MAX_MESSAGE_CHARS),
        frames=frames,
        platform="opentelemetry",
        raw_trace="" if frames else clip(trace, MAX_TRACE_CHARS),
    )


def parse_otlp(body: bytes, content_type: str, signal: str) -> Envelope:
    """An OTLP export request's exception events (`signal`: "logs" or "traces")."""
    data = _load(body, content_type, signal)
    events: list[ErrorReport] = []
    dropped = 0
    for n, attrs in enumerate(_records(data, signal)):
        if n >= MAX_RECORDS:
            raise Refused(413, "too_many_items", f"an OTLP export request carries at most {MAX_RECORDS} records")
        report = report_of(attrs) if attrs else None
        if report is None:
            dropped += 1
        else:
            events.append(report)
    return Envelope(event_id="", events=events, dropped=dropped)
