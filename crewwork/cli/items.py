"""The API commands: submit, hotfix, status, wait, review, cancel, list, events, evidence, diff, artifacts,
webhooks (through `crewwork.client`)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from crewwork.cli.common import (
    EXIT_OK,
    EXIT_VERIFY,
    CliError,
    Output,
    _follow,
    _read_json,
    make_client,
    state_exit_code,
    write_output,
)
from crewwork.cli.render import REVIEW_EVENT, render_item, review_line, terminal_text

# ---------------------------------------------------------------------------------------------- API commands


def cmd_submit(args: argparse.Namespace) -> int:
    body = _read_json(args.file)
    if isinstance(body.get("repo"), dict):
        url = body["repo"].get("url", "")
        # A relative local path in a file means "relative to where I run the command".
        if isinstance(url, str) and url and "://" not in url and not url.startswith("/") and Path(url).exists():
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
    out.result(item, lambda: f"{item['id']}  {item['state']}: {terminal_text(item['reason'], 300)}")
    return state_exit_code(item["state"], args.until or ())


def cmd_hotfix(args: argparse.Namespace) -> int:
    trace = ""
    if args.trace_file:
        try:
            trace = sys.stdin.read() if args.trace_file == "-" else Path(args.trace_file).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CliError(f"no such file: {args.trace_file}") from None
        except UnicodeDecodeError as exc:
            raise CliError(f"--trace-file {args.trace_file} is not UTF-8 text: {exc}") from None
        except OSError as exc:
            raise CliError(f"cannot read {args.trace_file}: {exc.strerror or exc}") from None
    repo = args.repo if "://" in args.repo else str(Path(args.repo).resolve())
    body: dict[str, Any] = {"message": args.message, "stack_trace": trace, "repo": {"url": repo, "ref": args.ref}}
    if args.test_command:
        try:
            body["test_command"] = shlex.split(args.test_command)
        except ValueError as exc:  # unbalanced quotes
            raise CliError(f"--test-command is not a shell command line: {exc}") from None
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
        item = _follow(c, out, data["id"], args.until, args.timeout)
    out.result(item, lambda: f"{item['id']}  {item['state']}: {terminal_text(item['reason'], 300)}")
    return state_exit_code(item["state"], args.until or ())


def cmd_status(args: argparse.Namespace) -> int:
    with make_client(args) as c:
        item = c.get(args.id)
    Output(args).result(item, lambda: render_item(item))
    return EXIT_OK


def cmd_wait(args: argparse.Namespace) -> int:
    out = Output(args)
    with make_client(args) as c:
        item = _follow(c, out, args.id, args.until, args.timeout)
    out.result(item, lambda: f"{item['id']}  {item['state']}: {terminal_text(item['reason'], 300)}")
    return state_exit_code(item["state"], args.until or ())


def _line_comments(specs: list[str] | None) -> list[dict[str, Any]]:
    """`PATH:LINE=TEXT` (a removed line: `PATH:-LINE=TEXT`) as line comments."""
    out = []
    for spec in specs or []:
        where, sep, text = spec.partition("=")
        path, colon, line = where.rpartition(":")
        side = "old" if line.startswith("-") else "new"
        if not sep or not colon or not path or not line.lstrip("-").isdigit() or not text.strip():
            raise CliError(f"--line {spec[:80]!r}: expected PATH:LINE=TEXT (a removed line: PATH:-LINE=TEXT)")
        out.append({"path": path, "line": int(line.lstrip("-")), "side": side, "body": text})
    return out


def cmd_review(args: argparse.Namespace) -> int:
    if args.approve:
        action, comment = "approve", args.comment
    elif args.reject:
        action, comment = "reject", args.comment
        if not (comment or "").strip():
            raise CliError("--reject needs --comment REASON: the item ends rejected, and everyone reads why")
    else:
        action, comment = "request_changes", args.request_changes
    with make_client(args) as c:
        r = c.review(
            args.id,
            action,
            comment=comment,
            reviewer=args.reviewer,
            attempt=args.attempt,
            line_comments=_line_comments(args.line),
        )
    Output(args).result(r, r["message"])
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    with make_client(args) as c:
        r = c.cancel(args.id)
    Output(args).result(r, r["message"])
    return EXIT_OK


def cmd_hold(args: argparse.Namespace) -> int:
    if (args.reason is None) == (not args.clear):
        raise CliError("hold: give --reason TEXT to set the hold, or --clear to clear it")
    with make_client(args) as c:
        r = c.legal_hold(args.id, None if args.clear else args.reason)
    hold = r.get("legal_hold")
    gone = " (retention had already removed its details: the hold keeps what is left)" if r.get("retained_at") else ""
    Output(args).result(r, (f"{args.id}  held: {hold['reason']}" if hold else f"{args.id}  no legal hold") + gone)
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
        rows = [
            f"{it['id']}  {it['kind']:11} {it['state']:16} {terminal_text(it['reason'], 70)}" for it in page["items"]
        ]
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
    elif ev["type"] == REVIEW_EVENT:
        detail = review_line(d)
    else:
        detail = json.dumps(d, separators=(",", ":"))
    return f"{ev['id']:>8}  {ts}  {ev['type']:24} {terminal_text(detail, 160)}"


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
    from crewwork.cli.render import bundle_line, flag_lines

    out = Output(args)
    with make_client(args) as c:
        ev = c.evidence(args.id)
        bundle = c.get(args.id, live=False).get("evidence_bundle")
    if bundle and args.json:
        out.note(f"evidence bundle: {bundle_line(dict(bundle))}")  # --json keeps stdout the API's list

    def human() -> str:
        rows = [f"bundle     {bundle_line(dict(bundle))}"] if bundle else []
        for a in ev:
            val = a.get("validation") or {}
            rows.append(f"attempt {a['number']}: {a['verdict']:7} cause={a.get('cause')} exit={val.get('exit_code')}")
            rows += flag_lines(val)
            for ch in val.get("checks") or []:
                said = "passed" if ch["passed"] else f"failed cause={ch['cause']}"
                optional = "" if ch["required"] else " (not required)"
                rows.append(f"    check {ch['name']}{optional}: {said}: {ch['reason']}")
                rows += [f"        {f}" for f in ch.get("findings") or []]
                rows += [f"        pre-existing: {f}" for f in ch.get("pre_existing") or []]
            for role, url in (a.get("artifacts") or {}).items():
                rows.append(f"    {role:10} {url}")
        return "\n".join(rows)

    out.result(ev, human)
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
        write_output(args.output, content)
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
