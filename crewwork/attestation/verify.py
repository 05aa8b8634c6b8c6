"""Offline verification of an evidence bundle: every signature against the trusted keys (a threshold of distinct
keys per envelope), every subject against the files or the repository, then what was proven.

The bundle is untrusted input. It is parsed strictly (crewwork.attestation.canonical), bounded (crewwork.attestation.format),
and nothing in it is used before the envelope holding it verified: the wrapper's `workItem` and `scope` are hints
that must agree with the signed provenance; `files` are trusted only once their sha256 matches a signed subject;
a subject's name is never a path (only plain file names are looked up, in one directory, without following links).
Text from the bundle is printed with control characters escaped, so a test id cannot rewrite the terminal.

Rules, in order (each failure is a problem; any problem refuses the bundle):

1. the document: at most MAX_BUNDLE_BYTES, strict JSON, the bundle media type, only known fields;
2. each envelope: payload type `application/vnd.in-toto+json` (no other type is read as a statement), canonical
   base64, at most MAX_SIGNATURES signatures, no key named twice, and at least `threshold` distinct trusted keys whose
   signatures verify (securesystemslib's DSSE verification decides); a revoked key's signature never counts;
3. each signed payload: an in-toto Statement v1 of a known predicate type, with the schema's fields only;
4. the set: exactly the statements the signed scope requires (landed: provenance, test result, review; attempt:
   provenance, test result), all about one work item, one attempt and one change (the same diff, and tree);
5. the caller's expectations (`work_item`, `commit`), when given;
6. every digest a verified statement names: the same name never with two digests; files by sha256 (from
   `files_dir`, else embedded), `git:commit`/`git:tree` against `repo` (the commit exists, has that tree and the
   base commit as its parent, and the tree's content has the crewwork tree digest); a digest that cannot be checked
   is a problem unless `allow_unchecked`; a file in the bundle that no verified statement names is a problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import UnverifiedSignatureError, VerificationError
from securesystemslib.signer import Signature

from crewwork.attestation.canonical import StrictJSONError, strict_loads
from crewwork.attestation.format import (
    BUNDLE_MEDIA_TYPE,
    MAX_BUNDLE_BYTES,
    MAX_ENVELOPES,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_JSON_DEPTH,
    MAX_KEYID_CHARS,
    MAX_SIGNATURE_CHARS,
    MAX_SIGNATURES,
    PAYLOAD_TYPE,
    PREDICATE_NAMES,
    PROVENANCE,
    REQUIRED_STATEMENTS,
    REVIEW,
    TEST_RESULT,
    run_url,
)
from crewwork.attestation.keys import PublicKey
from crewwork.attestation.report import BUNDLE_FIELDS, Report, Verified, safe
from crewwork.attestation.statements import TEST_COUNTS, StatementError, check_statement
from crewwork.attestation.subjects import _b64, _subjects

# ------------------------------------------------------------------------------------------------------ verify


def verify_bundle(
    data: bytes,
    keys: list[PublicKey],
    *,
    threshold: int = 1,
    repo: Path | None = None,
    files_dir: Path | None = None,
    work_item: str | None = None,
    commit: str | None = None,
    allow_unchecked: bool = False,
) -> Report:
    report = Report()
    report.proven["threshold"] = threshold
    doc = _document(data, report)
    trusted = [k for k in keys if k.status != "revoked"]
    revoked = {k.keyid for k in keys if k.status == "revoked"}
    if not trusted and revoked:
        report.problem(
            f"every key given is revoked ({', '.join(f'{k[:16]}…' for k in sorted(revoked))}, by the keys document "
            "given with --key): nothing a revoked key signed verifies; ask the operator for the key that replaced it"
        )
    elif not trusted:
        report.problem("no trusted key given (--key): a bundle cannot verify against nothing")
    elif threshold < 1 or threshold > len(trusted):
        report.problem(f"threshold {threshold} cannot be met with {len(trusted)} trusted key(s)")
    if doc is None or report.problems:
        return report
    verified = [
        v
        for i, env in enumerate(doc["envelopes"])
        if (v := _envelope(i, env, trusted, revoked, threshold, report)) is not None
    ]
    statements = _statement_set(doc, verified, report)
    if statements is None:
        return _done(report)
    if work_item is not None and report.proven["work_item"]["id"] != work_item:
        report.problem(
            f"the bundle is for work item {safe(report.proven['work_item']['id'])}, not {safe(work_item)} (a bundle "
            "of another item)"
        )
    _subjects(doc, statements, report, repo=repo, files_dir=files_dir, commit=commit, allow_unchecked=allow_unchecked)
    return _done(report)


def _done(report: Report) -> Report:
    report.ok = not report.problems
    return report


def _document(data: bytes, report: Report) -> dict[str, Any] | None:
    if len(data) > MAX_BUNDLE_BYTES:
        report.problem(f"the bundle is {len(data)} bytes; a verifier reads at most {MAX_BUNDLE_BYTES}")
        return None
    try:
        doc = strict_loads(data, max_depth=MAX_JSON_DEPTH)
    except StrictJSONError as exc:
        report.problem(f"the bundle is not a bundle: {exc}")
        return None
    if not isinstance(doc, dict) or doc.get("mediaType") != BUNDLE_MEDIA_TYPE:
        report.problem(f"the bundle is not a crewwork evidence bundle (mediaType is not {BUNDLE_MEDIA_TYPE})")
        return None
    unknown = sorted(set(doc) - BUNDLE_FIELDS)
    if unknown:
        report.problem(f"the bundle has unknown fields {unknown}")
    envs = doc.get("envelopes")
    if not isinstance(envs, list) or not 1 <= len(envs) <= MAX_ENVELOPES:
        report.problem(f"the bundle needs 1 to {MAX_ENVELOPES} envelopes")
    files = doc.setdefault("files", {})
    if not isinstance(files, dict) or len(files) > MAX_FILES:
        report.problem(f"the bundle's files are not a map of at most {MAX_FILES} entries")
    else:
        for name, entry in files.items():
            why = _file_entry_problem(entry)
            if why is not None:
                report.problem(f"file {safe(name, 120)} in the bundle: {why}")
                break
    return None if report.problems else doc


FILE_ENTRY_FIELDS = {"mediaType", "size", "base64", "artifact"}


def _file_entry_problem(entry: Any) -> str | None:
    """Why a `files` entry is not {mediaType, size, base64 | artifact} (None: it is). Its size is checked against
    the bytes when they are read (crewwork.attestation.subjects)."""
    if not isinstance(entry, dict) or not set(entry) <= FILE_ENTRY_FIELDS:
        return f"not an object of {sorted(FILE_ENTRY_FIELDS)}"
    size = entry.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE_BYTES:
        return f"size {safe(repr(size), 40)} is not a byte count"
    if not isinstance(entry.get("mediaType"), str):
        return "no mediaType"
    if ("base64" in entry) == ("artifact" in entry):
        return "needs exactly one of base64 (the bytes) or artifact (an artifact id, or null)"
    if not isinstance(entry.get("base64", ""), str) or not isinstance(entry.get("artifact"), str | None):
        return "base64 and artifact are text"
    return None


def _envelope(
    i: int, env: Any, trusted: list[PublicKey], revoked: set[str], threshold: int, report: Report
) -> Verified | None:
    where = f"envelope {i + 1}"
    if not isinstance(env, dict) or set(env) != {"payload", "payloadType", "signatures"}:
        report.problem(f"{where}: not a DSSE envelope (payload, payloadType, signatures)")
        return None
    if env["payloadType"] != PAYLOAD_TYPE:
        report.problem(
            f"{where}: payload type {safe(env['payloadType'], 100)!r} is not {PAYLOAD_TYPE}; a signature over "
            "another type is never read as a statement"
        )
        return None
    payload = _b64(env["payload"])
    if payload is None:
        report.problem(f"{where}: the payload is not canonical base64")
        return None
    sigs = env["signatures"]
    if not isinstance(sigs, list) or not 1 <= len(sigs) <= MAX_SIGNATURES:
        report.problem(f"{where}: needs 1 to {MAX_SIGNATURES} signatures")
        return None
    seen: set[str] = set()
    for s in sigs:
        if not isinstance(s, dict) or set(s) != {"keyid", "sig"} or not all(isinstance(v, str) for v in s.values()):
            report.problem(f"{where}: a signature is not {{keyid, sig}}")
            return None
        if len(s["keyid"]) > MAX_KEYID_CHARS or len(s["sig"]) > MAX_SIGNATURE_CHARS:
            report.problem(
                f"{where}: a signature's keyid or sig is longer than {MAX_KEYID_CHARS} / {MAX_SIGNATURE_CHARS} "
                "characters (an Ed25519 signature is 88)"
            )
            return None
        if s["keyid"] in seen:
            report.problem(
                f"{where}: two signatures name key {safe(s['keyid'], 80)}; a key counts once towards a threshold"
            )
            return None
        seen.add(s["keyid"])
        if _b64(s["sig"]) is None:
            report.problem(f"{where}: the signature of key {safe(s['keyid'], 80)} is not canonical base64")
            return None
    claimed = _claimed_type(payload)
    name = f"{where} ({claimed})"
    dsse = Envelope.from_dict({**env, "signatures": [dict(s) for s in sigs]})
    by_id = {k.keyid: k for k in trusted}
    why: list[str] = []
    for s in dsse.signatures.values():
        if s.keyid in revoked:
            why.append(f"key {s.keyid[:16]}… is revoked")
        elif s.keyid not in by_id:
            why.append(f"key {safe(s.keyid, 80)[:16]}… is not among the trusted keys")
        elif not _verifies(by_id[s.keyid], s, dsse.pae()):
            why.append(f"the signature of key {s.keyid[:16]}… does not verify (payload or signature changed)")
    try:
        accepted = dsse.verify([k.key for k in trusted], threshold)
    except (VerificationError, ValueError) as exc:
        report.problem(f"{name}: fewer than {threshold} valid signature(s) by trusted keys ({'; '.join(why) or exc})")
        return None
    for keyid in accepted:
        report.keys[keyid] = by_id[keyid].status
    try:
        stmt = strict_loads(payload, max_depth=MAX_JSON_DEPTH)
        if not isinstance(stmt, dict):
            raise StatementError("not an object")
        check_statement(stmt)
    except (StrictJSONError, StatementError) as exc:
        report.problem(f"{name}: the signed payload is not an in-toto Statement v1: {exc}")
        return None
    if stmt["predicateType"] not in PREDICATE_NAMES:
        report.problem(f"{where}: predicate type {safe(stmt['predicateType'], 200)!r} is not one crewwork signs")
        return None
    return Verified(i, stmt, sorted(accepted))


def _verifies(key: PublicKey, sig: Signature, pae: bytes) -> bool:
    try:
        key.key.verify_signature(sig, pae)
        return True
    except (UnverifiedSignatureError, VerificationError):
        return False


def _claimed_type(payload: bytes) -> str:
    """What an envelope's payload says it is, for messages only (read before its signature is trusted)."""
    try:
        stmt = strict_loads(payload, max_depth=MAX_JSON_DEPTH)
        return PREDICATE_NAMES.get(str(stmt.get("predicateType")), "unknown statement")
    except (StrictJSONError, AttributeError):
        return "not a statement"


def _statement_set(doc: dict[str, Any], verified: list[Verified], report: Report) -> dict[str, Verified] | None:
    by_type: dict[str, Verified] = {}
    for v in verified:
        if v.type in by_type:
            report.problem(
                f"envelopes {by_type[v.type].index + 1} and {v.index + 1} are both a {PREDICATE_NAMES[v.type]}"
            )
            return None
        by_type[v.type] = v
    prov = by_type.get(PROVENANCE)
    if prov is None:
        report.problem("no verified provenance statement: nothing says what the bundle is about")
        return None
    p = prov.predicate
    internal = p["buildDefinition"].get("internalParameters") or {}
    external = p["buildDefinition"].get("externalParameters") or {}
    wi_raw = external.get("workItem")
    wi: dict[str, Any] = wi_raw if isinstance(wi_raw, dict) else {}
    scope = internal.get("scope")
    if scope not in REQUIRED_STATEMENTS:
        report.problem(f"the provenance's scope {safe(scope)!r} is not landed or attempt")
        return None
    missing = [PREDICATE_NAMES[t] for t in REQUIRED_STATEMENTS[scope] if t not in by_type]
    extra = [PREDICATE_NAMES[t] for t in by_type if t not in REQUIRED_STATEMENTS[scope]]
    if missing:
        report.problem(f"a {scope} bundle needs a verified {' and '.join(missing)} statement")
    if extra:
        report.problem(f"an {scope} bundle has no place for a {' or '.join(extra)} statement")
    item_id = wi.get("id")
    attempt = internal.get("attempt")
    if not isinstance(item_id, str) or not isinstance(attempt, int) or isinstance(attempt, bool):
        report.problem("the provenance names no work item id and attempt number")
        return None
    if doc.get("workItem") not in (None, item_id) or doc.get("scope") not in (None, scope):
        report.problem(
            f"the bundle's wrapper says work item {safe(doc.get('workItem'))} ({safe(doc.get('scope'))}), the signed "
            f"provenance {safe(item_id)} ({safe(scope)})"
        )
    tr = by_type.get(TEST_RESULT)
    if tr is not None and tr.predicate.get("url") != run_url(item_id, attempt):
        report.problem(
            f"the test result is about {safe(tr.predicate.get('url'))}, not attempt {safe(attempt)} of {safe(item_id)}"
        )
    rv = by_type.get(REVIEW)
    if rv is not None and (rv.predicate.get("workItem") != item_id or rv.predicate.get("attempt") != attempt):
        report.problem(
            f"the review is of attempt {safe(rv.predicate.get('attempt'))} of {safe(rv.predicate.get('workItem'))}, "
            f"not attempt {safe(attempt)} of {safe(item_id)}"
        )
    if report.problems:
        return None
    run = p["runDetails"]
    report.proven.update(
        work_item={"id": item_id, "kind": wi.get("kind"), "tenant": internal.get("tenant")},
        submission=wi.get("submission"),
        scope=scope,
        attempt=attempt,
        agent=internal.get("agent") or {},
        mock=bool(internal.get("mock")),
        builder=run["builder"].get("id"),
        version=(run["builder"].get("version") or {}).get("crewwork"),
        workflow_id=run.get("metadata", {}).get("invocationId"),
        started_on=run.get("metadata", {}).get("startedOn"),
        finished_on=run.get("metadata", {}).get("finishedOn"),
        attempts=_attempts(run),
    )
    if tr is not None:
        t = tr.predicate
        counts = next(
            (
                c.get("annotations")
                for c in t.get("configuration") or []
                if isinstance(c, dict) and c.get("name") == TEST_COUNTS and isinstance(c.get("annotations"), dict)
            ),
            None,
        )
        report.proven["tests"] = {
            "result": t.get("result"),
            "passed": list(t.get("passedTests") or []),
            "failed": list(t.get("failedTests") or []),
            "warned": list(t.get("warnedTests") or []),
            # How many there were (a bundle lists ids within a bound; the report subject names every test).
            "counts": counts,
        }
    if rv is not None:
        report.proven["review"] = rv.predicate
    return by_type


def _attempts(run: dict[str, Any]) -> list[dict[str, Any]]:
    for b in run.get("byproducts") or []:
        if isinstance(b, dict) and b.get("name") == "attempts":
            rows = (b.get("annotations") or {}).get("attempts")
            return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
    return []
