"""`crewwork sandbox ...`: run a command in a sandbox by hand, build the image, check what this host offers.

`add_sandbox_commands(subparsers)` registers the subcommands on the main CLI's argparse subparsers; each
handler takes the parsed Namespace and returns the process exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from crewwork.config.sandbox import DEFAULT_IMAGE, SandboxSettings
from crewwork.sandbox.backends import SANDBOXES, best_available, get_sandbox
from crewwork.sandbox.base import SandboxError, SandboxLimits, SandboxRunResult
from crewwork.sandbox.image import build_image


def add_sandbox_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Register `sandbox run|build-image|check`; each sets `handler` (and `fn`, which crewwork.cli calls)."""
    sandbox = subparsers.add_parser("sandbox", help="run commands in a sandbox, build its image, check backends")
    sub = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="{run,build-image,check}")

    run = sub.add_parser(
        "run",
        help="run a command in a sandbox and print the typed result",
        description="Run CMD in a sandbox and print the typed result. Exit code = the command's.",
    )
    run.add_argument("--backend", choices=sorted(SANDBOXES), help="backend (default: best available)")
    run.add_argument("--memory", type=int, metavar="MB", help="memory cap in MiB")
    run.add_argument("--pids", type=int, metavar="N", help="process/thread cap")
    run.add_argument("--cpus", type=float, metavar="C", help="CPU cap in cores")
    run.add_argument("--timeout", type=float, metavar="S", help="wall-clock cap in seconds")
    run.add_argument("--workspace", type=Path, default=Path.cwd(), metavar="DIR", help="writable cwd (default: .)")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--unsafe", action="store_true", help="allow the non-isolating `local` backend")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...", help="the command and its arguments")
    run.set_defaults(handler=cmd_run, fn=cmd_run)

    build = sub.add_parser("build-image", help="build the default docker/gvisor image from host files (no registry)")
    build.add_argument("--name", default=None, help=f"image name (default: settings, {DEFAULT_IMAGE})")
    build.set_defaults(handler=cmd_build_image, fn=cmd_build_image)

    check = sub.add_parser("check", help="list sandbox backends and whether each works here")
    check.add_argument("--json", action="store_true", help="print as JSON")
    check.set_defaults(handler=cmd_check, fn=cmd_check)
    return sandbox


def cmd_run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("error: give the command after `--`, e.g. crewwork sandbox run -- python -V", file=sys.stderr)
        return 2
    settings = SandboxSettings()
    name = args.backend
    if name is None:
        name, why = best_available(settings)
        if name == "local" and not args.unsafe:
            print(f"error: {why}\n(pass --unsafe to run without isolation anyway)", file=sys.stderr)
            return 2
    requested = {"memory_mb": args.memory, "pids": args.pids, "cpus": args.cpus, "timeout_s": args.timeout}
    values = {**settings.default_limits().__dict__, **{k: v for k, v in requested.items() if v is not None}}
    try:
        for key, value in requested.items():
            maximum = getattr(settings, f"max_{key}")
            if value is not None and value > maximum:
                raise ValueError(f"--{key.split('_')[0]} {value} exceeds the operator maximum {maximum}")
        limits = SandboxLimits(**values)
        sandbox = get_sandbox(name, allow_unsafe=args.unsafe, settings=settings)
        result = asyncio.run(sandbox.run(cmd, workspace=args.workspace, limits=limits))
    except (ValueError, SandboxError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(limits.output_tail_bytes), indent=2))
    else:
        _print_result(result, limits)
    return result.exit_code if result.exit_code is not None else 125


def _print_result(result: SandboxRunResult, limits: SandboxLimits) -> None:
    if result.stdout:
        sys.stdout.buffer.write(result.stdout)
        sys.stdout.flush()
    if result.stderr:
        sys.stderr.buffer.write(result.stderr)
        sys.stderr.flush()
    label = "" if result.isolated else "  UNSAFE: not isolated"
    flags = [f for f in ("timed_out", "oom_killed", "pids_limited", "truncated") if getattr(result, f)]
    peak = f"{result.peak_memory_bytes / 2**20:.1f} MiB" if result.peak_memory_bytes else "n/a"
    print(
        f"--- sandbox {result.backend} ({result.enforcement}){label}\n"
        f"    exit {result.exit_code}  cause {result.cause}  {result.duration_s:.3f}s  peak memory {peak}\n"
        f"    flags: {', '.join(flags) or 'none'}   limits: {limits.memory_mb} MiB, {limits.pids} pids, "
        f"{limits.cpus} cpus, {limits.timeout_s:g}s",
        file=sys.stderr,
    )


def cmd_build_image(args: argparse.Namespace) -> int:
    settings = SandboxSettings()
    name = args.name or settings.docker_image
    try:
        image_id = build_image(name, base_url=settings.docker_base_url)
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"built {name} ({image_id[:19]})")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    settings = SandboxSettings()
    rows = []
    for name, cls in SANDBOXES.items():
        ok, why = cls.available(settings)
        rows.append({"backend": name, "isolating": cls.isolating, "available": ok, "detail": why})
    best, why = best_available(settings)
    if args.json:
        print(json.dumps({"backends": rows, "best": best, "why": why}, indent=2))
    else:
        for r in rows:
            mark = "ok " if r["available"] else "-- "
            tag = "" if r["isolating"] else " (UNSAFE, explicit only)"
            print(f"{mark}{r['backend']:<7}{tag} {r['detail']}")
        print(f"best available: {best} ({why})")
    return 0 if best != "local" else 1


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (`python -m crewwork.sandbox.cli ...`) until the main CLI hooks the commands in."""
    parser = argparse.ArgumentParser(prog="crewwork")
    add_sandbox_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
