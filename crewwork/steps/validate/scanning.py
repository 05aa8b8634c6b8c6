"""The scanner stage of one validation: the built-in scanners before the tests, a team's own SARIF scanners after
them, and the findings the change introduces, as evidence (crewwork/steps/validate/activity.py calls it; the
decision stays in crewwork.validation.grading).

Built-ins (detect-secrets, Bandit) run in a fresh run of the validation sandbox (no network, read-only kit mount,
the sandbox's own Python, an empty environment), before the test command, on the files the change touched as the
tests will see them and on the same files at the base commit (written by the host under `.crewwork/scan/base/`,
removed again before the tests run). A result is *introduced* when no result of the same tool, rule, path and
fingerprint (the secret's hash; Bandit's rule and the whitespace-normalised line) was at the base, counted as a
multiset (a second copy of an existing `eval` is new). Results of a team's own scanner (a command that writes
SARIF) are introduced when they sit on a line the diff adds. Dependency changes come from the diff text
(crewwork.validation.scanners.requirements).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from crewwork.boundary import safefs
from crewwork.models import ArtifactRef, EvidenceCut
from crewwork.models.scan import MAX_SHOWN_FINDINGS, ScanFinding, ScannersSpec, ScanOutcome
from crewwork.sandbox.base import Mount, Sandbox, SandboxLimits
from crewwork.steps.execution import read_report_bounded
from crewwork.steps.validate.scankit import RUNNER, KitUnavailable, kit_mount
from crewwork.validation.scanners import sarif
from crewwork.validation.scanners.findings import added_lines, blocking, introduced
from crewwork.validation.scanners.requirements import dependency_changes
from crewwork.workspace.gitops import Tree
from crewwork.workspace.tree import Workspace, WorkspaceError, gitops

SCAN_DIR = f"{gitops.PLATFORM_DIR}/scan"
"""The workspace directory the built-ins work in: the base copies, the manifest, the SARIF log (removed after)."""
MAX_SCAN_FILES = 2_000
"""Changed files the built-ins scan (more: the rest are not scanned, a decisive cut when a finding would block)."""
MAX_RUNNER_RESULTS = 2_000
"""Results the built-in runner writes per tool (more: it says how many it dropped, a cut), so its log stays well
inside MAX_SARIF_BYTES."""
MAX_LOGGED_RESULTS = 5_000
"""Results the evidence log keeps (introduced ones first)."""
_REGULAR = ("100644", "100755")

Save = Callable[[str, bytes, str], Awaitable[ArtifactRef]]


@dataclass
class ScanStage:
    """One validation's scanners; `before_tests`, then `after_tests`, then `outcome()`."""

    spec: ScannersSpec
    sandbox: Sandbox
    limits: SandboxLimits
    ws: Workspace
    base: Tree
    final: Tree
    diff: bytes
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    rows: list[tuple[sarif.Result, bool, bool]] = field(default_factory=list)
    """(result, introduced, blocking) of everything seen, for the evidence log."""
    errors: list[str] = field(default_factory=list)
    cuts: list[EvidenceCut] = field(default_factory=list)
    tools: dict[str, str | None] = field(default_factory=dict)

    @property
    def run_limits(self) -> SandboxLimits:
        return dataclasses.replace(self.limits, timeout_s=self.spec.timeout_s)

    def _cut(self, what: str, bound: str, limit: int, seen: int | None, kept: int, decides: bool, why: str) -> None:
        self.cuts.append(
            EvidenceCut(
                what=what, bound=bound, limit=limit, unit="items", seen=seen, kept=kept, decisive=decides, why=why
            )
        )

    def _add(self, results: list[tuple[sarif.Result, bool]]) -> None:
        for res, new in results:
            self.rows.append((res, new, new and blocking(res, self.spec)))

    async def before_tests(self) -> None:
        """The built-ins, in the sandbox, on the changed files after and at the base; and the dependency diff."""
        spec = self.spec
        if spec.dependencies != "off":
            self.tools["dependencies"] = None
            changes, total = await asyncio.to_thread(dependency_changes, self.diff)
            self._add(
                [
                    (
                        sarif.Result(
                            tool="dependencies",
                            rule=c.rule,
                            level="note",
                            path=c.path,
                            line=c.line,
                            message=c.message(),
                            fingerprint=f"{c.name}:{c.spec}",
                        ),
                        True,
                    )
                    for c in changes
                ]
            )
            if total > len(changes):
                self._cut(
                    "dependency changes",
                    "MAX_DEPENDENCY_FINDINGS",
                    len(changes),
                    total,
                    len(changes),
                    spec.dependencies == "block",
                    "only the first ones are listed",
                )
        tools = [t for t, policy in (("secrets", spec.secrets), ("bandit", spec.python)) if policy != "off"]
        if not tools:
            return
        for t in tools:
            self.tools[t] = None
        changed = sorted(
            p
            for p, e in self.final.items()
            if e.mode in _REGULAR and self.base.get(p) != e and not p.startswith(gitops.PLATFORM_DIR.encode() + b"/")
        )
        if not changed:
            return
        if len(changed) > MAX_SCAN_FILES:
            self._cut(
                "changed files scanned",
                "MAX_SCAN_FILES",
                MAX_SCAN_FILES,
                len(changed),
                MAX_SCAN_FILES,
                spec.secrets == "block" or spec.python == "block",
                "the built-in scanners read only the first changed files",
            )
            changed = changed[:MAX_SCAN_FILES]
        in_base = [p for p in changed if p in self.base and self.base[p].mode in _REGULAR]
        try:
            mount = await asyncio.to_thread(kit_mount, self.data_dir)
        except KitUnavailable as exc:
            self.errors.append(f"built-in scanners: {exc}")
            return
        shown = [p.decode("utf-8", "surrogateescape") for p in changed]
        manifest = {
            "after": shown,
            "base_root": f"{SCAN_DIR}/base",
            "base": [p.decode("utf-8", "surrogateescape") for p in in_base],
            "tools": tools,
            "out": f"{SCAN_DIR}/out.sarif",
            "max_results": MAX_RUNNER_RESULTS,
        }
        try:
            self.ws.make_dir(SCAN_DIR)
            await self.ws.write_entries({f"{SCAN_DIR}/base/".encode() + p: self.base[p] for p in in_base})
            root = safefs.open_root(self.ws.path)
            try:
                fd = safefs.create_file(root, f"{SCAN_DIR}/manifest.json", owner=self.ws.owner)
                with safefs.opened(fd):
                    text = json.dumps(manifest, ensure_ascii=False).encode("utf-8", "surrogateescape")
                    view = memoryview(text)
                    while view:
                        view = view[os.write(fd, view) :]
            finally:
                os.close(root)
            argv = ["python3", "-I", f"{self.sandbox.inside(mount)}/{RUNNER}", f"{SCAN_DIR}/manifest.json"]
            run = await self.sandbox.run(argv, workspace=self.ws.path, limits=self.run_limits, env={}, mounts=[mount])
            if run.timed_out or run.exit_code != 0:
                why = "timed out" if run.timed_out else f"exited {run.exit_code}"
                tail = run.stderr[-600:].decode("utf-8", "replace").strip()
                self.errors.append(f"built-in scanners {why}" + (f": {tail}" if tail else ""))
                return
            data, refused, cut = await asyncio.to_thread(
                read_report_bounded,
                self.ws.path,
                f"{SCAN_DIR}/out.sarif",
                sarif.MAX_SARIF_BYTES,
                bound="MAX_SARIF_BYTES",
            )
        except (WorkspaceError, OSError, safefs.Refused) as exc:
            self.errors.append(f"built-in scanners: the host could not prepare or read the scan: {exc}")
            return
        finally:
            root = safefs.open_root(self.ws.path)
            try:
                safefs.remove(root, SCAN_DIR)
            finally:
                os.close(root)
        blocks = spec.secrets == "block" or spec.python == "block"
        if cut is not None:
            self.cuts.append(cut.model_copy(update={"what": "the built-in scanners' SARIF log", "decisive": blocks}))
            return
        if data is None:
            self.errors.append(f"built-in scanners left no SARIF log{f' ({refused})' if refused else ''}")
            return
        parsed = await asyncio.to_thread(sarif.parse, data, default_tool="built-in scanners")
        self.errors.extend(parsed.errors)
        if parsed.truncated:
            self._cut(
                "the built-in scanners' results",
                "MAX_RESULTS",
                sarif.MAX_RESULTS,
                None,
                len(parsed.results),
                blocks,
                "results past the bound were not read",
            )
        self._add(
            introduced(
                [r for r in parsed.results if r.tree == "after"], [r for r in parsed.results if r.tree == "base"]
            )
        )

    async def after_tests(self) -> None:
        """A team's own scanners, each a command writing SARIF, in the same workspace after the test command: their
        results on lines the diff adds are introduced."""
        if not self.spec.custom:
            return
        lines = await asyncio.to_thread(added_lines, self.diff)
        roots = (self.sandbox.workspace_inside(self.ws.path), str(self.ws.path.resolve()))
        for c in self.spec.custom:
            self.tools[c.name] = None
            root = safefs.open_root(self.ws.path)
            try:
                safefs.remove(root, str(c.sarif_path))  # whatever the tests left there is not the scanner's
                if len(c.sarif_path.parts) > 1:
                    safefs.make_dirs(root, "/".join(c.sarif_path.parts[:-1]), owner=self.ws.owner)
            except (OSError, safefs.Refused) as exc:
                self.errors.append(f"{c.name}: the host could not clear {c.sarif_path}: {exc}")
                continue
            finally:
                os.close(root)
            run = await self.sandbox.run(
                c.command, workspace=self.ws.path, limits=self.run_limits, env=self.env, mounts=self.mounts
            )
            if run.timed_out or run.command_not_found:
                self.errors.append(f"{c.name}: {'timed out' if run.timed_out else 'command not found'}")
                continue
            data, refused, cut = await asyncio.to_thread(
                read_report_bounded, self.ws.path, str(c.sarif_path), sarif.MAX_SARIF_BYTES, bound="MAX_SARIF_BYTES"
            )
            if cut is not None:
                self.cuts.append(
                    cut.model_copy(update={"what": f"{c.name}'s SARIF log", "decisive": c.on_finding == "block"})
                )
                continue
            if data is None:
                self.errors.append(
                    f"{c.name}: exited {run.exit_code} and left no SARIF log at {c.sarif_path}"
                    + (f" ({refused})" if refused else "")
                )
                continue
            parsed = await asyncio.to_thread(sarif.parse, data, default_tool=c.name, roots=roots)
            self.errors.extend(parsed.errors)
            if parsed.truncated:
                self._cut(
                    f"{c.name}'s results",
                    "MAX_RESULTS",
                    sarif.MAX_RESULTS,
                    None,
                    len(parsed.results),
                    c.on_finding == "block",
                    "results past the bound were not read",
                )
            # Reported under the scanner's own name, whatever its driver calls itself.
            own = [dataclasses.replace(r, tool=c.name) for r in parsed.results]
            self._add([(r, r.line in lines.get(r.path, ())) for r in own])

    def outcome(self) -> ScanOutcome:
        new = [(r, b) for r, n, b in self.rows if n]
        new.sort(key=lambda rb: (not rb[1], rb[0].path, rb[0].line, rb[0].tool))
        findings = [
            ScanFinding(
                tool=r.tool,
                rule=r.rule,
                level=r.level,
                severity=r.severity,
                path=r.path,
                line=r.line,
                message=r.message,
                blocking=b,
            )
            for r, b in new[:MAX_SHOWN_FINDINGS]
        ]
        return ScanOutcome(
            findings=findings,
            total=len(new),
            preexisting=sum(1 for _r, n, _b in self.rows if not n),
            errors=self.errors[:20],
            tools=list(self.tools),
        )

    async def save_log(self, save: Save) -> ArtifactRef:
        rows = sorted(self.rows, key=lambda row: (not row[1], not row[2]))[:MAX_LOGGED_RESULTS]
        return await save("scan.sarif", sarif.write_log(rows, self.tools), "application/sarif+json")
