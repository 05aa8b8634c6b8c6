"""Masking of secret-looking strings, applied when a record is *written* (events are append-only: a secret that
reached the log could never be taken out again)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

SECRET_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
    re.compile(r"\bcw_[A-Za-z0-9_-]{16,}"),
    re.compile(r"(?i)((?:api[_-]?key|password|secret|token)\"?\s*[:=]\s*\"?)[^\s\",}]{6,}"),
    # A PEM private key (an evidence signing key, an SSH key), to its END line or the end of the text.
    re.compile(r"(-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----)[\s\S]*?(?:-----END [A-Z0-9 ]{0,40}PRIVATE KEY-----|$)"),
)


def mask_secrets(value: Any) -> Any:
    """`value` with every secret-looking substring of every string in it replaced by `***` (dicts and lists are
    walked; other values are returned as they are)."""
    if isinstance(value, str):
        out = value
        for pat in SECRET_PATTERNS:
            out = pat.sub(lambda m: (m.group(1) if m.groups() else "") + "***", out)
        return out
    if isinstance(value, dict):
        return {k: mask_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_secrets(v) for v in value]
    return value


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


MAX_NESTING = 64
"""How deep a client's JSON may nest (a submission's `input`, an agent's `config`): pydantic's serializer gives up
at a few hundred levels, which made a deeper submission a server error; 64 is far beyond any real input."""


def too_deep_at(value: Any, limit: int = MAX_NESTING, path: str = "") -> str | None:
    """Where `value` (JSON-like, or a pydantic model) nests deeper than `limit` containers, or None. Iterative: a
    recursion of its own would fail on the very input it is there to refuse."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        v, here, depth = stack.pop()
        if isinstance(v, BaseModel):
            v = v.__dict__
        if isinstance(v, dict):
            items: Any = v.items()
        elif isinstance(v, list | tuple):
            items = enumerate(v)
        else:
            continue
        if depth >= limit:
            return without_nul(here)
        for k, child in items:
            stack.append((child, f"{here}.{k}" if here else str(k), depth + 1))
    return None


def unstorable_at(value: Any, path: str = "") -> str | None:
    """Where in `value` (JSON-like, or a pydantic model) the first string holding a character no store column can keep is (NUL, a lone
    surrogate; see `without_nul`), as a dotted path ("labels.team", "validation.command.2"), or None. A submission is
    refused with it rather than stored altered: what the tenant asked for is not silently changed."""
    if isinstance(value, str):
        return path if _UNSTORABLE.search(value) else None
    if isinstance(value, BaseModel):
        # The model's own values: a JSON-mode dump replaces a lone surrogate in a dict key by U+FFFD, hiding it.
        value = value.__dict__
    if isinstance(value, dict):
        for k, v in value.items():
            here = f"{path}.{k}" if path else str(k)
            if isinstance(k, str) and _UNSTORABLE.search(k):
                return without_nul(here)
            found = unstorable_at(v, here)
            if found is not None:
                return without_nul(found)
        return None
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            found = unstorable_at(v, f"{path}.{i}" if path else str(i))
            if found is not None:
                return found
    return None


def without_nul(value: Any) -> Any:
    """`value` with every NUL character and every lone surrogate of every string in it (dict keys included) replaced
    by U+FFFD. PostgreSQL can store no NUL in a text column nor in `jsonb` (only in `json`), no text column can hold a
    surrogate (it is not UTF-8), and `jsonb` refuses one; what reaches a record is often untrusted (a test's failure
    message, an agent's claim, a review comment, a file name of non-UTF-8 bytes decoded with `surrogateescape`):
    written as it came, such a character failed the write, and with it the attempt, every time it was retried."""
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value) if _UNSTORABLE.search(value) else value
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_nul(v) for v in value]
    return value
