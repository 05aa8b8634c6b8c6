"""`crewwork agents check` (which configured agent CLIs work here) and `crewwork replay` (re-run a recorded attempt
with the model answered from its transcript). Both run on the host that runs them: the agent pool's, with its settings,
its sandbox and its store."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from typing import Any

from crewwork.cli.common import EXIT_ERROR, EXIT_FAILED, EXIT_OK, CliError, Output
from crewwork.config import get_settings


def add_parser(
    add: Callable[[str, str, Callable[[argparse.Namespace], int]], argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    a = add("agents", "the configured agent CLIs", cmd_agents_check)
    asub = a.add_subparsers(dest="agents_command", required=True)
    c = asub.add_parser("check", help="which configured agent CLIs work here, and why not", parents=[common])
    c.add_argument("--no-run", action="store_true", help="do not start each CLI in the sandbox")
    r = add(
        "replay", "re-run a recorded attempt with the model answered from its transcript (no model call)", cmd_replay
    )
    r.add_argument("id", help="work item id")
    r.add_argument("attempt", type=int, help="attempt number")


def cmd_agents_check(args: argparse.Namespace) -> int:
    from crewwork.agents.cli_check import check_agents

    settings = get_settings()
    checks = asyncio.run(check_agents(settings, run=not getattr(args, "no_run", False)))
    data = [c.__dict__ for c in checks]

    def human() -> str:
        if not checks:
            return "no agent CLI is configured (CREWWORK_COMMAND_AGENTS has no command with an `adapter`)"
        lines = []
        for c in checks:
            mark = "ok  " if c.ok else "FAIL"
            runner = " [delegated runner]" if c.delegated else ""
            lines.append(f"{mark} {c.command} ({c.adapter or 'command'}){runner}: {c.why}")
        return "\n".join(lines)

    Output(args).result(data, human)
    return EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED


def cmd_replay(args: argparse.Namespace) -> int:
    from crewwork.cli.ops import require_store
    from crewwork.steps.ports import Ports
    from crewwork.steps.replay.activity import ReplayError, replay_attempt
    from crewwork.store.store import Store

    settings = get_settings()
    require_store(settings, "replay")

    async def go() -> dict[str, Any]:
        store = Store(settings.resolved_database_url())
        try:
            report = await replay_attempt(Ports.build(store, settings), args.id, args.attempt)
        finally:
            await store.close()
        return report.to_dict()

    try:
        out = asyncio.run(go())
    except ReplayError as exc:
        raise CliError(f"crewwork replay: {exc}") from None

    def human() -> str:
        lines = [
            f"replayed attempt {out['attempt']} of {out['work_item_id']} ({out['agent']}): "
            f"{out['replayed_calls']} call(s) answered from {out['recorded_calls']} recorded; "
            f"{out['provider_calls']} model call(s) made",
            f"same questions: {'yes' if out['same_questions'] else 'no'}",
        ]
        lines += [f"  diverged at call {d['call']} ({d['dialect']}): {d['detail']}" for d in out["divergences"][:10]]
        lines += [
            f"  call {d['call']}: only its tools' output differed: {d['detail']}" for d in out["observations"][:10]
        ]
        lines.append(f"same diff: {'yes' if out['same_diff'] else 'no'}")
        lines.append(f"verdict: {out['verdict']}")
        if out["error"]:
            lines.append(f"the replayed agent ended with: {out['error']}")
        return "\n".join(lines)

    Output(args).result(out, human)
    return EXIT_OK if out["same_diff"] and out["same_questions"] else EXIT_ERROR
