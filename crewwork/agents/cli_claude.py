"""Claude Code (npm `@anthropic-ai/claude-code`): `claude -p`, Anthropic Messages.

Pointed at the gateway by `ANTHROPIC_BASE_URL` with the attempt's token as `ANTHROPIC_API_KEY`;
`--dangerously-skip-permissions` switches off its permission prompts (it refuses that as root; the sandbox never runs
as root); `--output-format stream-json --verbose` prints its events; its update checks, telemetry and error reports are
off. Its session log is `~/.claude/projects/<cwd>/<session>.jsonl`. The native binary of the platform package is run.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from crewwork.agents.cli_adapter import CliAdapter, CliRun, Prepared, first_match, logs_below


class ClaudeCodeAdapter(CliAdapter):
    name: ClassVar[str] = "claude-code"
    protocol: ClassVar[str] = "messages"
    package: ClassVar[str] = "npm install --prefix DIR @anthropic-ai/claude-code"

    def locate(self, install: Path) -> Path | None:
        return first_match(
            install,
            "node_modules/@anthropic-ai/claude-code-linux-x64/claude",
            "node_modules/@anthropic-ai/claude-code-linux-*/claude",
            "node_modules/@anthropic-ai/claude-code/bin/claude.exe",
            "bin/claude",
        )

    def prepare(self, run: CliRun, executable: Path) -> Prepared:
        argv = [
            str(executable),
            "-p",
            run.prompt,
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
            "--model",
            run.model,
        ]
        env = {
            **self.env_common(run),
            "ANTHROPIC_BASE_URL": run.root_url,
            "ANTHROPIC_API_KEY": run.token,
            "ANTHROPIC_MODEL": run.model,
            "ANTHROPIC_SMALL_FAST_MODEL": run.model,
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        return Prepared(argv, env)

    def session_logs(self, home: Path) -> list[Path]:
        return logs_below(home, ".claude/projects", ".jsonl", depth=1)
