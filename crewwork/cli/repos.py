"""`crewwork repos add|list|remove|flaky`: the tenant's registered repositories, and each one's flaky tests, through
the API (docs/repositories.md).

An operator (an admin key) acts for any tenant with `--tenant NAME` (or id)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any


def add_parser(
    add: Callable[[str, str, Callable[[argparse.Namespace], int]], argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    d = add("repos", "register, list and remove the tenant's repositories", cmd_repos)
    rs = d.add_subparsers(dest="repos_command", required=True)
    a = rs.add_parser(
        "add", help="register a repository (URL or a local path under the tenant's roots)", parents=[common]
    )
    a.add_argument("url")
    a.add_argument("--ref", default="HEAD", help="default ref of its work items (default HEAD)")
    a.add_argument(
        "--credential", metavar="NAME", help="name of an operator-held credential (CREWWORK_REPO_CREDENTIALS)"
    )
    a.add_argument("--protect", action="append", metavar="PATH", help="a protected path (repeatable)")
    a.add_argument("--environment-file", metavar="FILE", help="JSON file with the default environment")
    a.add_argument(
        "--checks-file", metavar="FILE", help="JSON file with the named checks every item runs (a list; docs/checks.md)"
    )
    a.add_argument("--tenant", help="admin keys: register for this tenant (name or id)")
    ls = rs.add_parser("list", help="the tenant's repositories", parents=[common])
    ls.add_argument("--tenant", help="admin keys: this tenant's repositories (name or id)")
    ls.add_argument("--all-tenants", action="store_true", help="admin keys: every tenant's repositories")
    rm = rs.add_parser("remove", help="unregister a repository (submitted work items keep running)", parents=[common])
    rm.add_argument("id")
    fl = rs.add_parser(
        "flaky", help="the repository's flaky tests (seen failing, then passing on the same tree)", parents=[common]
    )
    fl.add_argument("id")


def _line(r: dict[str, Any]) -> str:
    cred = f"  credential={r['credential']}" if r.get("credential") else ""
    return f"{r['id']}  {r['url']}  @{r['default_ref']}{cred}"


def _flaky_line(f: dict[str, Any]) -> str:
    from crewwork.cli.render import terminal_text

    # The test id and the runs line come from the repository's own report: plain text, one line each.
    return (
        f"{terminal_text(f['test_id'], 300)}  x{f['times']}  last {f['last_work_item_id']} attempt "
        f"{f['last_attempt']}: {terminal_text(f['last_runs'], 600)}"
    )


def cmd_repos(args: argparse.Namespace) -> int:
    from crewwork.cli.common import EXIT_OK, CliError, Output, _read_json, make_client

    out = Output(args)
    body: dict[str, Any] = {}
    if args.repos_command == "add":
        # A relative local path means "relative to where I run the command", as in `submit` and `hotfix`.
        url = args.url if "://" in args.url or ":" in args.url.split("/", 1)[0] else str(Path(args.url).resolve())
        body = {"url": url, "default_ref": args.ref, "protect_paths": args.protect or []}
        if args.credential:
            body["credential"] = args.credential
        if args.environment_file:
            body["environment"] = _read_json(args.environment_file, " (the environment)")
        if args.checks_file:
            checks = _read_json(args.checks_file, " (the checks)", obj=False)
            if not isinstance(checks, list):
                raise CliError(f"{args.checks_file} (the checks) must hold a JSON list ([...]) of checks")
            body["checks"] = checks
    with make_client(args) as c:
        if args.repos_command == "add":
            repo = c.create_repository(body, tenant=args.tenant)
            out.result(repo, _line(repo))
        elif args.repos_command == "list":
            rows = c.repositories(tenant=args.tenant, all_tenants=args.all_tenants)
            out.result(rows, lambda: "\n".join(_line(r) for r in rows) or "(no repositories)")
        elif args.repos_command == "flaky":
            flaky = c.flaky_tests(args.id)
            out.result(flaky, lambda: "\n".join(_flaky_line(f) for f in flaky) or "(no flaky tests seen)")
        elif args.repos_command == "remove":
            c.delete_repository(args.id)
            out.result({"id": args.id, "deleted": True}, f"removed {args.id}")
    return EXIT_OK
