"""Content-defined chunks of artifact content: what makes repeated content (the same log prefix, the same diff) stored
once (crewwork/store/retention.py).

An artifact is cut into chunks at boundaries chosen by the content itself, so that two artifacts that share a run of
bytes (attempt 2's validation log repeating attempt 1's setup output and test header; the same diff recorded by two
items) share the chunks inside that run, wherever it sits. Text (logs, diffs, reports, transcripts) is cut at line
ends: a line whose CRC-32 is 0 modulo `MASK + 1` ends a chunk once the chunk holds `MIN_CHUNK` bytes; a chunk is cut
anyway at `MAX_CHUNK`. Lines are found and hashed by C code (`bytes.split`, `zlib.crc32`), so cutting 16 MiB costs
tens of milliseconds. Each chunk is zlib-compressed where that saves at least an eighth.

Pure functions of the bytes: the same content always gives the same chunks, on any host, in any release that keeps
these constants (a change of them only costs sharing between old and new chunks, never correctness: an artifact
lists its own chunks).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

MIN_CHUNK = 8 * 1024
"""No chunk boundary before this many bytes (the last chunk of an artifact may be shorter). Smaller chunks share more
but each costs a row of `artifact_parts` (~100 bytes with its index entries): with 2 KiB the parts of a real
project's logs outweighed what sharing saved (bench/storage.py)."""
MAX_CHUNK = 64 * 1024
"""A chunk is cut here whatever the content (a very long line, binary data)."""
MASK = 0xF  # about one line in 16 past MIN_CHUNK ends a chunk
ZLIB_LEVEL = 6


@dataclass(frozen=True, slots=True)
class Chunk:
    sha256: str
    size: int
    """Bytes before encoding."""
    encoding: str
    """`raw` or `zlib`."""
    stored: bytes
    """The bytes as stored (compressed when `encoding` is `zlib`)."""


def cut(data: bytes) -> Iterator[bytes]:
    """The chunks of `data`, in order; their concatenation is `data`."""
    start = 0
    pos = 0
    n = len(data)
    for line in data.split(b"\n"):
        end = min(pos + len(line) + 1, n)  # the line and its newline (the last line may have none)
        while end - start > MAX_CHUNK:
            yield data[start : start + MAX_CHUNK]
            start += MAX_CHUNK
        pos = end
        if end - start >= MIN_CHUNK and (zlib.crc32(line) & MASK) == 0:
            yield data[start:end]
            start = end
    if start < n:
        yield data[start:]


def encode(piece: bytes) -> Chunk:
    """A chunk as stored: its digest, and its bytes compressed when that saves at least an eighth."""
    digest = hashlib.sha256(piece).hexdigest()
    packed = zlib.compress(piece, ZLIB_LEVEL)
    if len(packed) <= len(piece) - len(piece) // 8:
        return Chunk(digest, len(piece), "zlib", packed)
    return Chunk(digest, len(piece), "raw", piece)


def decode(encoding: str, stored: bytes, size: int) -> bytes:
    """A chunk's bytes from what is stored (checked against its recorded size)."""
    if encoding == "zlib":
        out = zlib.decompress(stored)
    elif encoding == "raw":
        out = bytes(stored)
    else:
        raise ValueError(f"unknown chunk encoding {encoding!r}")
    if len(out) != size:
        raise ValueError(f"chunk decodes to {len(out)} bytes, not the {size} recorded")
    return out
