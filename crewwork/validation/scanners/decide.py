"""The scanners' part of the verdict (pure; crewwork.validation.grading applies it once everything else passed)."""

from __future__ import annotations

from crewwork.models.scan import ScanOutcome


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def scan_decision(scan: ScanOutcome, required: bool) -> tuple[str, str, str] | None:
    """(cause, reason, error signature) when the scanners fail an otherwise passing attempt, else None: a finding the
    policy blocks is `security_finding`; a scanner without evidence is `scan_failed` only when they are required."""
    blocks = [f for f in scan.findings if f.blocking]
    if blocks:
        first = blocks[0]
        return (
            "security_finding",
            f"The change introduces {_plural(len(blocks), 'security finding')} the scanners' policy blocks "
            f"(first: {first.describe()[:300]}).",
            f"security: {first.tool} {first.rule} {first.path}"[:300],
        )
    if required and scan.errors:
        return (
            "scan_failed",
            f"A required scanner gave no evidence: {scan.errors[0][:300]}.",
            f"scan failed: {scan.errors[0]}"[:300],
        )
    return None
