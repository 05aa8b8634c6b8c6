"""The named checks a work item's validation declares besides its tests (`validation.checks`, docs/checks.md):
lint, type-check, a second environment's tests, any command. Each runs in its own fresh sandbox on the change's
tree and is graded on its own (crewwork.validation.check_grading); a required one failing fails the attempt."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from crewwork.boundary.paths import ReportPath

MAX_CHECKS = 8
"""Checks one validation may declare (each is a sandbox run per attempt)."""
MAX_CHECK_ARGS = 64
MAX_CHECK_PARALLEL = 4
"""Checks of one attempt that run at once, at most (`validation.check_parallel`)."""
MAX_CHECK_FINDINGS = 20
"""Failing tests or findings one check's result carries (the rest are counted; its report is an artifact)."""

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CheckEnvironment(_Strict):
    """What a check's environment changes of the work item's (`environment`): another interpreter or another
    dependency set. Image, network and secrets stay the repository's."""

    python: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Interpreter this check's venv is created from, as seen inside the sandbox (e.g. "
        "`/usr/bin/python3.11`). None: the work item's.",
    )
    setup: list[list[str]] | None = Field(
        default=None,
        max_length=32,
        description="Setup commands of this check's environment, instead of the work item environment's (None: "
        "those). `validation.setup` still runs after them.",
    )

    @field_validator("setup")
    @classmethod
    def _commands(cls, v: list[list[str]] | None) -> list[list[str]] | None:
        for i, argv in enumerate(v or []):
            if not argv or not argv[0].strip() or any("\x00" in a for a in argv):
                raise ValueError(f"setup[{i}] must name a program and hold no NUL byte")
            if len(argv) > MAX_CHECK_ARGS:
                raise ValueError(f"setup[{i}] has more than {MAX_CHECK_ARGS} arguments")
        return v


class CheckSpec(_Strict):
    """One named check: a command run at the workspace root of the change's tree, in a fresh sandbox."""

    name: str = Field(description="Short name shown with its result (`[a-z][a-z0-9_-]*`, at most 32 characters).")
    command: list[str] = Field(min_length=1, max_length=MAX_CHECK_ARGS, description="argv of the check.")
    report: Literal["exit", "junit", "sarif"] = Field(
        default="exit",
        description="What decides: `exit` (exit code 0 passes), `junit` (a JUnit XML report at `report_path`, "
        "checked against the exit code like the tests), `sarif` (a SARIF 2.1.0 log at `report_path`: any result of "
        "level `error` fails it).",
    )
    report_path: ReportPath | None = Field(
        default=None,
        description="Workspace-relative path of the report the command writes (junit and sarif); usually under "
        "`.crewwork/`. Whatever the change puts there is removed before the run.",
    )
    required: bool = Field(default=True, description="A failing required check fails the attempt; others are shown.")
    timeout_s: float | None = Field(
        default=None, gt=0, le=3600, description="Wall-clock limit of the run (None: `validation.timeout_s`)."
    )
    environment: CheckEnvironment | None = Field(
        default=None, description="Another interpreter or dependency set for this check (None: the work item's)."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v) or v == "tests":
            raise ValueError("check name must match [a-z][a-z0-9_-]{0,31} and not be `tests` (the validation command)")
        return v

    @field_validator("command")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        if not v[0].strip() or any("\x00" in a for a in v) or any(ord(c) < 0x20 for c in v[0]):
            raise ValueError("command[0] must name a program, and no argument may contain a NUL byte")
        return v

    @model_validator(mode="after")
    def _report_path(self) -> CheckSpec:
        if self.report != "exit" and self.report_path is None:
            raise ValueError(f"check {self.name}: report `{self.report}` needs a report_path")
        if self.report == "exit" and self.report_path is not None:
            raise ValueError(f"check {self.name}: report_path is read only with report `junit` or `sarif`")
        return self
