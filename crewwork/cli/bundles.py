"""`crewwork bundle ID`, `crewwork verify BUNDLE`, `crewwork signing-key generate|show`: signed evidence bundles
(docs/evidence.md). `verify` is offline: no API, no store, no network; it trusts only the keys it is given."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crewwork.cli.common import EXIT_OK, EXIT_USAGE, EXIT_VERIFY, CliError, Output, write_output


def add_parser(
    add: Callable[[str, str, Callable[[argparse.Namespace], int]], argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    d = add("bundle", "download a work item's signed evidence bundle (or one attempt's, signed on request)", cmd_bundle)
    d.add_argument("id")
    d.add_argument("--attempt", type=int, metavar="N", help="attempt N's bundle (signed now if it was not yet)")
    d.add_argument("--output", "-o", metavar="FILE", help="write it here (default: stdout)")

    d = add(
        "verify",
        "verify an evidence bundle offline: signatures against --key, subjects against --repo and the files; "
        "exit 6 if it does not verify",
        cmd_verify,
    )
    d.add_argument("bundle", help="the bundle file ('-' for stdin)")
    d.add_argument(
        "--key",
        action="append",
        metavar="PUB",
        help="a trusted public key: a PEM file or a keys document (GET /evidence/keys); repeatable, at least one",
    )
    d.add_argument("--repo", metavar="PATH", help="the repository holding the landed commit (a clone, or bare)")
    d.add_argument("--files", metavar="DIR", help="a directory with subject files the bundle does not embed")
    d.add_argument("--threshold", type=int, default=1, metavar="N", help="distinct trusted keys per envelope (1)")
    d.add_argument("--work-item", metavar="ID", help="refuse a bundle about any other work item")
    d.add_argument("--commit", metavar="REV", help="refuse a bundle about any other commit (needs --repo)")
    d.add_argument(
        "--allow-unchecked", action="store_true", help="accept subjects that cannot be checked (listed as such)"
    )

    d = add("signing-key", "the operator's evidence signing keys", cmd_signing_key)
    ks = d.add_subparsers(dest="signing_key_command", required=True)
    g = ks.add_parser("generate", help="a new Ed25519 key pair: PATH (private, 0600) and PATH.pub", parents=[common])
    g.add_argument("path")
    ks.add_parser(
        "show",
        help="the keys this deployment publishes (from CREWWORK_EVIDENCE_*), as GET /evidence/keys",
        parents=[common],
    )


def cmd_bundle(args: argparse.Namespace) -> int:
    from crewwork.cli.common import make_client
    from crewwork.client import ApiError

    out = Output(args)
    with make_client(args) as c:
        try:
            data = c.evidence_bundle(args.id, attempt=args.attempt)
        except ApiError as exc:
            if not (args.attempt is not None and exc.code == "no_evidence_bundle"):
                raise
            out.note(f"attempt {args.attempt} has no bundle yet: asking the control pool to sign one")
            data = c.sign_evidence_bundle(args.id, args.attempt)
    digest = hashlib.sha256(data).hexdigest()
    if args.output:
        write_output(args.output, data)
        out.result(
            {"id": args.id, "attempt": args.attempt, "output": args.output, "bytes": len(data), "sha256": digest},
            f"wrote {args.output} ({len(data)} bytes, sha256 {digest[:16]}…); verify it with: crewwork verify "
            f"{args.output} --repo PATH --key PUB",
        )
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from crewwork.attestation.format import MAX_BUNDLE_BYTES
    from crewwork.attestation.keys import EvidenceKeyError, load_trusted
    from crewwork.attestation.report import Report
    from crewwork.attestation.verify import verify_bundle

    out = Output(args)
    if not args.key:
        raise CliError(
            "crewwork verify: give the trusted public keys with --key (PEM files, or the keys document of "
            "GET /evidence/keys; docs/deployment.md, 'Evidence signing keys'): a bundle is verified against nothing "
            "else"
        )
    try:
        keys = load_trusted(Path(k) for k in args.key)
    except EvidenceKeyError as exc:
        raise CliError(f"crewwork verify: {exc}") from None
    data = _read_bundle(args.bundle, MAX_BUNDLE_BYTES)
    try:
        report = verify_bundle(
            data,
            keys,
            threshold=args.threshold,
            repo=Path(args.repo) if args.repo else None,
            files_dir=Path(args.files) if args.files else None,
            work_item=args.work_item,
            commit=args.commit,
            allow_unchecked=args.allow_unchecked,
        )
    except Exception as exc:
        # Fail closed: a bundle the verifier cannot get through is refused, in one line, never with a traceback
        # (and never accepted). Every such case found is a bug to fix by a rule above this guard.
        report = Report()
        report.problem(f"the verifier could not read this bundle ({type(exc).__name__}); it is not accepted")
    out.result(report.to_json(), report.human())
    return EXIT_OK if report.ok else EXIT_VERIFY


def _read_bundle(name: str, limit: int) -> bytes:
    try:
        if name == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(name, "rb") as f:
                data = f.read(limit + 1)
    except OSError as exc:
        raise CliError(f"crewwork verify: cannot read {name}: {exc.strerror}") from None
    return data  # one byte over the limit makes verify_bundle refuse it, naming the limit


def cmd_signing_key(args: argparse.Namespace) -> int:
    from crewwork.attestation.keys import EvidenceKeyError, generate

    out = Output(args)
    if args.signing_key_command == "generate":
        try:
            key = generate(Path(args.path))
        except EvidenceKeyError as exc:
            raise CliError(f"crewwork signing-key: {exc}") from None
        out.result(
            {"keyid": key.keyid, "private": args.path, "public": key.source},
            f"keyid {key.keyid}\nprivate key {args.path} (mode 0600: give it to control pools only, as "
            f"CREWWORK_EVIDENCE_SIGNING_KEY_FILE)\npublic key  {key.source} (publish it: docs/deployment.md)",
        )
        return EXIT_OK
    from crewwork.attestation.keys import published_keys
    from crewwork.config import get_settings

    doc: dict[str, Any] = {"keys": [k.document() for k in published_keys(get_settings().evidence)]}
    if not doc["keys"]:
        out.note("no evidence keys are configured (CREWWORK_EVIDENCE_SIGNING_KEY_FILE, CREWWORK_EVIDENCE_PUBLIC_KEYS)")
    out.result(doc, json.dumps(doc, indent=2))
    return EXIT_OK if doc["keys"] else EXIT_USAGE
