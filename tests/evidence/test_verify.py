"""Offline verification refuses every tampered part of a bundle, with a message naming what failed, and proves what
an untouched one says. Real signatures (Ed25519, securesystemslib), a real git repository; no crewwork server."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner

from crewwork.attestation import format as fmt
from crewwork.attestation.canonical import canonical
from crewwork.attestation.facts import TestFact
from crewwork.attestation.report import Report
from crewwork.attestation.sign import envelope
from crewwork.attestation.verify import verify_bundle
from tests.evidence.helpers import doc, facts_for, landed_repo, other, sign, trusted

KEY = CryptoSigner.generate_ed25519()
OTHER_KEY = CryptoSigner.generate_ed25519()


@pytest.fixture(scope="module")
def landed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str, bytes]:
    return landed_repo(tmp_path_factory.mktemp("evidence") / "repo")


@pytest.fixture(scope="module")
def bundle(landed: tuple[Path, str, str, bytes]) -> bytes:
    repo, base, commit, diff = landed
    return sign(facts_for(repo, base, commit, diff), KEY)


def check(data: bytes | dict, repo: Path | None, **kw: object) -> Report:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    kw.setdefault("keys", trusted(KEY))
    return verify_bundle(raw, repo=repo, **kw)  # type: ignore[arg-type]


def refused(report: Report, *fragments: str) -> None:
    assert not report.ok, report.human()
    text = "\n".join(report.problems)
    for f in fragments:
        assert f in text, text


def payload(d: dict, i: int) -> dict:
    return json.loads(base64.b64decode(d["envelopes"][i]["payload"]))


def set_payload(d: dict, i: int, stmt: dict) -> None:
    d["envelopes"][i]["payload"] = base64.b64encode(canonical(stmt)).decode()


def set_file(d: dict, name: str, data: bytes) -> None:
    d["files"][name]["base64"] = base64.b64encode(data).decode()


# --------------------------------------------------------------------------------------------- what is proven


def test_an_untouched_bundle_verifies_and_says_what_was_proven(bundle: bytes, landed: tuple) -> None:
    repo, base, commit, _ = landed
    r = check(bundle, repo, work_item="wi_a", commit="crewwork/wi_a")
    assert r.ok, r.problems
    assert sorted(r.checked) == sorted(
        [
            "git:commit",
            "git:tree",
            "landed.patch",
            "attempt-2-junit.xml",
            "sandbox.json",
            "environment.json",
            "validation.json",
        ]
    )
    p = r.proven
    assert p["change"]["commit"] == commit and p["change"]["base_commit"] == base
    assert p["tests"]["passed"] == ["tests/test_calc.py::test_a", "tests/test_calc.py::test_b"]
    assert p["sandbox"]["backend"] == "bwrap" and p["sandbox"]["network"] == "none"
    assert p["review"]["decision"] == "approve" and p["review"]["reviewer"] == "alice"
    assert p["mock"] is True
    text = r.human()
    assert "OK" in text and "MOCK" in text and "approve by 'alice' through API key key_1" in text


def test_signing_is_deterministic_so_a_retried_landing_pushes_the_same_note(landed: tuple) -> None:
    repo, base, commit, diff = landed
    f = facts_for(repo, base, commit, diff)
    assert sign(f, KEY) == sign(f, KEY)


def test_the_statements_have_the_in_toto_shapes(bundle: bytes) -> None:
    d = doc(bundle)
    types = [payload(d, i)["predicateType"] for i in range(len(d["envelopes"]))]
    assert types == [fmt.PROVENANCE, fmt.TEST_RESULT, fmt.REVIEW]
    prov = payload(d, 0)
    assert prov["_type"] == "https://in-toto.io/Statement/v1"
    assert prov["predicate"]["buildDefinition"]["internalParameters"]["mock"] is True
    assert "mockNotice" in prov["predicate"]["buildDefinition"]["internalParameters"]
    assert {s["name"] for s in prov["subject"]} == {"git:commit", "git:tree", "landed.patch"}
    assert all(e["payloadType"] == "application/vnd.in-toto+json" for e in d["envelopes"])


def test_a_real_agents_bundle_carries_no_mock_label(landed: tuple) -> None:
    repo, base, commit, diff = landed
    r = check(sign(facts_for(repo, base, commit, diff, mock=False), KEY), repo)
    assert r.ok and r.proven["mock"] is False and "MOCK" not in r.human()


# --------------------------------------------------------------------------------------------- the listed tampering


def test_a_changed_diff_is_refused(bundle: bytes, landed: tuple) -> None:
    d = doc(bundle)
    set_file(d, "landed.patch", base64.b64decode(d["files"]["landed.patch"]["base64"]) + b"+evil\n")
    refused(check(d, landed[0]), "subject landed.patch: the embedded copy's sha256 is")


def test_a_changed_report_is_refused(bundle: bytes, landed: tuple) -> None:
    d = doc(bundle)
    set_file(d, "attempt-2-junit.xml", b'<testsuite tests="9" failures="0"/>')
    refused(check(d, landed[0]), "subject attempt-2-junit.xml: the embedded copy's sha256 is")


def test_a_changed_statement_is_refused(bundle: bytes, landed: tuple) -> None:
    d = doc(bundle)
    stmt = payload(d, 1)
    stmt["predicate"]["failedTests"] = []
    stmt["predicate"]["passedTests"].append("tests/test_calc.py::test_that_never_ran")
    set_payload(d, 1, stmt)
    refused(check(d, landed[0]), "envelope 2 (test result): fewer than 1 valid signature", "does not verify")


def test_a_changed_signature_is_refused(bundle: bytes, landed: tuple) -> None:
    d = doc(bundle)
    sig = bytearray(base64.b64decode(d["envelopes"][0]["signatures"][0]["sig"]))
    sig[0] ^= 1
    d["envelopes"][0]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    refused(check(d, landed[0]), "envelope 1 (provenance)", "does not verify")


def test_a_key_that_did_not_sign_is_refused(bundle: bytes, landed: tuple) -> None:
    refused(check(bundle, landed[0], keys=trusted(OTHER_KEY)), "is not among the trusted keys")


def test_a_bundle_signed_by_another_key_is_refused(landed: tuple) -> None:
    repo, base, commit, diff = landed
    forged = sign(facts_for(repo, base, commit, diff), OTHER_KEY)
    refused(check(forged, repo), "is not among the trusted keys")


def test_a_subject_swapped_for_another_items_is_refused(landed: tuple, tmp_path: Path) -> None:
    repo, base, commit, diff = landed
    mine = doc(sign(facts_for(repo, base, commit, diff), KEY))
    theirs = doc(sign(facts_for(repo, base, commit, b"--- other change\n", item="wi_b"), KEY))
    # Their test result (properly signed by the same key) in my bundle.
    d = json.loads(json.dumps(mine))
    d["envelopes"][1] = theirs["envelopes"][1]
    refused(check(d, repo), "the test result is about urn:crewwork:work-item:wi_b:attempt:2, not attempt 2 of wi_a")
    # Their diff file in place of mine.
    d = json.loads(json.dumps(mine))
    d["files"]["landed.patch"] = theirs["files"]["landed.patch"]
    refused(check(d, repo), "subject landed.patch: the embedded copy's sha256 is")


# --------------------------------------------------------------------------------------------- beyond the list


def test_a_bundle_replayed_for_another_item_or_commit_is_refused(bundle: bytes, landed: tuple) -> None:
    repo, base, _, _ = landed
    refused(check(bundle, repo, work_item="wi_b"), "the bundle is for work item wi_a, not wi_b")
    refused(check(bundle, repo, commit="main"), f"--commit main is {base}; the bundle is about")


def test_an_envelope_signed_by_a_revoked_key_is_refused_and_a_retired_one_still_verifies(
    bundle: bytes, landed: tuple
) -> None:
    repo = landed[0]
    refused(check(bundle, repo, keys=[*trusted(KEY, status="revoked"), *trusted(OTHER_KEY)]), "is revoked")
    r = check(bundle, repo, keys=trusted(KEY, status="retired"))
    assert r.ok and "(retired)" in r.human()


def test_payload_type_confusion_is_refused(bundle: bytes, landed: tuple) -> None:
    d = doc(bundle)
    d["envelopes"][0]["payloadType"] = "application/json"
    refused(check(d, landed[0]), "payload type 'application/json' is not application/vnd.in-toto+json")


def test_another_payload_type_signed_by_a_trusted_key_is_not_read_as_a_statement(bundle: bytes, landed: tuple) -> None:
    from securesystemslib.dsse import Envelope

    d = doc(bundle)
    stmt = payload(d, 0)
    env = Envelope(canonical(stmt), "application/vnd.crewwork.other+json", {})
    env.sign(KEY)
    d["envelopes"][0] = env.to_dict()
    refused(check(d, landed[0]), "is not application/vnd.in-toto+json")


def test_duplicate_signatures_cannot_fake_a_threshold(landed: tuple) -> None:
    repo, base, commit, diff = landed
    d = doc(sign(facts_for(repo, base, commit, diff), KEY))
    for env in d["envelopes"]:
        env["signatures"].append(dict(env["signatures"][0]))
    refused(check(d, repo, keys=trusted(KEY, OTHER_KEY), threshold=2), "two signatures name key")
    # The same signature relabelled with the other key's id does not count for it.
    d = doc(sign(facts_for(repo, base, commit, diff), KEY))
    for env in d["envelopes"]:
        env["signatures"].append({"keyid": OTHER_KEY.public_key.keyid, "sig": env["signatures"][0]["sig"]})
    refused(check(d, repo, keys=trusted(KEY, OTHER_KEY), threshold=2), "fewer than 2 valid signature(s)")
    # One key given twice is one trusted key.
    from crewwork.attestation.keys import load_trusted

    pub = repo.parent / "k.pub"
    pub.write_text(trusted(KEY)[0].pem())
    keys = load_trusted([pub, pub])
    refused(check(d, repo, keys=keys, threshold=2), "threshold 2 cannot be met with 1 trusted key(s)")


def test_a_threshold_of_two_keys_needs_both_signatures(landed: tuple) -> None:
    repo, base, commit, diff = landed
    both = sign(facts_for(repo, base, commit, diff), KEY, OTHER_KEY)
    assert check(both, repo, keys=trusted(KEY, OTHER_KEY), threshold=2).ok
    d = doc(both)
    d["envelopes"][2]["signatures"].pop()
    refused(check(d, repo, keys=trusted(KEY, OTHER_KEY), threshold=2), "envelope 3 (review): fewer than 2")


def test_subject_names_that_are_paths_are_never_looked_up(landed: tuple, tmp_path: Path) -> None:
    repo, base, commit, diff = landed
    secret = tmp_path / "secret.txt"
    secret.write_text("not for a verifier to read")
    d = doc(sign(facts_for(repo, base, commit, diff), KEY))
    stmt = payload(d, 1)
    stmt["subject"].append({"name": f"../{secret.name}", "digest": {"sha256": "0" * 64}})
    stmt["subject"].append({"name": str(secret), "digest": {"sha256": "0" * 64}})
    d["envelopes"][1] = envelope(stmt, [KEY])  # signed by the trusted key: still refused
    files = tmp_path / "files"
    files.mkdir()
    r = check(d, repo, files_dir=files)
    refused(r, "subject name '../secret.txt' is not a plain file name", f"subject name '{secret}' is not a plain")
    # An unsigned file of the bundle with such a name is refused as well.
    d = doc(sign(facts_for(repo, base, commit, diff), KEY))
    d["files"]["../../etc/passwd"] = {"mediaType": "text/plain", "size": 1, "base64": "eA=="}
    refused(check(d, repo), "file ../../etc/passwd in the bundle is named by no signed statement")


def test_a_subject_file_that_is_a_link_is_not_followed(bundle: bytes, landed: tuple, tmp_path: Path) -> None:
    repo = landed[0]
    files = tmp_path / "files"
    files.mkdir()
    target = tmp_path / "elsewhere.patch"
    target.write_bytes(base64.b64decode(doc(bundle)["files"]["landed.patch"]["base64"]))
    os.symlink(target, files / "landed.patch")
    refused(check(bundle, repo, files_dir=files), "landed.patch", "links are not followed")


def test_files_given_in_a_directory_are_checked(landed: tuple, tmp_path: Path) -> None:
    repo, base, commit, diff = landed
    small = sign(facts_for(repo, base, commit, diff), KEY, embed_max_bytes=0)
    refused(check(small, repo), "subject landed.patch was not checked", "artifact art_diff")
    files = tmp_path / "files"
    files.mkdir()
    d = doc(sign(facts_for(repo, base, commit, diff), KEY))
    for name, entry in d["files"].items():
        (files / name).write_bytes(base64.b64decode(entry["base64"]))
    assert check(small, repo, files_dir=files).ok
    (files / "landed.patch").write_bytes(diff + b"+tampered\n")
    refused(check(small, repo, files_dir=files), f"subject landed.patch: the file {files / 'landed.patch'}'s sha256")


def test_without_a_repository_the_commit_is_not_checked_and_that_is_refused_unless_allowed(bundle: bytes) -> None:
    refused(check(bundle, None), "subject git:commit was not checked: no --repo given")
    r = check(bundle, None, allow_unchecked=True)
    assert r.ok and r.unchecked == ["git:commit", "git:tree"] and "NOT CHECKED" in r.human()


def test_a_repository_without_the_commit_is_refused(bundle: bytes, tmp_path: Path) -> None:
    elsewhere, *_ = landed_repo(tmp_path / "elsewhere", change="def add(a, b):\n    return b + a\n")
    refused(check(bundle, elsewhere), "git:commit", "cannot be read in")


def test_a_stripped_review_is_refused_even_when_the_wrapper_claims_another_scope(bundle: bytes, landed: tuple) -> None:
    d = doc(bundle)
    d["envelopes"].pop()
    d["scope"] = "attempt"
    refused(check(d, landed[0]), "a landed bundle needs a verified review statement", "the bundle's wrapper says")


def test_a_statement_given_twice_is_refused(bundle: bytes, landed: tuple) -> None:
    d = doc(bundle)
    d["envelopes"].append(d["envelopes"][1])
    refused(check(d, landed[0]), "envelopes 2 and 4 are both a test result")


def test_ambiguous_or_oversized_json_is_refused(bundle: bytes, landed: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = landed[0]
    text = bundle.decode()
    dup = text.replace('"scope":"landed"', '"scope":"landed","scope":"attempt"')
    refused(check(dup.encode(), repo), "the key 'scope' appears twice in one object")
    deep = b'{"mediaType": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    refused(check(deep, repo), "the bundle is not a bundle", "deeper than 64 levels")
    refused(check(b'{"x": NaN}', repo), "x: not a finite number")
    import crewwork.attestation.verify as v

    monkeypatch.setattr(v, "MAX_BUNDLE_BYTES", len(bundle) - 1)
    refused(check(bundle, repo), f"the bundle is {len(bundle)} bytes; a verifier reads at most")


def test_too_many_envelopes_or_signatures_are_refused(bundle: bytes, landed: tuple) -> None:
    d = doc(bundle)
    d["envelopes"] = d["envelopes"] * 6
    refused(check(d, landed[0]), "the bundle needs 1 to 16 envelopes")
    d = doc(bundle)
    d["envelopes"][0]["signatures"] = [{"keyid": f"k{i}", "sig": "AA=="} for i in range(17)]
    refused(check(d, landed[0]), "envelope 1: needs 1 to 16 signatures")


def test_text_from_the_bundle_cannot_rewrite_the_terminal(landed: tuple) -> None:
    repo, base, commit, diff = landed
    f = facts_for(repo, base, commit, diff)
    f = other(f, tests=[TestFact("test_ok\x1b[2K\r\x1b[32mall fine\u202e", "passed")])
    r = check(sign(f, KEY), repo)
    assert r.ok
    text = r.human()
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b[2K" in text


def test_an_attempt_bundle_needs_no_repository_and_has_no_review(landed: tuple) -> None:
    repo, base, _, diff = landed
    f = other(
        facts_for(repo, base, None, diff),
        passed=False,
        cause="test_failure",
        tests=[TestFact("tests/test_calc.py::test_a", "failed")],
    )
    r = check(sign(f, KEY), None)
    assert r.ok, r.problems
    assert r.proven["scope"] == "attempt" and r.proven["tests"]["result"] == "FAILED"
    assert "review" not in r.proven and "not landed" in r.human()
    refused(check(sign(f, KEY), None, commit="HEAD"), "this bundle is about one attempt's diff")


def test_the_verifier_loads_nothing_of_the_server() -> None:
    import subprocess
    import sys

    code = (
        "import sys, crewwork.attestation.verify, crewwork.attestation.keys\n"
        "print(sorted(m for m in ('temporalio', 'sqlalchemy', 'fastapi', 'httpx', 'asyncpg') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_hostile_repository_runs_nothing_and_cannot_stand_in_for_the_commit(
    bundle: bytes, landed: tuple, tmp_path: Path
) -> None:
    """`--repo` may be a repository someone else prepared (a bare repository handed over, a shared directory). Its
    config must run nothing and its replace refs must not stand in for the signed commit. Before, with
    `log.showSignature = true` and `gpg.program = <their script>` in its config and `refs/replace/<landed commit>`
    pointing at a copy with a `gpgsig` header, `crewwork verify` ran their script (it read the commit with
    `git show`) and still said OK; a repository holding only the replacement, not the signed commit, passed too."""
    import shutil
    import subprocess

    repo, _base, commit, _diff = landed
    hostile = tmp_path / "hostile.git"
    subprocess.run(["git", "clone", "-q", "--mirror", str(repo), str(hostile)], check=True)
    marker = tmp_path / "ran"
    script = tmp_path / "evil-gpg"
    script.write_text(f"#!/bin/sh\necho ran >> {marker}\nexit 1\n")
    script.chmod(0o755)

    def g(*args: str, input_: bytes | None = None) -> str:
        out = subprocess.run(["git", f"--git-dir={hostile}", *args], input=input_, capture_output=True, check=True)
        return out.stdout.decode().strip()

    g("config", "log.showSignature", "true")
    g("config", "gpg.program", str(script))
    raw = g("cat-file", "commit", commit).split("\n")
    at = next(i for i, line in enumerate(raw) if line.startswith("committer ")) + 1
    signed_copy = "\n".join(
        [*raw[:at], "gpgsig -----BEGIN PGP SIGNATURE-----", " ", " -----END PGP SIGNATURE-----", *raw[at:]]
    )
    replacement = g("hash-object", "-t", "commit", "-w", "--stdin", input_=signed_copy.encode() + b"\n")
    g("replace", commit, replacement)

    report = check(bundle, hostile, commit=commit)
    assert not marker.exists(), "the repository's gpg.program ran"
    assert report.ok, report.problems
    # Without the signed commit itself (only something its replace ref points at), the commit is not there.
    only_replacement = tmp_path / "only-replacement.git"
    shutil.copytree(hostile, only_replacement)
    subprocess.run(["git", f"--git-dir={only_replacement}", "update-ref", "-d", "refs/heads/crewwork/wi_a"], check=True)
    subprocess.run(
        ["git", f"--git-dir={only_replacement}", "-c", "gc.reflogExpire=now", "gc", "-q", "--prune=now"],
        check=True,
        env={**os.environ, "GIT_NO_REPLACE_OBJECTS": "1"},
    )
    has = subprocess.run(
        ["git", f"--git-dir={only_replacement}", "cat-file", "-e", commit],
        env={**os.environ, "GIT_NO_REPLACE_OBJECTS": "1"},
        capture_output=True,
    )
    assert has.returncode != 0, "the signed commit is gone; only its replacement is left"
    refused(check(bundle, only_replacement, commit=None), f"git:commit {commit} cannot be read")
    assert not marker.exists()
