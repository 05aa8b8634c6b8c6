"""Failure fingerprints: a short, stable name for *how* an attempt failed, for the same-cause breaker.

Two attempts that fail the same way (same cause class and the same failing tests, or the same error once the
noise that differs between runs is stripped) get the same fingerprint, even though their assertion messages,
line numbers, temporary paths, object addresses and timings differ. A fingerprint is ``"<cause>:<12 hex>"``,
so a person reading the attempt history still sees the cause.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Protocol


class Failure(Protocol):
    """What a fingerprint is made of (a `crewwork.validation.grading.Verdict` is one)."""

    @property
    def cause(self) -> str: ...
    @property
    def failing_tests(self) -> Sequence[str]: ...
    @property
    def error_signature(self) -> str | None: ...


# Order matters: addresses and paths before bare numbers, or the numbers inside them would be replaced first.
# Every pattern is unambiguous (no overlapping quantifiers): the text comes from code under test.
_HEX_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_LONG_HEX = re.compile(r"\b[0-9a-f]{12,64}\b")
# A run of path components; each repetition starts at a separator, so there is one way to match it.
_PATH = re.compile(r"[\w.@+~-]*(?:[\\/][\w.@+~-]*)+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SPACE = re.compile(r"\s+")


def _basename(match: re.Match[str]) -> str:
    # Workspaces live in per-attempt temporary directories: only the file name is the same across attempts.
    parts = [p for p in re.split(r"[\\/]", match.group(0)) if p]
    return parts[-1] if parts else "/"


MAX_SIGNATURE_CHARS = 200


def normalize_signature(text: str) -> str:
    """An error line with the parts that change between identical failures removed."""
    text = text.strip()[: 8 * MAX_SIGNATURE_CHARS]
    text = _HEX_ADDRESS.sub("<addr>", text)
    text = _UUID.sub("<uuid>", text)
    text = _LONG_HEX.sub("<hash>", text)
    text = _PATH.sub(_basename, text)
    text = _NUMBER.sub("N", text)
    text = _SPACE.sub(" ", text)
    return text.strip().lower()[:MAX_SIGNATURE_CHARS]


def normalize_failing_id(test_id: str) -> str:
    """A test id as fingerprinted: parametrize ids can embed addresses or temp paths, which are stripped."""
    test_id = test_id.strip().replace("\\", "/")
    return _HEX_ADDRESS.sub("<addr>", test_id)


def fingerprint_parts(cause: str, failing_tests: list[str], error_signature: str | None) -> str:
    """The canonical text that is hashed, exposed so people can see what a fingerprint stands for."""
    if failing_tests:
        detail = "\n".join(sorted({normalize_failing_id(t) for t in failing_tests}))
    elif error_signature:
        detail = normalize_signature(error_signature)
    else:
        detail = ""
    return f"{cause}\n{detail}"


def fingerprint(verdict: Failure) -> str:
    """``"<cause>:<12 hex>"``, equal for the same failure across attempts."""
    cause = str(verdict.cause)  # a StrEnum, so this is its value
    canonical = fingerprint_parts(cause, list(verdict.failing_tests), verdict.error_signature)
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]
    return f"{cause}:{digest}"
