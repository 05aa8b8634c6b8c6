"""Operator commands of running crewwork for months: `crewwork deployment` (which worker build takes new items,
and which builds still run pinned items) and `crewwork retention run` (one retention run now, instead of waiting for
the schedule). docs/operations.md has the procedures."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from typing import Any

from crewwork.cli.common import EXIT_OK, CliError, Output
from crewwork.config import get_settings


def add_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    d = add("deployment", "worker builds: which one takes new items, which still run pinned items", cmd_deployment)
    ds = d.add_subparsers(dest="deployment_command", required=True)
    ds.add_parser("status", help="the current build and every build's state (draining: pinned items still open)")
    p = ds.add_parser("promote", help="make BUILD current: new items start on it (roll back: promote the old one)")
    p.add_argument("build_id")
    d = add("retention", "bounded storage: run the retention workflow once now", cmd_retention)
    d.add_argument("action", choices=["run"])


def cmd_deployment(args: argparse.Namespace) -> int:
    from crewwork.temporal.client import connect
    from crewwork.temporal.deployment import describe_deployment, set_current_build

    s = get_settings()
    name = s.deployment.name

    async def go() -> dict[str, Any]:
        client = await connect(s)
        if args.deployment_command == "promote":
            await set_current_build(client, name, args.build_id)
        state = await describe_deployment(client, name)
        if state is None:
            raise CliError(f"no worker of deployment {name!r} has polled yet (CREWWORK_DEPLOYMENT_BUILD_ID unset?)")
        return {
            "deployment": state.name,
            "current": state.current,
            "ramping": state.ramping,
            "versions": [v.__dict__ for v in state.versions],
        }

    out = asyncio.run(go())

    def human() -> str:
        rows = [f"deployment {out['deployment']}: new items start on {out['current'] or 'unversioned workers'}"]
        rows += [f"  {v['build_id']:24} {v['status']:10} {v['drainage']}" for v in out["versions"]]
        return "\n".join(rows)

    Output(args).result(out, human)
    return EXIT_OK


def cmd_retention(args: argparse.Namespace) -> int:
    from crewwork.temporal.client import connect
    from crewwork.workers.schedules import run_retention_now

    s = get_settings()

    async def go() -> Any:
        return await run_retention_now(await connect(s), s)

    res = asyncio.run(go())
    Output(args).result(
        res.model_dump(),
        f"compacted {res.compacted} artifacts ({res.compacted_bytes_in} bytes -> {res.compacted_bytes_stored} new), "
        f"retained {res.retained} items ({res.retained_bytes} bytes, {res.events_removed} events), "
        f"deleted {res.chunks_deleted} chunks",
    )
    return EXIT_OK
