"""Logs are real JSON (one object per line, exceptions as a field) or real plain text, uvicorn's loggers included,
and secrets never reach a line: database URLs (SQLAlchemy's rendering with the password hidden), PEM private keys,
bearer tokens and the common token prefixes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from crewwork.boundary.masking import mask_text
from tests.conftest import api_process

PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx\nabc\n-----END RSA PRIVATE KEY-----"
SECRETS = {
    "db": "postgresql+asyncpg://crew:s3cr3t-pw@db.internal:5432/crewwork",
    "bearer": "Authorization: Bearer abcdefghijklmnop123",
    "sk": "sk-proj-ABCDEFGHIJKLMNOPQRSTUV",
    "cw": "cw_AbCdEfGhIjKlMnOpQrStUv",
    "ghp": "ghp_0123456789abcdefghijABCDEFGHIJ",
    "whsec": "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
}
LEAKS = [
    "s3cr3t-pw",
    "abcdefghijklmnop123",
    "ABCDEFGHIJKLMNOPQRSTUV",
    "AbCdEfGhIjKlMnOpQrStUv",
    "0123456789abcdefghij",
    "MDEyMzQ1Njc4OWFi",
    "MIIEowIBAAKCAQEAx",
]

SCRIPT = r"""
import logging, sys
from crewwork.observability.logs import configure_logging
configure_logging("INFO", json_logs=sys.argv[1] == "json")
log = logging.getLogger("crewwork.test")
log.info('a "quoted" message with\na newline and %s', "an arg")
for name, value in SECRETS.items():
    log.warning("secret %s: %s", name, value)
log.error("key material:\n%s", PEM)
try:
    raise RuntimeError("boom with " + SECRETS["db"])
except RuntimeError:
    log.exception("it failed")
logging.getLogger("uvicorn.error").info("Uvicorn says hello")
log.info("extra fields", extra={"url": SECRETS["db"], "n": 3})
"""


def run(fmt: str) -> str:
    prelude = f"SECRETS = {SECRETS!r}\nPEM = {PEM!r}\n"
    res = subprocess.run([sys.executable, "-c", prelude + SCRIPT, fmt], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stderr


def test_json_logs_are_one_json_object_per_line_with_secrets_masked() -> None:
    out = run("json")
    lines = out.splitlines()
    records = [json.loads(line) for line in lines]  # every line is a complete JSON object
    assert records[0]["msg"] == 'a "quoted" message with\na newline and an arg'
    failed = next(r for r in records if r["msg"] == "it failed")
    assert "Traceback" in failed["exc"] and "RuntimeError" in failed["exc"]
    assert any(r["logger"] == "uvicorn.error" and r["msg"] == "Uvicorn says hello" for r in records)
    db = next(r for r in records if r["msg"].startswith("secret db"))
    assert "postgresql+asyncpg://crew:***@db.internal:5432/crewwork" in db["msg"]
    extra = next(r for r in records if r["msg"] == "extra fields")
    assert extra["n"] == 3 and "***" in extra["url"]
    for leak in LEAKS:
        assert leak not in out, leak


def test_text_logs_are_plain_lines_with_secrets_masked() -> None:
    out = run("text")
    first = out.splitlines()[0]
    assert ' INFO crewwork.test a "quoted" message with' in first and not first.startswith("{")
    assert "Uvicorn says hello" in out and "Traceback" in out
    for leak in LEAKS:
        assert leak not in out, leak


def test_masking_keeps_what_is_not_secret() -> None:
    assert mask_text("sqlite+aiosqlite:////tmp/x.db and http://example.test/a") == (
        "sqlite+aiosqlite:////tmp/x.db and http://example.test/a"
    )
    assert mask_text("postgresql://user:p%40ss@h/db") == "postgresql://user:***@h/db"


def test_the_api_process_writes_uvicorns_lines_as_json(tmp_path: Path) -> None:
    with api_process(tmp_path, CREWWORK_LOG_FORMAT="json") as (_proc, _port, log):
        pass
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    records = [json.loads(ln) for ln in lines]  # nothing but JSON lines, uvicorn's included
    assert any(r["logger"].startswith("uvicorn") and "Uvicorn running" in r["msg"] for r in records), lines[:5]
    assert any(r["logger"] == "crewwork.api" and "not reachable yet" in r["msg"] for r in records), lines[:5]
