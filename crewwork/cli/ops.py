"""The local commands: worker, api, db, reconcile, keys, dev, demo, config, completion."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from crewwork.cli.common import EXIT_ERROR, EXIT_NO_SANDBOX, EXIT_OK, EXIT_USAGE, CliError, Output
from crewwork.config import Settings, get_settings

# ---------------------------------------------------------------------------------------------- local commands


def require_store(s: Settings, command: str) -> None:
    """A usage error when a command that uses the store would create a new, empty SQLite store instead: run in
    another directory, the default `.crewwork/crewwork.db` is a different file (before: silently a new store, with
    none of the keys or items the user expected). `crewwork db upgrade` is the command that creates one."""
    url = s.resolved_database_url()
    if not url.startswith("sqlite"):
        return
    path = url.split(":///", 1)[-1].split("?", 1)[0]
    if not path or path == ":memory:" or Path(path).exists():
        return
    where = "CREWWORK_DATABASE_URL" if s.database_url else "the data directory (CREWWORK_DATA_DIR, default ./.crewwork)"
    raise CliError(
        f"crewwork {command}: there is no store at {path} ({where}); run it where `crewwork dev` keeps its data, or "
        "set CREWWORK_DATA_DIR or CREWWORK_DATABASE_URL to the store you mean; `crewwork db upgrade` creates a new one"
    )


def cmd_worker(args: argparse.Namespace) -> int:
    from crewwork.cli import eventloop
    from crewwork.workers.pools import StartupRefused, run_pools

    s = _settings_for(args)
    require_store(s, "worker")
    setup_logging(s)
    try:
        eventloop.run(run_pools(args.pool, s), s)
    except StartupRefused as exc:
        raise CliError(_refused("worker", exc)) from None
    return EXIT_OK


def _refused(command: str, exc: Exception) -> str:
    return "\n".join(f"crewwork {command}: {line}" for line in str(exc).splitlines())


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from crewwork.api.edge import uvicorn_proxy_options
    from crewwork.cli import eventloop
    from crewwork.cli.serve import ApiServer, api_app
    from crewwork.observability import tracing

    s = _settings_for(args)
    require_store(s, "api")
    _check_ports_free(
        [(args.port or s.api_port, "the API", "--port (or CREWWORK_API_PORT)")], "api", args.host or s.api_host
    )
    setup_logging(s)
    tracing.configure(s, "crewwork-api")
    loop, http = eventloop.uvicorn_options(s)
    app = api_app(s)
    config = uvicorn.Config(
        app,
        host=args.host or s.api_host,
        port=args.port or s.api_port,
        log_level=s.log_level.lower(),
        access_log=False,
        loop=loop,
        http=http,
        log_config=None,  # uvicorn's loggers go through crewwork's formatter (setup_logging)
        **uvicorn_proxy_options(s.api_forwarded_allow_ips),
    )
    try:
        # ApiServer: a shutdown ends the open event streams first (resumable), instead of waiting on them.
        ApiServer(config, app).run()
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

    from crewwork.boundary.masking import mask_text
    from crewwork.store.db import current_revision, upgrade

    url = get_settings().resolved_database_url()
    if args.action == "upgrade":
        asyncio.run(upgrade(url))
    else:
        require_store(get_settings(), "db current")
    rev = asyncio.run(current_revision(url))
    shown = mask_text(url)
    if args.action == "upgrade":
        human = f"store schema is at {rev} ({shown})"
    else:
        human = rev or "(empty: run `crewwork db upgrade`)"
    Output(args).result({"revision": rev, "database": shown}, human)
    return EXIT_OK


def cmd_reconcile(args: argparse.Namespace) -> int:
    """One reconciler cycle over every open item, a page of --batch at a time (what every control pool works
    through a page per CREWWORK_RECONCILE_INTERVAL_S)."""
    import asyncio

    from crewwork.admission.reconcile import Reconciler
    from crewwork.store.store import Store
    from crewwork.temporal.client import connect

    s = get_settings()
    require_store(s, "reconcile")

    async def once() -> dict[str, Any]:
        store = Store(s.resolved_database_url())
        try:
            rec = Reconciler(store, await connect(s), s)
            res = await rec.run_cycle(batch=args.batch, min_age_s=args.min_age, close_unknown=args.close_unknown)
        finally:
            await store.close()
        return {
            "checked": res.checked,
            "running": res.running,
            "closed": res.closed,
            "unknown": res.unknown,
            "started": res.started,
            "queued": res.queued,
            "errors": res.errors,
        }

    out = asyncio.run(once())
    human = (
        f"checked {out['checked']} open item(s): {out['running']} running, {len(out['closed'])} closed"
        + "".join(f"\n  closed {i}" for i in out["closed"])
        + "".join(f"\n  started {i} (admitted, its workflow's start had been lost)" for i in out["started"])
        + (f"\n{out['queued']} queued with no workflow yet (their tenant is at its limit)" if out["queued"] else "")
        + (
            f"\n{len(out['unknown'])} with no workflow in Temporal (left alone; --close-unknown ends them as dead)"
            if out["unknown"]
            else ""
        )
        + (f"\n{out['errors']} could not be checked (see the log)" if out["errors"] else "")
    )
    Output(args).result(out, human)
    return EXIT_ERROR if out["errors"] else EXIT_OK


def cmd_keys(args: argparse.Namespace) -> int:
    import asyncio

    from crewwork.store.db import upgrade
    from crewwork.store.store import Store

    out = Output(args)
    require_store(get_settings(), f"keys {args.action}")

    async def run() -> int:
        url = get_settings().resolved_database_url()
        await upgrade(url)
        st = Store(url)
        try:
            if args.action == "create":
                if not args.tenant:
                    raise CliError("keys create needs --tenant")
                try:
                    kid, plain = await st.create_api_key(args.tenant, ["admin"] if args.admin else [])
                except ValueError as exc:  # a name shaped like a tenant id that names no tenant
                    raise CliError(str(exc)) from None
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
    from crewwork.cli.stack import Stack
    from crewwork.workers.pools import StartupRefused, startup_check

    out = Output(args)
    s = get_settings()
    try:
        # What the stack's control pool would refuse: said here, once, instead of a pool restarting forever.
        for warning in startup_check(["control"], s):
            out.note(f"[dev] WARNING: {warning}")
    except StartupRefused as exc:
        raise CliError(_refused("dev", exc)) from None
    ui_port = args.ui_port or args.temporal_port + 1000
    _check_ports_free(
        [
            (args.temporal_port, "the Temporal server", "--temporal-port"),
            (ui_port, "the Temporal Web UI", "--ui-port"),
            (args.api_port, "the API", "--api-port"),
        ]
    )
    stack = Stack(
        data_dir=Path(args.data_dir or s.data_dir).resolve(),
        temporal_port=args.temporal_port,
        ui_port=ui_port,
        api_port=args.api_port,
        database_url=s.database_url,
        on_event=lambda m: out.note(f"[dev] {m}"),
        healthy_after_s=s.pool_restart_healthy_s,
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
    cli_env = _cli_env_for(stack, s)
    point = "".join(f"  export {k}={v}\n" for k, v in cli_env.items())
    out.result(
        {
            "api_url": stack.api_url,
            "console_url": f"{stack.api_url}/console",
            "temporal_ui_url": stack.ui_url,
            "data_dir": str(stack.data_dir),
            "api_key_file": str(stack.data_dir / "api_key"),
            "cli_env": cli_env,
        },
        f"\ncrewwork is running (data in {stack.data_dir}).\n"
        f"  API          {stack.api_url}   (OpenAPI: {stack.api_url}/docs)\n"
        f"  console      {stack.api_url}/console\n"
        f"  Temporal UI  {stack.ui_url}\n"
        f"  API key      in {stack.data_dir / 'api_key'}\n"
        + (f"Point the CLI (in another shell) at this stack:\n{point}" if point else "")
        + "Submit with `crewwork submit FILE.json`. Ctrl-C stops everything.\n",
    )
    _warn_without_sandbox(out, s)
    while not stop:
        time.sleep(0.5)
    out.note("[dev] stopping…")
    stack.stop()
    return EXIT_OK


def _check_ports_free(ports: list[tuple[int, str, str]], command: str = "dev", host: str = "127.0.0.1") -> None:
    """A usage error naming the option for the first port that is out of range or taken (before: "a bug", exit 1,
    once the Temporal server or uvicorn had failed to start)."""
    import socket

    for port, what, option in ports:
        if not 1 <= port <= 65535:
            raise CliError(f"crewwork {command}: {option} {port} is not a TCP port (1-65535)")
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise CliError(f"crewwork {command}: cannot listen on {host!r}: {exc}") from None
        family, _, _, _, address = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise CliError(
                    f"crewwork {command}: port {port} for {what} on {host} is not free ({exc.strerror}); choose "
                    f"another with {option} (or stop what listens there)"
                ) from None


def _cli_env_for(stack: Any, s: Settings) -> dict[str, str]:
    """What another shell must export for the CLI to reach this stack, where its defaults would not: the API URL
    (another --api-port) and the data directory holding the API key (another --data-dir, or this one seen from
    elsewhere)."""
    env: dict[str, str] = {}
    if s.api_url.rstrip("/") != stack.api_url:
        env["CREWWORK_API_URL"] = stack.api_url
    if not s.api_key and s.data_dir.resolve() != stack.data_dir:
        env["CREWWORK_DATA_DIR"] = str(stack.data_dir)
    return env


def _warn_without_sandbox(out: Output, s: Settings) -> None:
    """Work items run code only in an isolating sandbox: where none works, say so once, at start, with the fix."""
    from crewwork.sandbox.backends import INSTALL_HINT, best_available

    try:
        name, _why = best_available(s.sandbox)
    except Exception as exc:
        out.note(f"[dev] warning: the configured sandbox cannot run here ({exc}); work items that run code will fail")
        return
    if name == "local" and not s.allow_unsafe_sandbox:
        out.note(f"[dev] warning: {INSTALL_HINT}; until then work items that run code fail")


def cmd_demo(args: argparse.Namespace) -> int:
    from crewwork.cli.demo import NoSandbox, run_demo

    try:
        return run_demo(
            keep=args.keep,
            data_dir=Path(args.data_dir) if args.data_dir else None,
            serve=args.serve,
            json_output=bool(args.json),
            unsafe=args.unsafe,
            restart_healthy_s=get_settings().pool_restart_healthy_s,
        )
    except NoSandbox as exc:
        if args.json:
            Output(args).result({"ok": False, "error": str(exc)})
        raise CliError(str(exc), EXIT_NO_SANDBOX) from None


def cmd_config(args: argparse.Namespace) -> int:
    """Every variable with the value in force here (from the environment, or the default), secrets masked."""
    from crewwork.attestation.publish import check_signing_key
    from crewwork.config import Settings, describe_settings

    current = Settings()  # a variable that does not parse: crewwork.cli.main names it
    rows = describe_settings(current=current)

    def human() -> str:
        lines = []
        for r in rows:
            where = "set" if r["set"] else "default"
            lines.append(f"{r['env']:36} {where:7} {r['value']!r:40} {r['description']}")
        return "\n".join(lines)

    out = Output(args)
    out.result(rows, human)
    # Settings that parse but that a process would refuse at start-up (control pools: the evidence signing key).
    check = check_signing_key(current.evidence)
    for warning in check.warnings:
        print(f"crewwork config: WARNING: {warning}", file=sys.stderr)
    for error in check.errors:
        print(f"crewwork config: control pools will refuse to start: {error}", file=sys.stderr)
    return EXIT_USAGE if check.errors else EXIT_OK


def setup_logging(settings: Settings | None = None) -> None:
    from crewwork.observability.logs import configure_logging

    s = settings or get_settings()
    configure_logging(s.log_level, json_logs=s.log_format == "json")
