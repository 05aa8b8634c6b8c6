"""Security scanners a work item asks for (`validation.scanners`) and what they found that the change introduces.

The scanners run in the validation sandbox with no network, before the tests (crewwork/validation/scanners); a
finding is evidence, shown on the diff's lines, and it blocks the attempt only where the policy here says so. A
scanner that could not give its evidence (it crashed, timed out, its SARIF was too large or malformed) fails the
attempt only when `required` is set. docs/scanners.md has the rules.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from crewwork.boundary.paths import ReportPath

MAX_CUSTOM_SCANNERS = 4
MAX_SCANNER_ARGS = 64
MAX_SHOWN_FINDINGS = 200
"""Findings an outcome carries (blocking ones first); the SARIF artifact holds them all, up to its own bound."""

Policy = Literal["block", "flag", "off"]
Severity = Literal["low", "medium", "high"]
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class CustomScanner(_Strict):
    """A team's own scanner: a command run in the sandbox (no network) that writes SARIF 2.1.0 to `sarif_path`."""

    name: str = Field(description="Short name shown with its findings (`[a-z][a-z0-9_-]*`, at most 32 characters).")
    command: list[str] = Field(
        min_length=1, max_length=MAX_SCANNER_ARGS, description="argv, run at the workspace root."
    )
    sarif_path: ReportPath = Field(description="Workspace-relative path of the SARIF log the command writes.")
    on_finding: Literal["block", "flag"] = Field(
        default="flag", description="`block`: an introduced result of level `error` fails the attempt."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v) or v in ("secrets", "bandit", "dependencies"):
            raise ValueError("scanner name must match [a-z][a-z0-9_-]{0,31} and not be a built-in's")
        return v

    @field_validator("command")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        if not v[0].strip() or any("\x00" in a for a in v):
            raise ValueError("command[0] must name a program, and no argument may contain a NUL byte")
        return v


class ScannersSpec(_Strict):
    """Which scanners run and what their findings do. Present (even `{}`) turns the built-ins on with these
    defaults; absent, no scanner runs (today's items are unchanged)."""

    secrets: Policy = Field(
        default="block", description="Secrets the change adds (detect-secrets): `block` fails the attempt."
    )
    python: Policy = Field(
        default="block",
        description="Python static analysis of the changed files (Bandit): `block` fails the attempt on a finding "
        "of at least `python_block_severity`; lower ones are flagged.",
    )
    python_block_severity: Severity = Field(default="high", description="Lowest Bandit severity that blocks.")
    dependencies: Policy = Field(
        default="flag",
        description="New or changed requirements (requirements*.txt, pyproject.toml, setup.cfg, setup.py, "
        "Pipfile): flagged for the reviewer with the package and version; `block` fails the attempt.",
    )
    custom: list[CustomScanner] = Field(
        default_factory=list, max_length=MAX_CUSTOM_SCANNERS, description="SARIF-emitting scanners of your own."
    )
    required: bool = Field(
        default=False,
        description="A scanner that gives no evidence (crashed, timed out, SARIF refused or cut) fails the attempt "
        "(cause `scan_failed`). Off: it is shown and the reviewer decides.",
    )
    timeout_s: float = Field(default=300.0, gt=0, le=1800, description="Wall-clock limit of one scanner run.")


class ScanFinding(BaseModel):
    """One result a scanner reports on a line the change introduces."""

    model_config = ConfigDict(frozen=True)

    tool: str = Field(description="`secrets`, `bandit`, `dependencies` or a custom scanner's name.")
    rule: str = Field(description="The scanner's rule id (B602, AWS Access Key, dependency-added ...).")
    level: str = Field(description="SARIF level: error, warning or note.")
    severity: str | None = Field(default=None, description="Bandit's severity (low, medium, high), if any.")
    path: str
    line: int = Field(description="1-based line in the changed file (0: the file as a whole).")
    message: str
    blocking: bool = Field(default=False, description="The policy makes this finding fail the attempt.")

    def describe(self) -> str:
        return (
            f"{self.path}:{self.line}: {self.tool} {self.rule}"
            + (" [blocks]" if self.blocking else "")
            + (f": {self.message}" if self.message else "")
        )


class ScanOutcome(BaseModel):
    """What the scanners found that the change introduces (and what they could not tell)."""

    model_config = ConfigDict(frozen=True)

    findings: list[ScanFinding] = Field(
        default_factory=list, description=f"Introduced findings, blocking first, at most {MAX_SHOWN_FINDINGS}."
    )
    total: int = Field(default=0, description="Introduced findings in all.")
    preexisting: int = Field(default=0, description="Findings in the changed files that were already at the base.")
    errors: list[str] = Field(default_factory=list, description="Scanners that gave no evidence, and why.")
    tools: list[str] = Field(default_factory=list, description="The scanners that ran.")
