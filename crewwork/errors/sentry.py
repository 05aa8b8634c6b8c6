"""The Sentry SDK's wire formats, as far as error intake reads them: the envelope (`POST /api/<project>/envelope/`,
what every current SDK sends) and the legacy store payload (`POST /api/<project>/store/`: one event as JSON), and
the SDK's authentication (`X-Sentry-Auth: Sentry sentry_key=...`, or `?sentry_key=` from a browser).

An envelope is a JSON header line, then items: each a JSON header line (`type`, optionally `length`) and a payload
of `length` bytes, or up to the next newline. Only `event` items are read (an exception, or a message at level
error or fatal); sessions, transactions, attachments, client reports and the rest are acknowledged and dropped.
Everything in an event is the sender's: each field is checked for its type and cut to its bound, and a field that
is not what Sentry documents is treated as absent, never as an error of crewwork's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from crewwork.boundary import jsonvalues
from crewwork.errors.reports import (
    MAX_FRAMES,
    MAX_MESSAGE_CHARS,
    MAX_TYPE_CHARS,
    ErrorReport,
    Frame,
    Refused,
    clip,
)

ERROR_LEVELS = {"error", "fatal"}
_AUTH_KEY = re.compile(r"(?:^|[\s,])sentry_key=([A-Za-z0-9_-]{1,64})(?:$|[\s,])")


def auth_key(header: str | None, query_key: str | None) -> str | None:
    """The DSN public key a request carries: its `X-Sentry-Auth` header's `sentry_key`, else the query's."""
    if header:
        m = _AUTH_KEY.search(header.strip().removeprefix("Sentry").strip())
        if m:
            return m.group(1)
    return query_key or None


@dataclass(frozen=True)
class Envelope:
    event_id: str
    events: list[ErrorReport]
    """The error events it carried (at most the caller's `max_items` items were read)."""
    dropped: int
    """Items that were not error events."""


def _json(data: bytes, what: str) -> Any:
    try:
        return jsonvalues.loads(data)
    except json.JSONDecodeError as exc:
        raise Refused(400, "invalid_envelope", f"{what} is not JSON: {exc.msg} at {exc.pos}") from None
    except jsonvalues.JsonRefused as exc:
        raise Refused(400, "invalid_envelope", f"{what}: {exc}") from None


def parse_envelope(body: bytes, max_items: int) -> Envelope:
    """Read an envelope (the module's docstring). More than `max_items` items: 413."""
    header_line, _sep, rest = body.partition(b"\n")
    header = _json(header_line, "the envelope header") if header_line.strip() else {}
    if not isinstance(header, dict):
        raise Refused(400, "invalid_envelope", "the envelope header is not a JSON object")
    event_id = clip(header.get("event_id"), 64)
    events: list[ErrorReport] = []
    dropped = 0
    items = 0
    pos = 0
    while pos < len(rest):
        if rest[pos : pos + 1] == b"\n":  # blank lines between items
            pos += 1
            continue
        items += 1
        if items > max_items:
            raise Refused(413, "too_many_items", f"an envelope carries at most {max_items} items")
        end = rest.find(b"\n", pos)
        line = rest[pos:] if end < 0 else rest[pos:end]
        item = _json(line, f"item {items}'s header")
        if not isinstance(item, dict):
            raise Refused(400, "invalid_envelope", f"item {items}'s header is not a JSON object")
        start = len(rest) if end < 0 else end + 1
        length = item.get("length")
        if length is not None:
            if not isinstance(length, int) or isinstance(length, bool) or length < 0 or start + length > len(rest):
                raise Refused(400, "invalid_envelope", f"item {items}'s length does not fit the envelope")
            payload = rest[start : start + length]
            pos = start + length
        else:
            stop = rest.find(b"\n", start)
            payload = rest[start:] if stop < 0 else rest[start:stop]
            pos = len(rest) if stop < 0 else stop
        if item.get("type") != "event":
            dropped += 1
            continue
        report = event_report(_json(payload, f"item {items}"))
        if report is None:
            dropped += 1
        else:
            events.append(report)
            event_id = event_id or report.event_id
    return Envelope(event_id=event_id, events=events, dropped=dropped)


def parse_store(body: bytes) -> Envelope:
    """The legacy store endpoint's body: one event as JSON."""
    report = event_report(_json(body, "the event"))
    return Envelope(
        event_id=report.event_id if report else "", events=[report] if report else [], dropped=0 if report else 1
    )


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _frames(stacktrace: Any) -> tuple[tuple[Frame, ...], bool]:
    raw = stacktrace.get("frames") if isinstance(stacktrace, dict) else None
    if not isinstance(raw, list):
        return (), False
    kept = raw[-MAX_FRAMES:]
    frames = []
    for f in kept:
        if not isinstance(f, dict):
            continue
        lineno = f.get("lineno")
        in_app = f.get("in_app")
        frames.append(
            Frame(
                filename=clip(_str(f.get("filename")) or _str(f.get("abs_path")) or "?", 300),
                function=clip(_str(f.get("function")) or "?", 200),
                lineno=lineno if isinstance(lineno, int) and not isinstance(lineno, bool) else None,
                module=clip(_str(f.get("module")), 200),
                in_app=in_app if isinstance(in_app, bool) else None,
                context_line=clip(_str(f.get("context_line")), 300),
            )
        )
    return tuple(frames), len(raw) > len(kept)


def event_report(event: Any) -> ErrorReport | None:
    """An event's error, or None when it is not one (no exception, and a level below error)."""
    if not isinstance(event, dict):
        raise Refused(400, "invalid_event", "an event is a JSON object")
    exc = event.get("exception")
    values = exc.get("values") if isinstance(exc, dict) else exc
    values = [v for v in values if isinstance(v, dict)] if isinstance(values, list) else []
    platform = clip(_str(event.get("platform")), 40)
    event_id = clip(_str(event.get("event_id")), 64)
    hint = event.get("fingerprint")
    fingerprint = tuple(clip(p, 200) for p in hint if isinstance(p, str | int))[:20] if isinstance(hint, list) else ()
    if values:
        raised = values[-1]  # Sentry lists a chain oldest first: the last is the one raised
        frames, truncated = _frames(raised.get("stacktrace"))
        return ErrorReport(
            exception_type=clip(_str(raised.get("type")) or "Error", MAX_TYPE_CHARS),
            message=clip(_str(raised.get("value")), MAX_MESSAGE_CHARS),
            frames=frames,
            fingerprint_hint=fingerprint,
            platform=platform,
            event_id=event_id,
            truncated=truncated,
        )
    if _str(event.get("level")) not in ERROR_LEVELS:
        return None
    entry = event.get("logentry")
    message = event.get("message")
    if isinstance(entry, dict):
        text = _str(entry.get("formatted")) or _str(entry.get("message"))
    elif isinstance(message, dict):
        text = _str(message.get("formatted")) or _str(message.get("message"))
    else:
        text = _str(message)
    if not text.strip():
        return None
    frames, truncated = _frames(event.get("stacktrace"))
    return ErrorReport(
        exception_type=clip(_str(event.get("logger")) or "Message", MAX_TYPE_CHARS),
        message=clip(text, MAX_MESSAGE_CHARS),
        frames=frames,
        fingerprint_hint=fingerprint,
        platform=platform,
        event_id=event_id,
        truncated=truncated,
    )
