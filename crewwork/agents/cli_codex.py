"""Codex CLI (npm `@openai/codex`): `codex exec`, OpenAI Responses, config in `$CODEX_HOME/config.toml`.

Pointed at the gateway by a model provider of its own (`base_url`, `env_key` naming the variable that holds the
attempt's token, `wire_api = "responses"`); `--dangerously-bypass-approvals-and-sandbox` switches off its approvals and
its own sandbox (crewwork's is the boundary); `--json` prints its events. Its session log is
`$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl`. The native binary of the platform package is run directly (the npm
entry point only execs it), so no Node is needed in the sandbox.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from crewwork.agents.cli_adapter import CliAdapter, CliRun, Prepared, first_match, logs_below


class CodexAdapter(CliAdapter):
    name: ClassVar[str] = "codex"
    protocol: ClassVar[str] = "responses"
    package: ClassVar[str] = "npm install --prefix DIR @openai/codex"

    def locate(self, install: Path) -> Path | None:
        return first_match(
            install,
            "node_modules/@openai/codex-linux-*/vendor/*/bin/codex",
            "node_modules/@openai/codex/vendor/*/bin/codex",
            "bin/codex",
        )

    def prepare(self, run: CliRun, executable: Path) -> Prepared:
        config = "\n".join(
            [
                f"model = {json.dumps(run.model)}",
                'model_provider = "crewwork"',
                'approval_policy = "never"',
                'sandbox_mode = "danger-full-access"',
                "",
                "[model_providers.crewwork]",
                'name = "crewwork model gateway"',
                f"base_url = {json.dumps(run.base_url)}",
                'env_key = "CREWWORK_GATEWAY_TOKEN"',
                'wire_api = "responses"',
                "request_max_retries = 1",
                "stream_max_retries = 1",
                "",
            ]
        )
        argv = [
            str(executable),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--json",
            "--color",
            "never",
            "-C",
            run.workspace,
            run.prompt,
        ]
        env = {
            **self.env_common(run),
            "CODEX_HOME": f"{run.home}/.codex",
            "CREWWORK_GATEWAY_TOKEN": run.token,
            "CODEX_MANAGED_BY_NPM": "1",
        }
        return Prepared(argv, env, {".codex/config.toml": config})

    def session_logs(self, home: Path) -> list[Path]:
        return logs_below(home, ".codex/sessions", ".jsonl", depth=3)
