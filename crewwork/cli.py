"""The `crewwork` command line: dev, demo, submit, status, review, cancel, worker, api, db, keys, sandbox, config."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from crewwork.config import Settings, get_settings


def _client_settings(args: argparse.Namespace) -> tuple[str, str | None]:
    s = get_settings()
    url = getattr(args, "api_url", None) or s.api_url
    key = s.api_key
    if not key:
        kf = s.data_dir / "api_key"
        if kf.exists():
            key = kf.read_text().strip()
    return url.rstrip("/"), key


def _api(args: argparse.Namespace, method: str, path: str, **kw: Any) -> httpx.Response:
    url, key = _client_settings(args)
    headers = kw.pop("headers", {})
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        return httpx.request(method, f"{url}{path}", headers=headers, timeout=30, **kw)
    except httpx.ConnectError:
        sys.exit(f"crewwork: cannot reach the API at {url}; is `crewwork dev` (or `crewwork api`) running?")


def _fail_on_problem(r: httpx.Response) -> None:
    if r.status_code < 400:
        return
    try:
        p = r.json()
        msg = f"{p.get('title', 'error')} ({r.status_code}, {p.get('code', '')}): {p.get('detail', '')}"
    except ValueError:
        msg = f"HTTP {r.status_code}: {r.text[:500]}"
    sys.exit(f"crewwork: {msg}")


# ---------------------------------------------------------------------------------------------- commands


def cmd_submit(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        body = json.loads(sys.stdin.read() if args.file == "-" else path.read_text())
    except FileNotFoundError:
        sys.exit(f"crewwork: no such file: {path}")
    except json.JSONDecodeError as exc:
        sys.exit(f"crewwork: {path} is not valid JSON: {exc}")
    if isinstance(body, dict) and isinstance(body.get("repo"), dict):
        url = body["repo"].get("url", "")
        # A relative local path in a file means "relative to where I run the command".
        if url and "://" not in url and not url.startswith("/") and Path(url).exists():
            body["repo"]["url"] = str(Path(url).resolve())
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
    r = _api(args, "POST", "/v1/work-items", json=body, headers=headers)
    _fail_on_problem(r)
    data = r.json()
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(f"{data['id']}  {'submitted' if data['created'] else 'already submitted'}  ({data['state']})")
    if args.wait:
        return _wait(args, data["id"])
    return 0


def _wait(args: argparse.Namespace, wid: str) -> int:
    last = None
    while True:
        r = _api(args, "GET", f"/v1/work-items/{wid}")
        _fail_on_problem(r)
        item = r.json()
        line = f"{item['state']}: {item['reason']}"
        if line != last:
            print(f"  {time.strftime('%H:%M:%S')} {line}", flush=True)
            last = line
        if item["state"] in ("succeeded", "failed", "rejected", "cancelled", "dead"):
            return 0 if item["state"] == "succeeded" else 1
        time.sleep(0.5)


def cmd_status(args: argparse.Namespace) -> int:
    r = _api(args, "GET", f"/v1/work-items/{args.id}")
    _fail_on_problem(r)
    item = r.json()
    if args.json:
        print(json.dumps(item, indent=2))
        return 0
    print(render_item(item))
    return 0


def render_item(item: dict[str, Any]) -> str:
    lines = [
        f"work item   {item['id']}  ({item['kind']}{', MOCK agent' if item.get('mock') else ''})",
        f"state       {item['state']}  {item['reason']}",
        f"attempts    {item['attempt_count']}",
    ]
    if item.get("delivery_branch"):
        lines.append(f"delivered   {item['delivery_branch']} @ {(item.get('landed_commit') or '')[:12]}")
    if item.get("pull_request_url"):
        lines.append(f"pull req.   {item['pull_request_url']}")
    for a in item.get("attempts") or []:
        val = a.get("validation") or {}
        tests = val.get("tests") or []
        npass = sum(1 for t in tests if t["outcome"] == "passed")
        lines.append(
            f"  attempt {a['number']}: {a['verdict']:7} {a['reason']}"
            + (f"  [{npass}/{len(tests)} tests passed, exit {val.get('exit_code')}]" if tests else "")
        )
    if item.get("result") and item["result"].get("output") is not None:
        lines.append(f"output      {json.dumps(item['result']['output'])}")
    lines.append(f"temporal    {item['links'].get('temporal_ui', '')}")
    return "\n".join(lines)


def cmd_review(args: argparse.Namespace) -> int:
    if args.approve:
        body = {"action": "approve", "comment": args.comment}
    elif args.reject:
        body = {"action": "reject", "comment": args.comment}
    else:
        body = {"action": "request_changes", "comment": args.request_changes}
    r = _api(args, "POST", f"/v1/work-items/{args.id}/review", json=body)
    _fail_on_problem(r)
    print(r.json()["message"])
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    r = _api(args, "POST", f"/v1/work-items/{args.id}/cancel")
    _fail_on_problem(r)
    print(r.json()["message"])
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.state:
        params["state"] = args.state
    r = _api(args, "GET", "/v1/work-items", params=params)
    _fail_on_problem(r)
    for it in r.json()["items"]:
        print(f"{it['id']}  {it['kind']:11} {it['state']:16} {it['reason'][:70]}")
    return 0


def cmd_hotfix(args: argparse.Namespace) -> int:
    trace = ""
    if args.trace_file:
        try:
            trace = sys.stdin.read() if args.trace_file == "-" else Path(args.trace_file).read_text()
        except FileNotFoundError:
            sys.exit(f"crewwork: no such file: {args.trace_file}")
    repo = args.repo if "://" in args.repo else str(Path(args.repo).resolve())
    body: dict[str, Any] = {"message": args.message, "stack_trace": trace, "repo": {"url": repo, "ref": args.ref}}
    if args.test_command:
        import shlex

        body["test_command"] = shlex.split(args.test_command)
    if args.agent_file:
        try:
            body["agent"] = json.loads(Path(args.agent_file).read_text())
        except (FileNotFoundError, json.JSONDecodeError) as exc:
            sys.exit(f"crewwork: cannot read the agent spec {args.agent_file}: {exc}")
    if args.no_review:
        body["review"] = {"required": False}
    r = _api(args, "POST", "/v1/hotfix", json=body)
    _fail_on_problem(r)
    data = r.json()
    print(f"{data['id']}  hotfix {'submitted' if data['created'] else 'already submitted'}  ({data['state']})")
    return _wait(args, data["id"]) if args.wait else 0


def cmd_worker(args: argparse.Namespace) -> int:
    from crewwork.workers.pools import run_pool

    _setup_logging()
    asyncio.run(run_pool(args.pool, get_settings()))
    return 0


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from crewwork.api.app import create_app

    _setup_logging()
    s = get_settings()
    uvicorn.run(
        create_app(s),
        host=args.host or s.api_host,
        port=args.port or s.api_port,
        log_level=s.log_level.lower(),
        access_log=False,
    )
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from crewwork.store.db import current_revision, upgrade

    url = get_settings().resolved_database_url()
    if args.action == "upgrade":
        asyncio.run(upgrade(url))
        print(f"store schema is at {asyncio.run(current_revision(url))} ({_redact_url(url)})")
    else:
        print(asyncio.run(current_revision(url)) or "(empty: run `crewwork db upgrade`)")
    return 0


def _redact_url(url: str) -> str:
    import re

    return re.sub(r"//([^:/@]+):[^@]+@", r"//\1:***@", url)


def cmd_keys(args: argparse.Namespace) -> int:
    from crewwork.store.db import upgrade
    from crewwork.store.store import Store

    async def run() -> int:
        url = get_settings().resolved_database_url()
        await upgrade(url)
        st = Store(url)
        try:
            if args.action == "create":
                if not args.tenant:
                    sys.exit("crewwork: keys create needs --tenant")
                kid, plain = await st.create_api_key(args.tenant, ["admin"] if args.admin else [])
                print(f"key id {kid} for tenant {args.tenant}\n{plain}\n(shown once; only its hash is stored)")
            elif args.action == "revoke":
                if not args.key_id:
                    sys.exit("crewwork: keys revoke needs the key id")
                ok = await st.revoke_api_key(args.key_id)
                print("revoked" if ok else "no such active key")
                return 0 if ok else 1
            else:
                for k in await st.list_api_keys(args.tenant):
                    state = "revoked" if k["revoked"] else "active"
                    print(f"{k['id']}  {k['tenant']:20} {k['prefix']}…  {state}  {k['scopes']}")
            return 0
        finally:
            await st.close()

    return asyncio.run(run())


def cmd_dev(args: argparse.Namespace) -> int:
    from crewwork.stack import Stack

    s = get_settings()
    stack = Stack(
        data_dir=Path(args.data_dir or s.data_dir).resolve(),
        temporal_port=args.temporal_port,
        ui_port=args.ui_port or args.temporal_port + 1000,
        api_port=args.api_port,
        database_url=s.database_url,
        on_event=lambda m: print(f"[dev] {m}", flush=True),
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
        sys.exit(f"crewwork dev: {exc}")
    print(
        f"\ncrewwork is running (data in {stack.data_dir}).\n"
        f"  API          {stack.api_url}   (OpenAPI: {stack.api_url}/docs)\n"
        f"  console      {stack.api_url}/console\n"
        f"  Temporal UI  {stack.ui_url}\n"
        f"  API key      in {stack.data_dir / 'api_key'}\n"
        f"Submit with `crewwork submit FILE.json`. Ctrl-C stops everything.\n",
        flush=True,
    )
    while not stop:
        time.sleep(0.5)
    print("[dev] stopping…", flush=True)
    stack.stop()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from crewwork.demo import run_demo

    return run_demo(keep=args.keep, data_dir=Path(args.data_dir) if args.data_dir else None)


def cmd_config(_args: argparse.Namespace) -> int:
    for name, f in Settings.model_fields.items():
        print(f"CREWWORK_{name.upper():28} default {f.default!r:40} {f.description}")
    return 0


def _setup_logging() -> None:
    level = get_settings().log_level.upper()
    logging.basicConfig(
        level=level,
        format='{"ts":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}',
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="crewwork", description="A durable runtime for AI agent work on Temporal.")
    p.add_argument("--api-url", help="API base URL (default $CREWWORK_API_URL)")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("dev", help="run Temporal, the API and all worker pools on this machine")
    d.add_argument("--data-dir")
    d.add_argument("--temporal-port", type=int, default=7233)
    d.add_argument("--ui-port", type=int, help="Temporal Web UI port (default: Temporal port + 1000)")
    d.add_argument("--api-port", type=int, default=8080)
    d.set_defaults(fn=cmd_dev)

    d = sub.add_parser("demo", help="the end-to-end demo on the embedded defaults")
    d.add_argument("--keep", action="store_true", help="keep the demo's data directory")
    d.add_argument("--data-dir")
    d.set_defaults(fn=cmd_demo)

    d = sub.add_parser("submit", help="submit a work item from a JSON file ('-' for stdin)")
    d.add_argument("file")
    d.add_argument("--wait", action="store_true", help="follow it until it ends; exit 0 only on success")
    d.add_argument("--json", action="store_true")
    d.add_argument("--idempotency-key")
    d.set_defaults(fn=cmd_submit)

    d = sub.add_parser("hotfix", help="hand off an error report as a `hotfix` work item")
    d.add_argument("--repo", required=True, help="repository path or file:// URL")
    d.add_argument("--ref", default="HEAD")
    d.add_argument("--message", required=True, help="the error message")
    d.add_argument("--trace-file", help="file with the stack trace ('-' for stdin)")
    d.add_argument("--test-command", help="a command that fails now and must pass after the fix (quoted)")
    d.add_argument("--agent-file", help="JSON file with the agent spec ({name, config})")
    d.add_argument("--no-review", action="store_true", help="land without waiting for a person")
    d.add_argument("--wait", action="store_true")
    d.set_defaults(fn=cmd_hotfix)

    d = sub.add_parser("status", help="show a work item")
    d.add_argument("id")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_status)

    d = sub.add_parser("list", help="list work items")
    d.add_argument("--state")
    d.add_argument("--limit", type=int, default=20)
    d.set_defaults(fn=cmd_list)

    d = sub.add_parser("review", help="approve, reject or request changes")
    d.add_argument("id")
    g = d.add_mutually_exclusive_group(required=True)
    g.add_argument("--approve", action="store_true")
    g.add_argument("--reject", action="store_true")
    g.add_argument("--request-changes", metavar="MESSAGE")
    d.add_argument("--comment")
    d.set_defaults(fn=cmd_review)

    d = sub.add_parser("cancel", help="cancel a work item")
    d.add_argument("id")
    d.set_defaults(fn=cmd_cancel)

    d = sub.add_parser("worker", help="run one worker pool")
    d.add_argument("--pool", required=True, choices=["control", "agent", "validate"])
    d.set_defaults(fn=cmd_worker)

    d = sub.add_parser("api", help="run the HTTP API")
    d.add_argument("--host")
    d.add_argument("--port", type=int)
    d.set_defaults(fn=cmd_api)

    d = sub.add_parser("db", help="store schema migrations")
    d.add_argument("action", choices=["upgrade", "current"])
    d.set_defaults(fn=cmd_db)

    d = sub.add_parser("keys", help="API keys")
    d.add_argument("action", choices=["create", "revoke", "list"])
    d.add_argument("key_id", nargs="?")
    d.add_argument("--tenant")
    d.add_argument("--admin", action="store_true")
    d.set_defaults(fn=cmd_keys)

    d = sub.add_parser("config", help="list every configuration variable")
    d.set_defaults(fn=cmd_config)

    try:
        from crewwork.sandbox.cli import add_sandbox_commands

        add_sandbox_commands(sub)
    except ImportError:  # pragma: no cover - the sandbox CLI is optional during development
        pass
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.api_url:
        os.environ["CREWWORK_API_URL"] = args.api_url
    rc = args.fn(args)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
