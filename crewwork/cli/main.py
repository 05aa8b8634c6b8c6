"""The `crewwork` command line.

API commands (submit, hotfix, status, list, wait, events, review, cancel, evidence, bundle, diff, artifacts,
webhooks) go through `crewwork.client`; `verify` checks an evidence bundle offline; the others run parts of crewwork
itself (dev, demo, worker, api, db, keys, signing-key, config, sandbox, completion).

Output rules, so scripts can rely on them: with `--json` stdout carries only JSON (one document, or JSON Lines for
`events --follow`), without it a human summary; progress and diagnostics always go to stderr (a live status line
when stderr is a terminal, one line per change otherwise; `--quiet` silences it). Exit codes: `EXIT_CODES`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable

from crewwork.cli.common import (
    EXIT_API,
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    Output,
    state_exit_code,
)
from crewwork.cli.items import (
    cmd_artifacts,
    cmd_cancel,
    cmd_diff,
    cmd_events,
    cmd_evidence,
    cmd_hold,
    cmd_hotfix,
    cmd_list,
    cmd_review,
    cmd_status,
    cmd_submit,
    cmd_wait,
    cmd_webhooks,
)
from crewwork.cli.ops import cmd_api, cmd_config, cmd_db, cmd_demo, cmd_dev, cmd_keys, cmd_reconcile, cmd_worker
from crewwork.models.pools import POOLS

# The names scripts and tests use from `crewwork.cli`.
__all__ = ["EXIT_CODES", "Output", "build_parser", "main", "state_exit_code"]

# ---------------------------------------------------------------------------------------------- the parser


def cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    script = shtab.complete(build_parser(), shell=args.shell)
    if getattr(args, "json", False):
        Output(args).result({"shell": args.shell, "script": script})
    else:
        sys.stdout.write(script)
    return EXIT_OK


def _exit_codes_epilog() -> str:
    return "exit codes:\n" + "\n".join(f"  {code:<4} {why}" for code, why in EXIT_CODES.items())


def _seconds(text: str) -> float:
    """A finite number of seconds, at least 0 (`float` alone takes `nan` and `inf`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, at least 0, not {text!r}")
    return value


def _port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 1-65535, not {n}")
    return n


def _pools(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",")]
    known = POOLS
    bad = [p for p in names if p not in known]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown pool {', '.join(repr(b) for b in bad)}: pools are {', '.join(known)} (several: control,agent)"
        )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a pool is named twice in {text!r}")
    return names


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    # Options every command takes, before or after its name (SUPPRESS: a subcommand's default does not override
    # a value given before the subcommand).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print only JSON on stdout (progress: stderr)"
    )
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress on stderr")
    common.add_argument("--api-url", default=argparse.SUPPRESS, help="API base URL (default $CREWWORK_API_URL)")

    p = argparse.ArgumentParser(
        prog="crewwork",
        description="A durable runtime for AI agent work on Temporal.",
        epilog=_exit_codes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print only JSON on stdout (progress: stderr)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--api-url", help="API base URL (default $CREWWORK_API_URL)")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str, fn: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        d = sub.add_parser(
            name,
            help=help_,
            description=help_,
            parents=[common],
            epilog=_exit_codes_epilog(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        d.set_defaults(fn=fn)
        return d

    def wait_options(d: argparse.ArgumentParser, *, until: bool = True) -> None:
        if until:
            d.add_argument(
                "--until",
                action="append",
                metavar="STATE",
                help="stop waiting in this state (repeatable; default: a terminal state)",
            )
        d.add_argument("--timeout", type=_seconds, metavar="S", help="give up after S seconds (exit 5)")

    d = add("submit", "submit a work item from a JSON file ('-' for stdin)", cmd_submit)
    d.add_argument("file")
    d.add_argument("--wait", action="store_true", help="follow it until it ends; exit code by its final state")
    d.add_argument("--idempotency-key")
    wait_options(d)

    d = add("hotfix", "hand off an error report as a `hotfix` work item", cmd_hotfix)
    d.add_argument("--repo", required=True, help="repository path or file:// URL")
    d.add_argument("--ref", default="HEAD")
    d.add_argument("--message", required=True, help="the error message")
    d.add_argument("--trace-file", help="file with the stack trace ('-' for stdin)")
    d.add_argument("--test-command", help="a command that fails now and must pass after the fix (quoted)")
    d.add_argument("--agent-file", help="JSON file with the agent spec ({name, config})")
    d.add_argument("--no-review", action="store_true", help="land without waiting for a person")
    d.add_argument("--wait", action="store_true", help="follow it until it ends (or --until); exit code by its state")
    wait_options(d)

    d = add("status", "show a work item", cmd_status)
    d.add_argument("id")

    d = add("wait", "follow a work item's event stream until it reaches a state", cmd_wait)
    d.add_argument("id")
    wait_options(d)

    d = add("list", "list work items, newest first", cmd_list)
    d.add_argument("--state")
    d.add_argument("--kind")
    d.add_argument("--label", action="append", metavar="KEY=VALUE")
    d.add_argument("--search", metavar="TEXT", help="id prefix or repository text")
    d.add_argument("--limit", type=int, default=20)
    d.add_argument("--cursor", help="next_cursor of the previous page")

    d = add("events", "a work item's event log; --follow streams it live until the item ends", cmd_events)
    d.add_argument("id")
    d.add_argument("--follow", "-f", action="store_true", help="stream events as they happen (JSON Lines with --json)")
    d.add_argument("--after", type=int, default=0, metavar="EVENT_ID", help="only events after this id")
    d.add_argument("--limit", type=int, default=500)

    d = add("review", "approve, reject or request changes", cmd_review)
    d.add_argument("id")
    g = d.add_mutually_exclusive_group(required=True)
    g.add_argument("--approve", action="store_true")
    g.add_argument("--reject", action="store_true")
    g.add_argument("--request-changes", metavar="MESSAGE")
    d.add_argument("--comment", help="a rejection's reason (required with --reject), or an approval's note")
    d.add_argument("--reviewer", help="your name, shown beside the API key (where the operator allows names)")
    d.add_argument(
        "--attempt",
        type=int,
        metavar="N",
        help="the attempt you reviewed (`crewwork status` names it): refused if another one awaits review",
    )
    d.add_argument(
        "--line",
        action="append",
        metavar="PATH:LINE=TEXT",
        help="a comment on line LINE of PATH in the attempt's diff (repeatable; a removed line: PATH:-LINE=TEXT)",
    )

    d = add("cancel", "cancel a work item", cmd_cancel)
    d.add_argument("id")

    d = add("hold", "put a legal hold on a work item (retention keeps it whole), or clear it", cmd_hold)
    d.add_argument("id")
    g = d.add_mutually_exclusive_group(required=True)
    g.add_argument("--reason", help="why the item is held (kept in its event log)")
    g.add_argument("--clear", action="store_true", help="clear the hold")

    d = add("evidence", "evidence per attempt (measured validation, the agent's outcome, artifact links)", cmd_evidence)
    d.add_argument("id")

    d = add("diff", "the change as a unified diff", cmd_diff)
    d.add_argument("id")
    d.add_argument("--attempt", type=int)

    d = add("artifacts", "list a work item's artifacts, or download one", cmd_artifacts)
    d.add_argument("id")
    d.add_argument("artifact_id", nargs="?")
    d.add_argument("--output", "-o", metavar="FILE", help="write the artifact here (default: stdout)")

    from crewwork.cli.agents import add_parser as add_agents_parser
    from crewwork.cli.bundles import add_parser as add_evidence_parser
    from crewwork.cli.deploy import add_parser as add_deploy_parser
    from crewwork.cli.repos import add_parser as add_repos_parser

    add_repos_parser(add, common)
    add_evidence_parser(add, common)
    add_agents_parser(add, common)
    add_deploy_parser(add)

    d = add("webhooks", "register, list, rotate and verify webhooks", cmd_webhooks)
    ws = d.add_subparsers(dest="webhooks_command", required=True)
    w = ws.add_parser("create", help="register a webhook (prints its secret once)", parents=[common])
    w.add_argument("url")
    w.add_argument("--event", action="append", metavar="TYPE", help="event type to deliver (repeatable; default all)")
    ws.add_parser("list", help="the tenant's webhooks", parents=[common])
    for name, help_ in (
        ("get", "one webhook"),
        ("delete", "remove a webhook"),
        ("redeliver", "retry dead-lettered deliveries"),
    ):
        ws.add_parser(name, help=help_, parents=[common]).add_argument("id")
    w = ws.add_parser("rotate", help="new secret (printed once); the old one signs on for --overlap", parents=[common])
    w.add_argument("id")
    w.add_argument("--overlap", type=_seconds, metavar="S", help="seconds the old secret keeps signing (default 86400)")
    w = ws.add_parser("deliveries", help="recent deliveries, newest first", parents=[common])
    w.add_argument("id")
    w.add_argument("--limit", type=int, default=100)
    w = ws.add_parser(
        "verify",
        help="verify a delivery (Standard Webhooks) as a receiver would; exit 6 if it does not",
        parents=[common],
    )
    w.add_argument("--secret-env", required=True, metavar="VAR", help="environment variable holding the secret")
    w.add_argument("--header", "-H", action="append", metavar="'NAME: VALUE'", help="a delivery header (repeatable)")
    w.add_argument("--body", default="-", metavar="FILE", help="the raw body (default: stdin)")
    w.add_argument("--tolerance", type=_seconds, default=300.0, metavar="S", help="allowed clock skew (default 300)")

    d = add("dev", "run Temporal, the API and all worker pools on this machine", cmd_dev)
    d.add_argument("--data-dir")
    d.add_argument("--temporal-port", type=_port, default=7233)
    d.add_argument("--ui-port", type=_port, help="Temporal Web UI port (default: Temporal port + 1000)")
    d.add_argument("--api-port", type=_port, default=8080)

    d = add("demo", "the end-to-end demo on the embedded defaults", cmd_demo)
    d.add_argument("--keep", action="store_true", help="keep the demo's data directory")
    d.add_argument("--data-dir")
    d.add_argument(
        "--serve", action="store_true", help="keep the stack (API, console, Temporal UI) up after the demo until Ctrl-C"
    )
    d.add_argument(
        "--unsafe",
        action="store_true",
        help="where no isolating sandbox is available, run the demo's own sample with the `local` backend (NO "
        "isolation) instead of stopping with what to install",
    )

    d = add("worker", "run one worker pool, or several in one process (--json: JSON log lines)", cmd_worker)
    d.add_argument(
        "--pool",
        required=True,
        type=_pools,
        help="control, agent or validate; several, comma-separated (control,agent), run in this one process",
    )

    d = add("api", "run the HTTP API (--json: JSON log lines)", cmd_api)
    d.add_argument("--host")
    d.add_argument("--port", type=_port)

    d = add("db", "store schema migrations", cmd_db)
    d.add_argument("action", choices=["upgrade", "current"])

    d = add(
        "reconcile",
        "end the store's record of items whose workflow was terminated, timed out or failed (every open item, "
        "once; control pools work through them a batch per CREWWORK_RECONCILE_INTERVAL_S)",
        cmd_reconcile,
    )
    d.add_argument("--batch", type=_positive_int, default=1000, help="open items read per page (default 1000)")
    d.add_argument("--min-age", type=_seconds, help="skip items younger than this, seconds (default: the setting)")
    d.add_argument(
        "--close-unknown",
        action="store_true",
        help="also end as dead the open items whose workflow Temporal does not know (after restoring the store "
        "without Temporal's history; check first that CREWWORK_TEMPORAL_* point at the right namespace)",
    )

    d = add("keys", "API keys", cmd_keys)
    d.add_argument("action", choices=["create", "revoke", "list"])
    d.add_argument("key_id", nargs="?")
    d.add_argument("--tenant")
    d.add_argument("--admin", action="store_true")

    add("config", "list every configuration variable", cmd_config)

    d = add("completion", 'print a shell completion script: eval "$(crewwork completion bash)"', cmd_completion)
    d.add_argument("shell", choices=["bash", "zsh", "tcsh"])

    try:
        from crewwork.sandbox.cli import add_sandbox_commands

        add_sandbox_commands(sub)
    except ImportError:  # pragma: no cover - the sandbox CLI is optional during development
        pass
    return p


def main(argv: list[str] | None = None) -> int:
    from crewwork.client import ApiError, ApiUnreachable, WaitTimeout
    from crewwork.observability.tracing import TracingConfigError

    args = build_parser().parse_args(argv)
    if args.api_url:
        os.environ["CREWWORK_API_URL"] = args.api_url
    try:
        return int(args.fn(args) or 0)
    except CliError as exc:
        msg = str(exc)
        print(msg if msg.startswith("crewwork") else f"crewwork: {msg}", file=sys.stderr)
        return exc.code
    except ApiUnreachable as exc:
        print(
            f"crewwork: cannot reach the API at {exc.url}; is `crewwork dev` (or `crewwork api`) running? ({exc.detail})",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    except ApiError as exc:
        hint = ""
        if exc.status == 401 and getattr(args, "key_source", None):
            hint = f" (the key came from {args.key_source}; set CREWWORK_API_KEY to another, or `crewwork keys create`)"
        print(f"crewwork: {exc}{hint}", file=sys.stderr)
        return EXIT_UNAVAILABLE if exc.status >= 500 else EXIT_API
    except WaitTimeout as exc:
        print(f"crewwork: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    except TracingConfigError as exc:  # OTEL_* ask for something that is not installed: say what, no traceback
        print(f"crewwork: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `crewwork ... | head`
        return EXIT_OK
    except Exception as exc:
        # A CREWWORK_* (or OTEL_*) variable that does not parse: name it, as a usage error, not a traceback.
        from crewwork.config import invalid_settings_message

        message = invalid_settings_message(exc)
        if message is None:
            raise
        print(f"crewwork: {message}", file=sys.stderr)
        return EXIT_USAGE


def run() -> None:
    """The `crewwork` program: `main()`, then an exit that cannot race the Temporal SDK's native threads.

    A short-lived process that used a Temporal client can abort while the interpreter finalizes ("Fatal Python error:
    PyGILState_Release: thread state ... must be current when releasing", temporalio/sdk-python#300): the SDK's Rust
    runtime threads outlive the interpreter. `crewwork reconcile` died of it in CI with SIGABRT after printing its
    result. So once this process has made a Temporal runtime, it flushes its output, shuts tracing and logging down,
    and leaves with `os._exit`, skipping the finalization that crashes; otherwise it exits normally."""
    code = main()
    temporal_runtime = sys.modules.get("temporalio.runtime")
    if temporal_runtime is None or temporal_runtime._runtime_ref._default_runtime is None:
        sys.exit(code)
    import logging

    from crewwork.observability import tracing

    try:
        tracing.shutdown()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe (`| head`): nothing more to say
        pass
    os._exit(code)


if __name__ == "__main__":
    run()
