"""Exit codes, output rules and the API client of the `crewwork` command line (docs/cli.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from crewwork.config import get_settings

# ---------------------------------------------------------------------------------------------- exit codes

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_API = 3
EXIT_UNAVAILABLE = 4
EXIT_TIMEOUT = 5
EXIT_VERIFY = 6
EXIT_NO_SANDBOX = 7
EXIT_FAILED = 10
EXIT_REJECTED = 11
EXIT_CANCELLED = 12
EXIT_DEAD = 13
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success (for a command that waits: the work item succeeded, or reached the state waited for)",
    EXIT_ERROR: "an unexpected error on this side (a bug: the message says what)",
    EXIT_USAGE: "usage: bad arguments, an input file that is missing or not valid JSON, a setting that does not "
    "parse, no API key, a port that is taken, no store where a local command looks",
    EXIT_API: "the API refused the request (4xx: invalid submission, unknown id, not allowed, conflict, ...)",
    EXIT_UNAVAILABLE: "the API is unreachable or unavailable (connection refused, 5xx, Temporal unavailable)",
    EXIT_TIMEOUT: "--timeout passed before the work item reached the state waited for",
    EXIT_VERIFY: "`verify`: the evidence bundle does not verify; `webhooks verify`: the delivery does not verify",
    EXIT_NO_SANDBOX: "`demo`: no isolating sandbox here (the message says what to install; `--unsafe` runs without)",
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


def write_output(path: str, data: bytes) -> None:
    """Write what a command downloaded to `path` (`-o`), or say in one line why it cannot be (exit 2)."""
    try:
        Path(path).write_bytes(data)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None


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
    """(API URL, key) for the API commands; `args.key_source` says where the key came from (for error messages)."""
    s = get_settings()
    url = getattr(args, "api_url", None) or s.api_url
    key = s.api_key
    args.key_source = "CREWWORK_API_KEY"
    if not key:
        kf = s.data_dir.resolve() / "api_key"
        args.key_source = str(kf)
        try:
            key = kf.read_text().strip() or None
        except FileNotFoundError:
            key = None
        except OSError as exc:
            raise CliError(f"cannot read the API key file {kf}: {exc.strerror or exc}") from None
    return url.rstrip("/"), key


def check_api_url(url: str) -> None:
    """A usage error for an API URL that cannot be one (no scheme, no host): before, `127.0.0.1:8080` was reported
    as an API that is not running."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # a port that is not a number raises
    except ValueError:
        ok = False
    if not ok:
        raise CliError(
            f"the API URL {url!r} (--api-url or CREWWORK_API_URL) is not an http:// or https:// URL with a host, "
            "e.g. http://127.0.0.1:8080"
        )


def make_client(args: argparse.Namespace) -> Any:
    from crewwork.client import Client

    url, key = client_settings(args)
    check_api_url(url)
    if not key:
        raise CliError(
            f"no API key: set CREWWORK_API_KEY, or run this where `crewwork dev` keeps its data (it writes the key "
            f"to DATA/api_key; looked for {args.key_source}; CREWWORK_DATA_DIR says where DATA is)"
        )
    return Client(url, key)


def _read_json(path_arg: str, what: str = "", *, obj: bool = True) -> Any:
    """The JSON document in file `path_arg` ('-': stdin), as crewwork.boundary.jsonvalues parses a request body: what the
    store cannot keep (NaN, 1e999, a duplicate key) is a usage error naming the field, never a traceback later.
    `obj`: the document must be a JSON object."""
    from crewwork.boundary.jsonvalues import JsonRefused, loads

    name = path_arg if path_arg != "-" else "stdin"
    try:
        text = sys.stdin.read() if path_arg == "-" else Path(path_arg).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"no such file: {path_arg}") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{name} is not UTF-8 text{what}: {exc}") from None
    except OSError as exc:
        raise CliError(f"cannot read {path_arg}: {exc.strerror or exc}") from None
    try:
        value = loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{name} is not valid JSON{what}: {exc}") from None
    except JsonRefused as exc:
        raise CliError(f"{name}{what}: {exc}") from None
    if obj and not isinstance(value, dict):
        raise CliError(f"{name}{what} must hold a JSON object ({{...}}), not {type(value).__name__}")
    return value


def _stamp(ev: dict[str, Any] | None = None) -> str:
    """The local time an event happened (its `created_at`, on the store's clock), not when it is printed: `wait`
    replays the events before it started, which all got the time of printing."""
    at = (ev or {}).get("created_at")
    return time.strftime("%H:%M:%S", time.localtime(at if isinstance(at, int | float) else None))


def _follow(c: Any, out: Output, wid: str, until: Sequence[str] | None, timeout_s: float | None) -> dict[str, Any]:
    """Wait on the event stream, showing each state change as progress."""

    def on_event(ev: dict[str, Any]) -> None:
        if ev["type"] == "state_changed":
            d = ev.get("data") or {}
            out.progress(f"  {_stamp(ev)} {wid} {d.get('state')}: {d.get('reason', '')}")

    item: dict[str, Any] = c.wait(wid, until=until, timeout_s=timeout_s, on_event=on_event)
    out.clear_live()
    return item
