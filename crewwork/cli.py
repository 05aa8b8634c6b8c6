"""The `crewwork` command line.

API commands (submit, hotfix, status, list, wait, events, review, cancel, evidence, diff, artifacts, webhooks) go
through `crewwork.client`; the others run parts of crewwork itself (dev, demo, worker, api, db, keys, config,
sandbox, completion).

Output rules, so scripts can rely on them: with `--json` stdout carries only JSON (one document, or JSON Lines for
`events --follow`), without it a human summary; progress and diagnostics always go to stderr (a live status line
when stderr is a terminal, one line per change otherwise; `--quiet` silences it). Exit codes: `EXIT_CODES`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from crewwork.config import Settings, get_settings
from crewwork.render import render_item

# ---------------------------------------------------------------------------------------------- exit codes

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_API = 3
EXIT_UNAVAILABLE = 4
EXIT_TIMEOUT = 5
EXIT_VERIFY = 6
EXIT_FAILED = 10
EXIT_REJECTED = 11
EXIT_CANCELLED = 12
EXIT_DEAD = 13
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success (for a command that waits: the work item succeeded, or reached the state waited for)",
    EXIT_ERROR: "an unexpected error on this side (a bug: the message says what)",
    EXIT_USAGE: "usage: bad arguments, or an input file that is missing or not valid JSON",
    EXIT_API: "the API refused the request (4xx: invalid submission, unknown id, not allowed, conflict, ...)",
    EXIT_UNAVAILABLE: "the API is unreachable or unavailable (connection refused, 5xx, Temporal unavailable)",
    EXIT_TIMEOUT: "--timeout passed before the work item reached the state waited for",
    EXIT_VERIFY: "`webhooks verify`: the delivery does not verify",
    EXIT_FAILED: "the work item ended `failed`",
    EXIT_REJECTED: "the work item ended `rejected` (by its reviewer)",
    EXIT_CANCELLED: "the work item ended `cancelled`",
    EXIT_DEAD: "the work item ended `dead` (infrastructure retries exhausted)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
STATE_EXIT = {"failed": EXIT_FAILED, "rejected": EXIT_REJECTED, "cancelled": EXIT_CANCELLED, "dead": EXIT_DEAD}


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def state_exit_code(state: str, wanted: Sequence[str] = ()) -> int:
    """The exit code for a work item that a command waited for and found in `state`."""
    if state in wanted:
        return EXIT_OK
    return STATE_EXIT.get(state, EXIT_OK)


# ---------------------------------------------------------------------------------------------- output


class Output:
    """stdout for results (JSON or human text), stderr for progress."""

    def __init__(self, args: argparse.Namespace, out: IO[str] | None = None, err: IO[str] | None = None) -> None:
        self.json = bool(getattr(args, "json", False))
        self.quiet = bool(getattr(args, "quiet", False))
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.live = self.err.isatty() and not self.quiet
        self._live_text = ""

    def result(self, data: Any, human: str | Callable[[], str] | None = None) -> None:
        """The command's result: `data` as JSON with --json, else the human text."""
        self.clear_live()
        if self.json:
            self.out.write(json.dumps(data, indent=2) + "\n")
        elif human is not None:
            text = human() if callable(human) else human
            if text:
                self.out.write(text + "\n")
        self.out.flush()

    def json_line(self, data: Any) -> None:
        self.out.write(json.dumps(data, separators=(",", ":")) + "\n")
        self.out.flush()

    def progress(self, text: str) -> None:
        """A progress update: rewrites the status line on a terminal, else one line on stderr."""
        if self.quiet:
            return
        if self.live:
            self.err.write("\r\033[K" + text[: _columns() - 1])
            self._live_text = text
        else:
            self.err.write(text + "\n")
        self.err.flush()

    def note(self, text: str) -> None:
        if self.quiet:
            return
        self.clear_live()
        self.err.write(text + "\n")
        self.err.flush()

    def clear_live(self) -> None:
        if self._live_text:
            self.err.write("\r\033[K" + self._live_text + "\n")
            self.err.flush()
            self._live_text = ""


def _columns() -> int:
    import shutil

    return shutil.get_terminal_size((100, 20)).columns


# ---------------------------------------------------------------------------------------------- the client


def client_settings(args: argparse.Namespace) -> tuple[str, str | None]:
    s = get_settings()
    url = getattr(args, "api_url", None) or s.api_url
    key = s.api_key
    if not key:
        kf = s.data_dir / "api_key"
        if kf.exists():
            key = kf.read_text().strip()
    return url.rstrip("/"), key


def make_client(args: argparse.Namespace) -> Any:
    from crewwork.client import Client

    url, key = client_settings(args)
    return Client(url, key)


def _read_json(path_arg: str, what: str = "") -> Any:
    try:
        text = sys.stdin.read() if path_arg == "-" else Path(path_arg).read_text()
    except FileNotFoundError:
        raise CliError(f"no such file: {path_arg}") from None
    except OSError as exc:
        raise CliError(f"cannot read {path_arg}: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{path_arg if path_arg != '-' else 'stdin'} is not valid JSON{what}: {exc}") from None


def _stamp() -> str:
    return time.strftime("%H:%M:%S")


def _follow(c: Any, out: Output, wid: str, until: Sequence[str] | None, timeout_s: float | None) -> dict[str, Any]:
    """Wait on the event stream, showing each state change as progress."""

    def on_event(ev: dict[str, Any]) -> None:
        if ev["type"] == "state_changed":
            d = ev.get("data") or {}
            out.progress(f"  {_stamp()} {wid} {d.get('state')}: {d.get('reason', '')}")

    item: dict[str, Any] = c.wait(wid, until=until, timeout_s=timeout_s, on_event=on_event)
    out.clear_live()
    return item


# ---------------------------------------------------------------------------------------------- API commands


def cmd_submit(args: argparse.Namespace) -> int:
    body = _read_json(args.file)
    if isinstance(body, dict) and isinstance(body.get("repo"), dict):
        url = body["repo"].get("url", "")
        # A relative local path in a file means "relative to where I run the command".
        if url and "://" not in url and not url.startswith("/") and Path(url).exists():
            body["repo"]["url"] = str(Path(url).resolve())
    out = Output(args)
    with make_client(args) as c:
        data = c.submit(body, idempotency_key=args.idempotency_key)
        if not args.wait:
            out.result(
                data, f"{data['id']}  {'submitted' if data['created'] else 'already submitted'}  ({data['state']})"
            )
            return EXIT_OK
        if not out.json:
            out.result(
                None, f"{data['id']}  {'submitted' if data['created'] else 'already submitted'}  ({data['state']})"
            )
        item = _follow(c, out, data["id"], args.until, args.timeout)
    out.result(item, lambda: f"{item['id']}  {item['state']}: {item['reason']}")
    return state_exit_code(item["state"], args.until or ())


def cmd_hotfix(args: argparse.Namespace) -> int:
    trace = ""
    if args.trace_file:
        try:
            trace = sys.stdin.read() if args.trace_file == "-" else Path(args.trace_file).read_text()
        except FileNotFoundError:
            raise CliError(f"no such file: {args.trace_file}") from None
    repo = args.repo if "://" in args.repo else str(Path(args.repo).resolve())
    body: dict[str, Any] = {"message": args.message, "stack_trace": trace, "repo": {"url": repo, "ref": args.ref}}
    if args.test_command:
        body["test_command"] = shlex.split(args.test_command)
    if args.agent_file:
        body["agent"] = _read_json(args.agent_file, " (the agent spec)")
    if args.no_review:
        body["review"] = {"required": False}
    out = Output(args)
    with make_client(args) as c:
        data = c.hotfix(body)
        line = f"{data['id']}  hotfix {'submitted' if data['created'] else 'already submitted'}  ({data['state']})"
        if not args.wait:
            out.result(data, line)
            return EXIT_OK
        if not out.json:
            out.result(None, line)
        item = _follow(c, out, data["id"], None, args.timeout)
    out.result(item, lambda: f"{item['id']}  {item['state']}: {item['reason']}")
    return state_exit_code(item["state"])


def cmd_status(args: argparse.Namespace) -> int:
    with make_client(args) as c:
        item = c.get(args.id)
    Output(args).result(item, lambda: render_item(item))
    return EXIT_OK


def cmd_wait(args: argparse.Namespace) -> int:
    out = Output(args)
    with make_client(args) as c:
        item = _follow(c, out, args.id, args.until, args.timeout)
    out.result(item, lambda: f"{item['id']}  {item['state']}: {item['reason']}")
    return state_exit_code(item["state"], args.until or ())


def cmd_review(args: argparse.Namespace) -> int:
    if args.approve:
        action, comment = "approve", args.comment
    elif args.reject:
        action, comment = "reject", args.comment
    else:
        action, comment = "request_changes", args.request_changes
    with make_client(args) as c:
        r = c.review(args.id, action, comment=comment, reviewer=args.reviewer)
    Output(args).result(r, r["message"])
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    with make_client(args) as c:
        r = c.cancel(args.id)
    Output(args).result(r, r["message"])
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    labels = {}
    for item in args.label or []:
        k, sep, v = item.partition("=")
        if not sep:
            raise CliError(f"--label {item!r}: expected key=value")
        labels[k] = v
    with make_client(args) as c:
        page = c.list(
            state=args.state, kind=args.kind, labels=labels, q=args.search, limit=args.limit, cursor=args.cursor
        )

    def human() -> str:
        rows = [f"{it['id']}  {it['kind']:11} {it['state']:16} {it['reason'][:70]}" for it in page["items"]]
        if page.get("next_cursor"):
            rows.append(f"(more: --cursor {page['next_cursor']})")
        return "\n".join(rows)

    Output(args).result(page, human)
    return EXIT_OK


def _event_line(ev: dict[str, Any]) -> str:
    ts = time.strftime("%H:%M:%S", time.localtime(ev.get("created_at") or 0))
    d = ev.get("data") or {}
    if ev["type"] == "state_changed":
        detail = f"{d.get('state')}: {d.get('reason', '')}"
    else:
        detail = json.dumps(d, separators=(",", ":"))[:160]
    return f"{ev['id']:>8}  {ts}  {ev['type']:24} {detail}"


def cmd_events(args: argparse.Namespace) -> int:
    from crewwork.client import TERMINAL_STATES

    out = Output(args)
    with make_client(args) as c:
        if not args.follow:
            events = c.events(args.id, after=args.after, limit=args.limit)
            out.result(events, lambda: "\n".join(_event_line(e) for e in events))
            return EXIT_OK
        # Follow: every event as it happens (JSON Lines with --json), until the item reaches a terminal state.
        state = ""
        for ev in c.stream_events(args.id, after=args.after):
            if out.json:
                out.json_line(ev)
            else:
                out.out.write(_event_line(ev) + "\n")
                out.out.flush()
            if ev["type"] == "state_changed":
                state = (ev.get("data") or {}).get("state", "")
                if state in TERMINAL_STATES:
                    break
    return state_exit_code(state)


def cmd_evidence(args: argparse.Namespace) -> int:
    with make_client(args) as c:
        ev = c.evidence(args.id)

    def human() -> str:
        rows = []
        for a in ev:
            val = a.get("validation") or {}
            rows.append(f"attempt {a['number']}: {a['verdict']:7} cause={a.get('cause')} exit={val.get('exit_code')}")
            for role, url in (a.get("artifacts") or {}).items():
                rows.append(f"    {role:10} {url}")
        return "\n".join(rows)

    Output(args).result(ev, human)
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    with make_client(args) as c:
        text = c.diff(args.id, attempt=args.attempt)
    Output(args).result({"id": args.id, "attempt": args.attempt, "diff": text}, text.rstrip("\n"))
    return EXIT_OK


def cmd_artifacts(args: argparse.Namespace) -> int:
    out = Output(args)
    with make_client(args) as c:
        if args.artifact_id is None:
            arts = c.artifacts(args.id)
            out.result(
                arts,
                lambda: "\n".join(f"{a['id']}  {a['size']:>9}  {a['content_type']:24} {a['name']}" for a in arts),
            )
            return EXIT_OK
        content = c.artifact(args.id, args.artifact_id)
    if args.output and args.output != "-":
        Path(args.output).write_bytes(content)
        out.result({"id": args.artifact_id, "path": args.output, "size": len(content)}, f"wrote {args.output}")
    elif out.json:
        raise CliError("--json cannot carry an artifact's bytes: give --output FILE")
    else:
        sys.stdout.buffer.write(content)
        sys.stdout.flush()
    return EXIT_OK


def cmd_webhooks(args: argparse.Namespace) -> int:
    out = Output(args)
    action = args.webhooks_command
    if action == "verify":
        return _verify_webhook(args, out)
    with make_client(args) as c:
        if action == "create":
            hook = c.create_webhook(args.url, args.event or [])
            out.result(hook, f"{hook['id']}  {hook['url']}\nsecret {hook['secret']}\n(shown once)")
        elif action == "list":
            hooks = c.webhooks()
            out.result(hooks, lambda: "\n".join(f"{h['id']}  {h['url']}  {','.join(h['event_types'])}" for h in hooks))
        elif action == "get":
            hook = c.webhook(args.id)
            out.result(hook, f"{hook['id']}  {hook['url']}  {','.join(hook['event_types'])}")
        elif action == "delete":
            c.delete_webhook(args.id)
            out.result({"id": args.id, "deleted": True}, f"deleted {args.id}")
        elif action == "rotate":
            r = c.rotate_webhook_secret(args.id, overlap_s=args.overlap)
            until = r["previous_secret_valid_until"]
            old = (
                f"the previous secret also signs until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(until))}"
                if until
                else "the previous secret no longer signs"
            )
            out.result(r, f"new secret {r['secret']}\n(shown once; {old})")
        elif action == "deliveries":
            rows = c.webhook_deliveries(args.id, limit=args.limit)
            out.result(
                rows,
                lambda: "\n".join(
                    f"{d['id']:>8}  {d['work_item_id']}  {d['status']:9} attempts={d['attempts']} {d['last_error'] or ''}"
                    for d in rows
                ),
            )
        elif action == "redeliver":
            r = c.redeliver(args.id)
            out.result(r, f"requeued {r['requeued']}")
    return EXIT_OK


def _verify_webhook(args: argparse.Namespace, out: Output) -> int:
    from crewwork.client import WebhookVerificationError, verify_webhook

    secret = os.environ.get(args.secret_env, "") if args.secret_env else ""
    if not secret:
        raise CliError(f"set the webhook secret in ${args.secret_env}")
    headers = {}
    for h in args.header or []:
        name, sep, value = h.partition(":")
        if not sep:
            raise CliError(f"--header {h!r}: expected 'name: value'")
        headers[name.strip()] = value.strip()
    body = sys.stdin.buffer.read() if args.body == "-" else Path(args.body).read_bytes()
    try:
        payload = verify_webhook(secret, headers, body, tolerance_s=args.tolerance)
    except WebhookVerificationError as exc:
        out.result({"verified": False, "error": str(exc)}, None)
        out.note(f"crewwork: the delivery does not verify: {exc}")
        return EXIT_VERIFY
    out.result({"verified": True, "payload": payload}, "verified")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- local commands


def cmd_worker(args: argparse.Namespace) -> int:
    import asyncio

    from crewwork.workers.pools import run_pool

    s = _settings_for(args)
    setup_logging(s)
    asyncio.run(run_pool(args.pool, s))
    return EXIT_OK


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from crewwork import tracing
    from crewwork.api.app import create_app

    s = _settings_for(args)
    setup_logging(s)
    tracing.configure(s, "crewwork-api")
    try:
        uvicorn.run(
            create_app(s),
            host=args.host or s.api_host,
            port=args.port or s.api_port,
            log_level=s.log_level.lower(),
            access_log=False,
            log_config=None,  # uvicorn's loggers go through crewwork's formatter (setup_logging)
        )
    finally:
        tracing.shutdown()
    return EXIT_OK


def _settings_for(args: argparse.Namespace) -> Settings:
    s = get_settings()
    if getattr(args, "json", False):
        s = s.model_copy(update={"log_format": "json"})
    return s


def cmd_db(args: argparse.Namespace) -> int:
    import asyncio

    from crewwork.observability import mask_secrets_in_text
    from crewwork.store.db import current_revision, upgrade

    url = get_settings().resolved_database_url()
    if args.action == "upgrade":
        asyncio.run(upgrade(url))
    rev = asyncio.run(current_revision(url))
    shown = mask_secrets_in_text(url)
    if args.action == "upgrade":
        human = f"store schema is at {rev} ({shown})"
    else:
        human = rev or "(empty: run `crewwork db upgrade`)"
    Output(args).result({"revision": rev, "database": shown}, human)
    return EXIT_OK


def cmd_keys(args: argparse.Namespace) -> int:
    import asyncio

    from crewwork.store.db import upgrade
    from crewwork.store.store import Store

    out = Output(args)

    async def run() -> int:
        url = get_settings().resolved_database_url()
        await upgrade(url)
        st = Store(url)
        try:
            if args.action == "create":
                if not args.tenant:
                    raise CliError("keys create needs --tenant")
                kid, plain = await st.create_api_key(args.tenant, ["admin"] if args.admin else [])
                out.result(
                    {"id": kid, "tenant": args.tenant, "key": plain, "admin": bool(args.admin)},
                    f"key id {kid} for tenant {args.tenant}\n{plain}\n(shown once; only its hash is stored)",
                )
            elif args.action == "revoke":
                if not args.key_id:
                    raise CliError("keys revoke needs the key id")
                ok = await st.revoke_api_key(args.key_id)
                out.result({"id": args.key_id, "revoked": ok}, "revoked" if ok else "no such active key")
                return EXIT_OK if ok else EXIT_ERROR
            else:
                keys = await st.list_api_keys(args.tenant)
                out.result(
                    keys,
                    lambda: "\n".join(
                        f"{k['id']}  {k['tenant']:20} {k['prefix']}…  {'revoked' if k['revoked'] else 'active'}  "
                        f"{k['scopes']}"
                        for k in keys
                    ),
                )
            return EXIT_OK
        finally:
            await st.close()

    return asyncio.run(run())


def cmd_dev(args: argparse.Namespace) -> int:
    from crewwork.stack import Stack

    out = Output(args)
    s = get_settings()
    stack = Stack(
        data_dir=Path(args.data_dir or s.data_dir).resolve(),
        temporal_port=args.temporal_port,
        ui_port=args.ui_port or args.temporal_port + 1000,
        api_port=args.api_port,
        database_url=s.database_url,
        on_event=lambda m: out.note(f"[dev] {m}"),
    )
    stop = False

    def _on_signal(*_: Any) -> None:
        nonlocal stop
        stop = True

    # SIGINT explicitly too: a process started in the background by a non-interactive shell inherits SIGINT as
    # *ignored*, and Python then never raises KeyboardInterrupt, so Ctrl-C / `kill -INT` would do nothing.
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        stack.start()
    except Exception as exc:
        stack.stop()
        raise CliError(f"crewwork dev: {exc}", EXIT_ERROR) from exc
    out.result(
        {
            "api_url": stack.api_url,
            "console_url": f"{stack.api_url}/console",
            "temporal_ui_url": stack.ui_url,
            "data_dir": str(stack.data_dir),
            "api_key_file": str(stack.data_dir / "api_key"),
        },
        f"\ncrewwork is running (data in {stack.data_dir}).\n"
        f"  API          {stack.api_url}   (OpenAPI: {stack.api_url}/docs)\n"
        f"  console      {stack.api_url}/console\n"
        f"  Temporal UI  {stack.ui_url}\n"
        f"  API key      in {stack.data_dir / 'api_key'}\n"
        f"Submit with `crewwork submit FILE.json`. Ctrl-C stops everything.\n",
    )
    while not stop:
        time.sleep(0.5)
    out.note("[dev] stopping…")
    stack.stop()
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from crewwork.demo import run_demo

    return run_demo(
        keep=args.keep,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        serve=args.serve,
        json_output=bool(args.json),
    )


def cmd_config(args: argparse.Namespace) -> int:
    from crewwork.config import describe_settings

    rows = describe_settings()
    Output(args).result(
        rows, lambda: "\n".join(f"{r['env']:36} default {r['default']!r:40} {r['description']}" for r in rows)
    )
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    script = shtab.complete(build_parser(), shell=args.shell)
    if getattr(args, "json", False):
        Output(args).result({"shell": args.shell, "script": script})
    else:
        sys.stdout.write(script)
    return EXIT_OK


def setup_logging(settings: Settings | None = None) -> None:
    from crewwork.observability import configure_logging

    s = settings or get_settings()
    configure_logging(s.log_level, json_logs=s.log_format == "json")


# ---------------------------------------------------------------------------------------------- the parser


def _exit_codes_epilog() -> str:
    return "exit codes:\n" + "\n".join(f"  {code:<4} {why}" for code, why in EXIT_CODES.items())


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
        d.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds (exit 5)")

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
    d.add_argument("--wait", action="store_true")
    wait_options(d, until=False)

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
    d.add_argument("--comment")
    d.add_argument("--reviewer")

    d = add("cancel", "cancel a work item", cmd_cancel)
    d.add_argument("id")

    d = add("evidence", "evidence per attempt (measured validation, the agent's outcome, artifact links)", cmd_evidence)
    d.add_argument("id")

    d = add("diff", "the change as a unified diff", cmd_diff)
    d.add_argument("id")
    d.add_argument("--attempt", type=int)

    d = add("artifacts", "list a work item's artifacts, or download one", cmd_artifacts)
    d.add_argument("id")
    d.add_argument("artifact_id", nargs="?")
    d.add_argument("--output", "-o", metavar="FILE", help="write the artifact here (default: stdout)")

    from crewwork.cli_repos import add_parser as add_repos_parser

    add_repos_parser(add, common)

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
    w.add_argument("--overlap", type=float, metavar="S", help="seconds the old secret keeps signing (default 86400)")
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
    w.add_argument("--tolerance", type=float, default=300.0, metavar="S", help="allowed clock skew (default 300)")

    d = add("dev", "run Temporal, the API and all worker pools on this machine", cmd_dev)
    d.add_argument("--data-dir")
    d.add_argument("--temporal-port", type=int, default=7233)
    d.add_argument("--ui-port", type=int, help="Temporal Web UI port (default: Temporal port + 1000)")
    d.add_argument("--api-port", type=int, default=8080)

    d = add("demo", "the end-to-end demo on the embedded defaults", cmd_demo)
    d.add_argument("--keep", action="store_true", help="keep the demo's data directory")
    d.add_argument("--data-dir")
    d.add_argument(
        "--serve", action="store_true", help="keep the stack (API, console, Temporal UI) up after the demo until Ctrl-C"
    )

    d = add("worker", "run one worker pool (--json: JSON log lines)", cmd_worker)
    d.add_argument("--pool", required=True, choices=["control", "agent", "validate"])

    d = add("api", "run the HTTP API (--json: JSON log lines)", cmd_api)
    d.add_argument("--host")
    d.add_argument("--port", type=int)

    d = add("db", "store schema migrations", cmd_db)
    d.add_argument("action", choices=["upgrade", "current"])

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
    from crewwork.tracing import TracingConfigError

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
        print(f"crewwork: {exc}", file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main())
