"""mini-swe-agent (PyPI `mini-swe-agent`, in a virtualenv of its own): `mini -y --exit-immediately`, OpenAI Chat
Completions through litellm.

Pointed at the gateway by a config file in its HOME (`model.model_kwargs.api_base` and `api_key`, the model as
`openai/<model>`); `-y` (yolo) runs its commands without confirmation, `--exit-immediately` ends when the agent
submits; its first-run setup, start-up banner and litellm's cost-map download are off. Its trajectory is written to
`$HOME/trajectory.traj.json`. The virtualenv must be made with the interpreter the sandbox has (the worker's base
interpreter: bwrap shows it at its own path, the docker image holds it), and is run at its own path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from crewwork.agents.cli_adapter import CliAdapter, CliRun, Prepared, first_match


class MiniSweAgentAdapter(CliAdapter):
    name: ClassVar[str] = "mini-swe-agent"
    protocol: ClassVar[str] = "chat"
    package: ClassVar[str] = "python3 -m venv DIR && DIR/bin/pip install mini-swe-agent"

    def locate(self, install: Path) -> Path | None:
        python = first_match(install, "bin/python3", "bin/python")
        if python is None or not list(install.glob("lib/python3*/site-packages/minisweagent/__init__.py")):
            return None
        return install / "bin" / "python"

    def prepare(self, run: CliRun, executable: Path) -> Prepared:
        config = json.dumps(  # YAML is a superset of JSON
            {
                "model": {
                    "model_kwargs": {"api_base": run.base_url, "api_key": run.token, "drop_params": True},
                    "cost_tracking": "ignore_errors",
                }
            }
        )
        argv = [
            str(executable),
            "-m",
            "minisweagent.run.mini",
            "-y",
            "--exit-immediately",
            "--cost-limit",
            "0",
            "-m",
            f"openai/{run.model}",
            "-c",
            "mini.yaml",
            "-c",
            f"{run.home}/crewwork.yaml",
            "-o",
            f"{run.home}/trajectory.traj.json",
            "-t",
            run.prompt,
        ]
        env = {
            **self.env_common(run),
            "MSWEA_CONFIGURED": "true",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": f"{run.home}/.config/mini-swe-agent",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "PYTHONUNBUFFERED": "1",
        }
        return Prepared(argv, env, {"crewwork.yaml": config})

    def session_logs(self, home: Path) -> list[Path]:
        path = home / "trajectory.traj.json"
        return [path] if path.is_file() and not path.is_symlink() else []
