"""Offline verification of an evidence bundle: every signature against the trusted keys (a threshold of distinct
keys per envelope), every subject against the files or the repository, then what was proven.

The bundle is untrusted input. It is parsed strictly (crewwork.evidence.canonical), bounded (crewwork.evidence.format),
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
   is a problem unless `allow_unchecked`; a file in the bundle that no verified statement names is a problem.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import UnverifiedSignatureError, VerificationError
from securesystemslib.signer import Signature

from crewwork.evidence.canonical import StrictJSONError, strict_loads
from crewwork.evidence.format import (
    BUNDLE_MEDIA_TYPE,
    COMMIT_SUBJECT,
    ENVIRONMENT_FILE,
    FILE_NAME,
    GIT_ID,
    HEX64,
    MAX_BUNDLE_BYTES,
    MAX_ENVELOPES,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_JSON_DEPTH,
    MAX_PRINTED,
    MAX_SIGNATURES,
    MAX_SUBJECTS,
    PAYLOAD_TYPE,
    PREDICATE_NAMES,
    PROVENANCE,
    REQUIRED_STATEMENTS,
    REVIEW,
    SANDBOX_FILE,
    TEST_RESULT,
    TREE_SUBJECT,
    run_url,
)
from crewwork.evidence.keys import PublicKey
from crewwork.evidence.statements import TEST_COUNTS, StatementError, check_statement
from crewwork.evidence.treedigest import TreeDigestError, commit_info, git, tree_digest

BUNDLE_FIELDS = {"mediaType", "workItem", "scope", "envelopes", "files"}


@dataclass
class Verified:
    """One envelope whose signatures met the threshold, and its statement."""

    index: int
    statement: dict[str, Any]
    keyids: list[str]

    @property
    def type(self) -> str:
        return str(self.statement["predicateType"])

    @property
    def predicate(self) -> dict[str, Any]:
        return self.statement["predicate"]  # type: ignore[no-any-return]


@dataclass
class Report:
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)
    """keyid -> status of every key whose signature counted."""
    proven: dict[str, Any] = field(default_factory=dict)

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "problems": self.problems,
            "checked": self.checked,
            "unchecked": self.unchecked,
            "keys": self.keys,
            "proven": self.proven,
        }

    def human(self) -> str:
        if not self.ok:
            lines = [f"crewwork verify: REFUSED: {len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}"]
            lines += [f"  - {safe(p, 600)}" for p in self.problems]
            return "\n".join(lines)
        p = self.proven
        lines = ["crewwork verify: OK: every signature and every subject checked"]
        if self.unchecked:
            lines[0] = (
                f"crewwork verify: OK, but {len(self.unchecked)} subject(s) NOT CHECKED: {', '.join(self.unchecked)}"
            )
        wi = p.get("work_item", {})
        lines.append(f"  work item    {safe(wi.get('id'))} ({safe(wi.get('kind'))}), tenant {safe(wi.get('tenant'))}")
        lines.append(
            f"  builder      {safe(p.get('builder'))}, crewwork {safe(p.get('version'))}, workflow "
            f"{safe(p.get('workflow_id'))}, {safe(p.get('started_on'))} .. {safe(p.get('finished_on'))}"
        )
        ch = p.get("change", {})
        if ch.get("commit"):
            lines.append(
                f"  change       commit {ch['commit']} (tree {ch.get('tree')}) on {safe(ch.get('branch'))}, "
                f"parent {ch.get('base_commit')} of {safe(ch.get('repo'))}"
            )
        else:
            lines.append(
                f"  change       attempt {p.get('attempt')}'s diff on {ch.get('base_commit')} of "
                f"{safe(ch.get('repo'))} (not landed)"
            )
        agent = p.get("agent", {})
        mock = "  MOCK: a scripted agent made this change, not a model or a person" if p.get("mock") else ""
        lines.append(f"  agent        {safe(agent.get('name'))}{mock}")
        t = p.get("tests", {})
        history = ", ".join(f"{a.get('number')} {a.get('verdict')}" for a in p.get("attempts", []))
        counts = t.get("counts") or {}
        n = {k: _count(counts.get(k), len(t.get(v, []))) for k, v in (("passed", "passed"), ("failed", "failed"))}
        n["skipped"] = _count(counts.get("skipped"), len(t.get("warned", [])))
        lines.append(
            f"  tests        {safe(t.get('result'))}: {n['passed']} passed, {n['failed']} failed, "
            f"{n['skipped']} skipped (attempt {p.get('attempt')}; attempts: "
            f"{safe(history)})"
        )
        unlisted = (
            n["passed"] + n["failed"] + n["skipped"] - sum(len(t.get(k, [])) for k in ("passed", "failed", "warned"))
        )
        if unlisted > 0:
            lines.append(
                f"      ({unlisted} of them not listed in the statement, which lists ids within a bound: the report "
                "subject names every test)"
            )
        for outcome in ("passed", "failed"):
            ids = t.get(outcome, [])
            for tid in ids[:MAX_PRINTED]:
                lines.append(f"      {outcome:<7} {safe(tid, 200)}")
            if len(ids) > MAX_PRINTED:
                lines.append(f"      … and {len(ids) - MAX_PRINTED} more {outcome} (--json lists them all)")
        sb = p.get("sandbox")
        lines.append(f"  sandbox      {describe_sandbox(sb) if sb else 'not checked'}")
        env = p.get("environment")
        lines.append(f"  environment  {describe_environment(env) if env else 'not checked'}")
        rv = p.get("review")
        if rv is not None:
            lines.append(f"  review       {describe_review(rv)}")
        keys = ", ".join(f"{k[:16]}… ({s})" for k, s in self.keys.items())
        lines.append(f"  signed by    {keys}; threshold {p.get('threshold')} per envelope")
        lines.append(f"  subjects     {len(self.checked)} checked: {', '.join(self.checked)}")
        return "\n".join(lines)


def _count(value: Any, listed: int) -> int:
    """A signed count, never fewer than the ids listed."""
    return max(value, listed) if isinstance(value, int) and not isinstance(value, bool) else listed


def describe_sandbox(sb: dict[str, Any]) -> str:
    runner = sb.get("runner") or {}
    limits = sb.get("limits") or {}
    what = ", ".join(f"{k}={v}" for k, v in sorted(runner.items()) if k != "backend")
    caps = ", ".join(f"{k} {v}" for k, v in sorted(limits.items()))
    iso = "isolated" if sb.get("isolated") else "NOT ISOLATED"
    return safe(
        f"{sb.get('backend')} ({iso}{', ' + sb['enforcement'] if sb.get('enforcement') else ''}{', ' + what if what else ''})"
        f", network {sb.get('network')}, limits: {caps or 'unknown'}",
        400,
    )


def describe_environment(env: dict[str, Any]) -> str:
    if not env.get("prepared"):
        return "none prepared (validation ran in the sandbox's own environment)"
    setup = "; ".join(" ".join(c) for c in env.get("setup") or [])
    return safe(f"prepared {env.get('key')} (python {env.get('python')}, setup: {setup or 'none'})", 400)


def describe_review(rv: dict[str, Any]) -> str:
    if not rv.get("required"):
        return "NOT REQUIRED: nobody approved this change before it landed"
    who = f"{rv.get('reviewer')!r}" if rv.get("reviewer") else "an unnamed reviewer"
    key = f" through API key {rv.get('apiKey')}" if rv.get("apiKey") else " (not through the API)"
    when = f" at {rv.get('decidedAt')}" if rv.get("decidedAt") else ""
    comment = f": {rv.get('comment')!r}" if rv.get("comment") else ""
    return safe(f"{rv.get('decision')} by {who}{key}{when}{comment}", 400)


_BIDI = {0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069, 0x200E, 0x200F}


def safe(value: Any, limit: int = 300) -> str:
    """Text from a bundle, fit for a terminal: control, format and bidirectional characters escaped, bounded."""
    text = "" if value is None else str(value)
    out = []
    for ch in text:
        if ch in "\t" or (unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")) or ord(ch) in _BIDI:
            out.append(ch.encode("unicode_escape").decode())
        else:
            out.append(ch)
    s = "".join(out)
    return s if len(s) <= limit else s[: limit - 1] + "…"


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
    if not trusted:
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
    return None if report.problems else doc


def _b64(value: Any) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    # One encoding per value: a non-canonical encoding (stray padding bits) is refused.
    return raw if base64.b64encode(raw).decode() == value else None


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


# ------------------------------------------------------------------------------------------------ the subjects


def _descriptors(statements: dict[str, Verified], report: Report) -> dict[str, dict[str, str]]:
    """name -> digest of every digest-bearing descriptor the verified statements name (one digest per name)."""
    found: dict[str, dict[str, str]] = {}
    for v in statements.values():
        rds: list[Any] = list(v.statement["subject"])
        if v.type == TEST_RESULT:
            rds += v.predicate.get("configuration") or []
        if v.type == PROVENANCE:
            rds += [
                d for d in v.predicate["buildDefinition"].get("resolvedDependencies") or [] if d.get("name") != "base"
            ]
        if len(rds) > MAX_SUBJECTS:
            report.problem(f"the {PREDICATE_NAMES[v.type]} names more than {MAX_SUBJECTS} subjects")
            continue
        for rd in rds:
            name, digest = rd.get("name"), rd.get("digest") or {}
            if not digest:
                continue
            if not isinstance(name, str) or (name not in (COMMIT_SUBJECT, TREE_SUBJECT) and not FILE_NAME.match(name)):
                report.problem(f"subject name {safe(name, 120)!r} is not a plain file name; it is never looked up")
                continue
            if name in found and found[name] != dict(digest):
                report.problem(f"subject {name} has two different digests in the bundle's statements")
                continue
            found[name] = dict(digest)
    return found


def _subjects(
    doc: dict[str, Any],
    statements: dict[str, Verified],
    report: Report,
    *,
    repo: Path | None,
    files_dir: Path | None,
    commit: str | None,
    allow_unchecked: bool,
) -> None:
    found = _descriptors(statements, report)
    files: dict[str, Any] = doc["files"]
    for name in sorted(set(files) - set(found)):
        report.problem(f"file {safe(name, 120)} in the bundle is named by no signed statement")
    prov = statements[PROVENANCE].predicate["buildDefinition"]
    base = next(
        (d for d in prov.get("resolvedDependencies") or [] if isinstance(d, dict) and d.get("name") == "base"), {}
    )
    base_commit = (base.get("digest") or {}).get("gitCommit")
    report.proven["change"] = {
        "repo": str(base.get("uri", "")),
        "base_commit": base_commit,
        "branch": (prov.get("internalParameters") or {}).get("deliveryBranch"),
    }
    # Files.
    contents: dict[str, bytes] = {}
    for name, digest in found.items():
        if name in (COMMIT_SUBJECT, TREE_SUBJECT):
            continue
        want = digest.get("sha256")
        if not isinstance(want, str) or not HEX64.match(want):
            report.problem(f"subject {name}: no sha256 digest to check")
            continue
        data, whence = _file(name, files.get(name), files_dir, report)
        if data is None:
            _unchecked(report, name, whence, allow_unchecked)
            continue
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            report.problem(f"subject {name}: the {whence}'s sha256 is {got}, the signed statement says {want}")
            continue
        contents[name] = data
        report.checked.append(name)
    # Git objects.
    if COMMIT_SUBJECT in found or TREE_SUBJECT in found:
        _git_subjects(found, base_commit, report, repo=repo, commit=commit, allow_unchecked=allow_unchecked)
    elif commit is not None:
        report.problem(f"--commit {safe(commit)}: this bundle is about one attempt's diff, not a landed commit")
    for key, name in (("sandbox", SANDBOX_FILE), ("environment", ENVIRONMENT_FILE)):
        if name in contents:
            try:
                value = strict_loads(contents[name], max_depth=MAX_JSON_DEPTH)
                report.proven[key] = value if isinstance(value, dict) else None
            except StrictJSONError:
                report.problem(f"subject {name} matches its digest but is not JSON")


def _unchecked(report: Report, name: str, why: str, allow: bool) -> None:
    report.unchecked.append(name)
    if not allow:
        report.problem(f"subject {name} was not checked: {why} (--allow-unchecked accepts that)")


def _file(name: str, entry: Any, files_dir: Path | None, report: Report) -> tuple[bytes | None, str]:
    """A subject file's bytes and where they came from (or None and why not)."""
    if files_dir is not None:
        data, why = read_subject_file(files_dir, name)
        if data is not None:
            return data, f"file {files_dir / name}"
        if why != "absent":
            return None, why
    if isinstance(entry, dict) and "base64" in entry:
        raw = _b64(entry["base64"])
        if raw is None:
            return None, "its embedded copy is not canonical base64"
        return raw, "embedded copy"
    if isinstance(entry, dict) and entry.get("artifact"):
        return None, (
            f"it is not in the bundle (artifact {safe(entry['artifact'], 80)}: download it with `crewwork artifacts "
            f"ITEM {safe(entry['artifact'], 80)} -o DIR/{name}` and give --files DIR)"
        )
    return None, "it is not in the bundle and no --files directory holds it"


def read_subject_file(directory: Path, name: str) -> tuple[bytes | None, str]:
    """`directory/name` if it is a regular file (no link followed, `name` a plain file name), read up to
    MAX_FILE_BYTES. Returns (bytes, "") or (None, why); why is "absent" when there is no such file."""
    if not FILE_NAME.match(name):
        return None, f"{name!r} is not a plain file name"
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        return None, f"--files {directory}: {exc.strerror}"
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except FileNotFoundError:
        return None, "absent"
    except OSError as exc:
        return None, f"{directory / name}: {exc.strerror} (links are not followed)"
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{directory / name} is not a regular file"
        if st.st_size > MAX_FILE_BYTES:
            return None, f"{directory / name} is larger than {MAX_FILE_BYTES} bytes"
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > MAX_FILE_BYTES:
                return None, f"{directory / name} grew past {MAX_FILE_BYTES} bytes while read"
            chunks.append(chunk)
        return b"".join(chunks), ""
    finally:
        os.close(fd)


def git_dir_of(repo: Path) -> Path:
    """The git directory of a work tree or bare repository, found without running anything the repository names."""
    if (repo / ".git").is_dir():
        return repo / ".git"
    if (repo / ".git").is_file():
        line = (repo / ".git").read_text(errors="replace").strip()
        if line.startswith("gitdir: "):
            target = Path(line[8:])
            return target if target.is_absolute() else (repo / target)
    if (repo / "objects").is_dir() and (repo / "HEAD").is_file():
        return repo
    raise TreeDigestError(f"{repo} is not a git repository (no .git, not bare)")


def _git_subjects(
    found: dict[str, dict[str, str]],
    base_commit: str | None,
    report: Report,
    *,
    repo: Path | None,
    commit: str | None,
    allow_unchecked: bool,
) -> None:
    want_commit = found.get(COMMIT_SUBJECT, {}).get("gitCommit")
    tree = found.get(TREE_SUBJECT, {})
    if not (isinstance(want_commit, str) and GIT_ID.match(want_commit)):
        report.problem("the landed change names no commit (git:commit with a gitCommit digest)")
        return
    if not (
        isinstance(tree.get("gitTree"), str) and GIT_ID.match(tree["gitTree"]) and HEX64.match(tree.get("sha256", ""))
    ):
        report.problem("the landed change names no tree (git:tree with gitTree and sha256 digests)")
        return
    report.proven["change"].update(commit=want_commit, tree=tree["gitTree"])
    if repo is None:
        if commit is not None:
            report.problem("--commit needs --repo: a commit is resolved in a repository")
        for name in (COMMIT_SUBJECT, TREE_SUBJECT):
            _unchecked(report, name, "no --repo given", allow_unchecked)
        return
    try:
        gd = git_dir_of(repo)
        if commit is not None:
            expected = (
                git(gd, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{commit}^{{commit}}").decode().strip()
            )
            if expected != want_commit:
                report.problem(
                    f"--commit {safe(commit)} is {expected}; the bundle is about {want_commit} (a bundle of another change)"
                )
                return
        got_tree, parents, _when = commit_info(gd, want_commit)
    except (TreeDigestError, OSError) as exc:
        report.problem(f"git:commit {want_commit} cannot be read in {repo}: {exc}")
        return
    if got_tree != tree["gitTree"]:
        report.problem(f"git:commit {want_commit} has tree {got_tree or '?'}; the statement says {tree['gitTree']}")
        return
    if parents != [base_commit]:
        report.problem(f"git:commit {want_commit} has parents {parents}; the provenance says its base is {base_commit}")
        return
    report.checked.append(COMMIT_SUBJECT)
    try:
        digest = tree_digest(gd, want_commit)
    except TreeDigestError as exc:
        report.problem(f"git:tree of {want_commit} cannot be read: {exc}")
        return
    if digest.sha256 != tree["sha256"]:
        report.problem(f"git:tree: the content's tree digest is {digest.sha256}, the statement says {tree['sha256']}")
        return
    report.checked.append(TREE_SUBJECT)
