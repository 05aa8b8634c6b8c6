"""The source-parse worker: a child process that parses one file at a time with tree-sitter (crewwork.codeintel.tags)
for a process that must not parse untrusted source itself (the API, an agent pool: crewwork.codeintel.parsepool).

Started as `python -m crewwork.codeintel.parseworker` under the parse profile's memory bound
(crewwork.boundary.hostproc), it reads requests from stdin and answers on stdout, one frame each way per file:

    request   8-byte big-endian length, then a JSON header line {"path", "max_depth", "max_line_chars"}, then the
              file's bytes (the length covers both)
    answer    8-byte big-endian length, then JSON: {"tags": FileTags} | {"none": true} (no language crewwork indexes)
              | {"refused": why, "detail": text} (`too_deep`, `line_too_long`, `parse_failed`, `memory`)

Before tree-sitter sees a file, `precheck` refuses what is known to make its error recovery run for many seconds
(80,000 unclosed brackets parsed for ~29 s): brackets nested deeper than `max_depth` (counted with a stack, so
mismatched closers do not hide depth) or a line longer than `max_line_chars`. Anything else slow is the parent's
per-file wall clock to stop; anything that grows is the memory bound's. The worker ends at end of input.
"""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import asdict
from typing import BinaryIO

_LEN = struct.Struct(">Q")
MAX_FRAME_BYTES = 64 * 1024 * 1024

_OPENERS = {ord("("): ord(")"), ord("["): ord("]"), ord("{"): ord("}")}
_CLOSERS = frozenset(_OPENERS.values())
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _OPENERS and b not in _CLOSERS)


def bracket_depth(source: bytes) -> int:
    """The deepest nesting of (), [] and {} in `source`, as a parser recovering from errors would see it: a closer
    that does not match the innermost opener closes nothing (so `(]` repeated nests without end). Brackets in strings
    and comments count too (a bound, not a parse: a file that only looks deep is refused, never mis-parsed)."""
    stack: list[int] = []
    deepest = 0
    for b in source.translate(None, _NOT_BRACKETS):
        closer = _OPENERS.get(b)
        if closer is not None:
            stack.append(closer)
            if len(stack) > deepest:
                deepest = len(stack)
        elif stack and stack[-1] == b:
            stack.pop()
    return deepest


def precheck(source: bytes, *, max_depth: int, max_line_chars: int) -> tuple[str, str] | None:
    """(reason, detail) when `source` is refused before parsing, else None."""
    longest = max((len(line) for line in source.split(b"\n")), default=0)
    if longest > max_line_chars:
        return "line_too_long", f"a line of {longest} bytes, more than {max_line_chars}"
    depth = bracket_depth(source)
    if depth > max_depth:
        return "too_deep", f"brackets nested {depth} deep, more than {max_depth}"
    return None


def answer(header: dict[str, object], source: bytes) -> dict[str, object]:
    from crewwork.codeintel.tags import extract

    path = str(header.get("path", ""))
    refused = precheck(
        source,
        max_depth=int(header.get("max_depth", 256)),  # type: ignore[call-overload]
        max_line_chars=int(header.get("max_line_chars", 65536)),  # type: ignore[call-overload]
    )
    if refused is not None:
        return {"refused": refused[0], "detail": refused[1]}
    try:
        tags = extract(path, source)
    except MemoryError:
        return {"refused": "memory", "detail": "the parse needed more than the worker's memory bound"}
    except Exception as exc:  # a grammar that chokes on one file loses that file, never the index
        return {"refused": "parse_failed", "detail": type(exc).__name__}
    return {"none": True} if tags is None else {"tags": asdict(tags)}


def _read(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    while True:
        head = _read(inp, _LEN.size)
        if head is None:
            return
        (size,) = _LEN.unpack(head)
        if size > MAX_FRAME_BYTES:
            return
        frame = _read(inp, size)
        if frame is None:
            return
        line, _, source = frame.partition(b"\n")
        try:
            reply = answer(json.loads(line), source)
        except MemoryError:
            reply = {"refused": "memory", "detail": "the parse needed more than the worker's memory bound"}
        body = json.dumps(reply, separators=(",", ":")).encode()
        out.write(_LEN.pack(len(body)) + body)
        out.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
