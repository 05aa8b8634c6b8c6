"""A verifier reads hostile input: every bundle below is refused by `crewwork verify` with exit 6 and one line
naming why, never a traceback, never accepted, and within a bounded amount of memory (each run has an address-space
limit of 512 MiB: the 60 MiB bundle of one long array took 2.5 GiB and ~20 s before, and a 5,000-digit integer
crashed it with exit 1). The bundles are made from a real signed one; the CLI runs as its own process on stdin."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner

from crewwork.attestation.keys import PublicKey, keys_document
from tests.evidence.helpers import doc, facts_for, landed_repo, sign

KEY = CryptoSigner.generate_ed25519()
ADDRESS_SPACE = 512 * 1024 * 1024
MT = "application/vnd.crewwork.attestation-bundle.v1+json"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, Path]:
    """(repository, a good bundle, the public key file)."""
    tmp = tmp_path_factory.mktemp("hostile")
    repo, base, commit, diff = landed_repo(tmp / "repo")
    pub = tmp / "key.pub"
    pub.write_text(PublicKey(KEY.public_key).pem())  # type: ignore[arg-type]
    return repo, sign(facts_for(repo, base, commit, diff), KEY), pub


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def verify(data: bytes, repo: Path, *keys: Path) -> subprocess.CompletedProcess[str]:
    """`crewwork verify -` on `data`, in a process of its own limited to ADDRESS_SPACE."""
    r = subprocess.run(
        [sys.executable, "-m", "crewwork", "verify", "-", "--repo", str(repo), *(f"--key={k}" for k in keys)],
        input=data,
        capture_output=True,
        preexec_fn=_limited,
        timeout=600,
        check=False,
    )
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode())


def _replace_once(good: bytes, old: str, new: str) -> bytes:
    text = good.decode()
    assert old in text
    return text.replace(old, new, 1).encode()


def hostile(good: bytes) -> dict[str, tuple[bytes, str]]:
    """name -> (bundle, a fragment of the one line that refuses it)."""
    d = doc(good)
    name = next(iter(d["files"]))
    sized = json.dumps({**d, "files": {**d["files"], name: {**d["files"][name], "size": "@"}}})
    big_payload = json.loads(good)
    big_payload["envelopes"][0]["payload"] = base64.b64encode(b"[" + b"0," * (20 * 1024 * 1024) + b"0]").decode()
    mt = MT.encode()
    return {
        "a 5,000-digit integer": (
            _replace_once(good, '"size":', '"size":' + "1" * 5000 + ',"x":'),
            "an integer of 5000 digits",
        ),
        "1e999 as a file's size": (sized.replace('"@"', "1e999").encode(), "size: not a finite number"),
        "a negative size": (sized.replace('"@"', "-5").encode(), "size -5 is not a byte count"),
        "a size that is not the file's": (sized.replace('"@"', "7").encode(), "the bundle says 7 bytes"),
        "60 MiB of one long array": (
            b'{"mediaType":"' + mt + b'","envelopes":[' + b"0," * (30 * 1024 * 1024 - 40) + b"0]}",
            "holds more than 1000000 values",
        ),
        "half a million levels of nesting": (
            b'{"mediaType":' + b"[" * 500_000 + b"]" * 500_000 + b"}",
            "deeper than 64 levels",
        ),
        "nesting past 64 levels": (b'{"mediaType":' + b"[" * 65 + b"]" * 65 + b"}", "deeper than 64 levels"),
        "three million keys": (
            b'{"mediaType":"' + mt + b'","files":{' + b",".join(b'"k%d":0' % i for i in range(3_000_000)) + b"}}",
            "holds more than 1000000 values",
        ),
        "a 60 MiB string": (
            b'{"mediaType":"' + mt + b'","workItem":"' + b"x" * (60 * 1024 * 1024) + b'"}',
            "envelopes",
        ),
        # Read past in one pass: a backtracking pattern took quadratic time on this (12 s for 20 KB).
        "60 MiB of escaped quotes, never closed": (
            b'{"mediaType":"' + b'\\"' * (30 * 1024 * 1024),
            "Unterminated string",
        ),
        "a 40 MiB signature": (_with_signature(good, "A" * (40 * 1024 * 1024)), "longer than 256 / 4096 characters"),
        "a 40 MiB unsigned payload": (json.dumps(big_payload).encode(), "envelope 1"),
        "NaN": (_replace_once(good, '"scope":"landed"', '"scope":"landed","n":NaN'), "n: not a finite number"),
        "-Infinity": (_replace_once(good, '"scope":"landed"', '"scope":"landed","n":-Infinity'), "not a finite"),
        "a lone surrogate": (_replace_once(good, '"scope":"landed"', '"scope":"\\ud800"'), "lone surrogate"),
        "a lone surrogate key": (_replace_once(good, '"files":{', '"files":{"\\udfff":0,'), "lone surrogate"),
        "a duplicate key": (
            _replace_once(good, '"scope":"landed"', '"scope":"landed","scope":"attempt"'),
            "appears twice in one object",
        ),
        "a UTF-8 byte order mark": (b"\xef\xbb\xbf" + good, "byte order mark"),
        "UTF-16": (good.decode().encode("utf-16"), "byte order mark"),
        "UTF-16 without a byte order mark": (good.decode().encode("utf-16-le"), "not valid JSON"),
        "trailing data": (good.rstrip() + b" {}", "Extra data"),
        "bytes that are not UTF-8": (good.replace(b'"scope":"landed"', b'"scope":"l\xe9"'), "not UTF-8"),
        "nothing": (b"", "not valid JSON"),
    }


def _with_signature(good: bytes, sig: str) -> bytes:
    d = doc(good)
    d["envelopes"][0]["signatures"][0]["sig"] = sig
    return json.dumps(d).encode()


BIG = {
    "a 5,000-digit integer",
    "60 MiB of one long array",
    "half a million levels of nesting",
    "three million keys",
    "a 60 MiB string",
    "60 MiB of escaped quotes, never closed",
    "a 40 MiB signature",
    "a 40 MiB unsigned payload",
}
"""Run as processes of their own under the address-space limit; the others (small) run in this process."""


def verify_here(data: bytes, repo: Path, key: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    """`crewwork verify FILE` in this process: an exception escaping the CLI fails the test, as a traceback would."""
    from crewwork.cli.main import main

    bundle = tmp / "bundle.json"
    bundle.write_bytes(data)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["verify", str(bundle), "--repo", str(repo), f"--key={key}"])
    return subprocess.CompletedProcess([], code, out.getvalue(), err.getvalue())


# Nine verifier processes reading 20-60 MiB each under the address-space limit: ~15 s of CPU, run by `make test`.
@pytest.mark.heavy
def test_hostile_bundles_are_refused_in_one_line_with_the_verifiers_exit_code(
    world: tuple[Path, bytes, Path], tmp_path: Path
) -> None:
    repo, good, pub = world
    ok = verify(good, repo, pub)
    assert ok.returncode == 0, ok.stdout + ok.stderr  # the same limits let a real bundle through
    wrong: list[str] = []
    for what, (data, why) in hostile(good).items():
        r = verify(data, repo, pub) if what in BIG else verify_here(data, repo, pub, tmp_path)
        lines = r.stdout.strip().splitlines()
        if r.returncode != 6 or "Traceback" in r.stderr or not lines or why not in r.stdout:
            wrong.append(f"{what}: exit {r.returncode}, {r.stdout[:300]!r} {r.stderr[-300:]!r}")
        elif not lines[0].startswith("crewwork verify: REFUSED:"):
            wrong.append(f"{what}: {lines[0][:200]!r}")
    assert not wrong, "\n".join(wrong)


def test_a_keys_document_naming_the_only_key_revoked_says_it_is_revoked(
    world: tuple[Path, bytes, Path], tmp_path: Path
) -> None:
    repo, good, _ = world
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps(keys_document([PublicKey(KEY.public_key, status="revoked")])))  # type: ignore[arg-type]
    r = verify(good, repo, keys)
    assert r.returncode == 6, r.stdout + r.stderr
    assert r.stdout.startswith("crewwork verify: REFUSED: every key given is revoked"), r.stdout
    assert KEY.public_key.keyid[:16] in r.stdout and "no trusted key given" not in r.stdout


def test_a_huge_subject_file_is_hashed_as_it_is_read_not_held(tmp_path: Path) -> None:
    """A subject file given with --files was read whole into memory (up to 1 GiB, then joined: twice that); it is
    hashed 1 MiB at a time. A sparse 600 MiB file under the 512 MiB address-space limit: refused by its digest."""
    repo, base, commit, diff = landed_repo(tmp_path / "repo")
    pub = tmp_path / "key.pub"
    pub.write_text(PublicKey(KEY.public_key).pem())  # type: ignore[arg-type]
    small = sign(facts_for(repo, base, commit, diff), KEY, embed_max_bytes=0)
    files = tmp_path / "files"
    files.mkdir()
    with (files / "landed.patch").open("wb") as f:
        f.truncate(600 * 1024 * 1024)
    r = subprocess.run(
        [sys.executable, "-m", "crewwork", "verify", "-", "--repo", str(repo), f"--key={pub}", "--files", str(files)],
        input=small,
        capture_output=True,
        preexec_fn=_limited,
        timeout=600,
        check=False,
    )
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 6 and "Traceback" not in err, out + err
    assert f"subject landed.patch: the file {files / 'landed.patch'}'s sha256 is" in out, out
