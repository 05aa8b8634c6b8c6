"""Validation: pure parsing and judging of the evidence a validation run left behind.

Activities gather evidence; everything here is a pure function over it, so an attempt can be re-graded later
without re-running it. `grade` decides, `fingerprint` names the failure for the breaker, `build_diagnostics`
writes the packet for the next attempt, and `PARSERS` is the registry of test-report parsers.
"""

from crewwork.validation.diagnostics import build_diagnostics
from crewwork.validation.evidence import ValidationEvidence
from crewwork.validation.fingerprint import fingerprint
from crewwork.validation.grading import Cause, Verdict, grade
from crewwork.validation.parsers import PARSERS, ParsedReport, parse_report

__all__ = [
    "PARSERS",
    "Cause",
    "ParsedReport",
    "ValidationEvidence",
    "Verdict",
    "build_diagnostics",
    "fingerprint",
    "grade",
    "parse_report",
]
