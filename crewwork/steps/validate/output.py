"""How much of a validation run's output the evidence carries, and how it was cut."""

from __future__ import annotations

from crewwork.models import EvidenceCut

TAIL_BYTES = 8000
"""Bytes of the test command's stdout and stderr the evidence carries (the whole log is an artifact)."""


def stdout_cut(stdout: bytes, captured_truncated: bool, tail_bytes: int, max_log_bytes: int) -> EvidenceCut | None:
    """How the evidence's stdout tail was cut from what the command wrote, or None when it holds all of it. Whether
    the cut decides is the terminal parser's to say (crewwork.validation.parsers)."""
    if not captured_truncated and len(stdout) <= tail_bytes:
        return None
    return EvidenceCut(
        what="the test command's stdout",
        bound="the evidence's stdout tail"
        if not captured_truncated
        else "the sandbox's max_log_bytes (8 MiB) and the tail",
        limit=tail_bytes,
        unit="bytes",
        seen=None if captured_truncated else len(stdout),
        kept=min(len(stdout), tail_bytes),
        decisive=False,
        why=f"the last {tail_bytes} bytes are kept (the sandbox keeps the first and last {max_log_bytes // 2} bytes "
        "of a longer output)",
    )
