"""What an error report is once read, whatever sent it, and how repeats of one error are recognised.

The fingerprint is the report's own when it gives one (Sentry's `fingerprint`, where `{{ default }}` stands for
the default), else the exception's type and its top frames, each normalised (crewwork/validation/fingerprint.py's
rules: addresses, ids, paths and numbers removed) and without line numbers, so an edit elsewhere in the file, a
different value in the message, or another process's addresses do not make another error of the same one.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from dataclasses import dataclass

from crewwork.validation.fingerprint import normalize_signature

TOP_FRAMES = 5
"""Frames (innermost first, the app's own when any are marked so) that name an error beside its type."""
MAX_TYPE_CHARS = 200
MAX_MESSAGE_CHARS = 2_000
MAX_TRACE_CHARS = 12_000
MAX_FRAMES = 50
"""Frames of a trace kept (the innermost); the rest are dropped and the trace says so."""
MAX_FINGERPRINT_PARTS = 20


_AT = re.compile(r"^[ \t]*at ([^\n]{1,300})$", re.M)
_LOCATION = re.compile(r"[:(]\s*[^:()]*:\d+(?::\d+)?\)?\s*$|\([^()]*\)\s*$")
"""A frame's location (file, line, column) at the end of an `at ...` line: it changes with every edit."""
_PY_FRAME = re.compile(r'^[ \t]*File "([^"\n]{1,300})", line (\d{1,9}), in ([^\n]{1,200})$', re.M)


def python_frames(trace: str) -> tuple[Frame, ...]:
    """The frames of a Python traceback written as text (OpenTelemetry's `exception.stacktrace`), innermost last."""
    found = list(_PY_FRAME.finditer(trace[: 4 * MAX_TRACE_CHARS]))[-MAX_FRAMES:]
    frames = []
    for m in found:
        rest = trace[m.end() : m.end() + 400].split("\n", 2)
        # The code line Python prints under a frame is indented deeper than the frame (4 spaces to its 2).
        code = rest[1].strip() if len(rest) > 1 and rest[1].startswith("    ") else ""
        path = m.group(1)
        frames.append(
            Frame(
                filename=_clip(path, 300),
                function=_clip(m.group(3).strip(), 200),
                lineno=int(m.group(2)),
                in_app=not (path.startswith("<") or "site-packages" in path or "/lib/python" in path),
                context_line=_clip(code, 300),
            )
        )
    return tuple(frames)


class Refused(ValueError):
    """A request the intake refuses: an HTTP status, a stable code and a message for the sender."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass(frozen=True)
class Frame:
    filename: str
    function: str
    lineno: int | None = None
    module: str = ""
    in_app: bool | None = None
    context_line: str = ""


@dataclass(frozen=True)
class ErrorReport:
    """One error event, bounded and without NUL: what the store keeps of it and what an agent reads."""

    exception_type: str
    message: str
    frames: tuple[Frame, ...] = ()
    """Innermost last, as Python prints them."""
    fingerprint_hint: tuple[str, ...] = ()
    platform: str = ""
    event_id: str = ""
    truncated: bool = False
    raw_trace: str = ""
    """The stack trace as the sender wrote it, when it came as text in no language read into `frames`."""

    @property
    def title(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return _clip(f"{self.exception_type}: {first}" if first else self.exception_type, 300)

    def trace(self) -> str:
        """The stack trace as Python would print it (files as the sender named them; the app's own relative)."""
        if self.raw_trace and not self.frames:
            return _clip(self.raw_trace, MAX_TRACE_CHARS)
        lines = ["Traceback (most recent call last):"]
        if self.truncated:
            lines.append("  (outer frames cut)")
        for f in self.frames:
            where = f'  File "{f.filename}", line {f.lineno if f.lineno is not None else "?"}, in {f.function}'
            lines.append(where)
            if f.context_line.strip():
                lines.append(f"    {f.context_line.strip()}")
        lines.append(f"{self.exception_type}: {self.message}" if self.message else self.exception_type)
        return _clip("\n".join(lines), MAX_TRACE_CHARS)

    def default_parts(self) -> list[str]:
        frames = [f for f in self.frames if f.in_app] or list(self.frames)
        top = frames[-TOP_FRAMES:]
        parts = [normalize_signature(self.exception_type) or "error"]
        for f in reversed(top):
            place = f.module or f.filename.replace("\\", "/").rsplit("/", 1)[-1]
            parts.append(f"{normalize_signature(place)}:{normalize_signature(f.function)}")
        if not top and self.raw_trace:  # a trace in another language: its first `at ...` lines (Java, JS, .NET)
            ats = [m.group(1) for m in _AT.finditer(self.raw_trace[:MAX_TRACE_CHARS])][:TOP_FRAMES]
            parts += [normalize_signature(_LOCATION.sub("", a)) for a in ats]
            top = ats  # type: ignore[assignment]
        if not top:  # a message without a trace: the message is all there is to tell errors apart
            parts.append(normalize_signature(self.message))
        return parts

    def fingerprint(self) -> str:
        """32 hex digits, equal for repeats of one error (the module's docstring)."""
        if self.fingerprint_hint:
            parts: list[str] = []
            for p in self.fingerprint_hint[:MAX_FINGERPRINT_PARTS]:
                parts += self.default_parts() if p in ("{{ default }}", "{{default}}") else [f"={p[:200]}"]
        else:
            parts = self.default_parts()
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _clip(text: str, limit: int) -> str:
    text = text.replace("\x00", "")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clip(text: object, limit: int) -> str:
    return _clip(text if isinstance(text, str) else "" if text is None else str(text), limit)


def decompressed(body: bytes, encoding: str, limit: int) -> bytes:
    """`body` decoded per its `Content-Encoding` (identity, gzip, deflate), never more than `limit` bytes of
    output: a small body that would inflate past it (a zip bomb) is refused once `limit + 1` bytes have come out,
    having used no more memory than that."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        if len(body) > limit:
            raise Refused(413, "payload_too_large", f"an error report is at most {limit} bytes")
        return body
    if encoding in ("gzip", "x-gzip"):
        return _inflate(body, 16 + zlib.MAX_WBITS, limit)
    if encoding == "deflate":
        try:  # RFC 9110's deflate is zlib-wrapped; some senders send it raw
            return _inflate(body, zlib.MAX_WBITS, limit)
        except Refused as exc:
            if exc.code != "invalid_encoding":
                raise
            return _inflate(body, -zlib.MAX_WBITS, limit)
    raise Refused(
        415,
        "unsupported_encoding",
        f"Content-Encoding {encoding[:40]!r} is not accepted: send identity, gzip or deflate (a Sentry SDK with "
        "brotli installed: set _experiments={'transport_compression_algo': 'gzip'})",
    )


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise Refused(400, "invalid_encoding", f"the body is not valid per its Content-Encoding: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise Refused(413, "payload_too_large", f"an error report is at most {limit} bytes once decompressed")
    if not d.eof:
        raise Refused(400, "invalid_encoding", "the compressed body ends before its end")
    return out
