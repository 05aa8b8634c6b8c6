"""Statements -> DSSE envelopes (securesystemslib) -> the bundle's bytes.

Ed25519 signatures are deterministic and every byte signed is canonical JSON of values read from the store and
the repository, so signing the same facts with the same key gives the same bundle: a retried landing pushes the
same note, not a second one."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from securesystemslib.dsse import Envelope
from securesystemslib.signer import Signer

from crewwork.attestation.canonical import canonical
from crewwork.attestation.facts import Facts
from crewwork.attestation.format import BUNDLE_MEDIA_TYPE, PAYLOAD_TYPE
from crewwork.attestation.statements import scope, statements


def envelope(stmt: dict[str, Any], signers: Sequence[Signer]) -> dict[str, Any]:
    env = Envelope(payload=canonical(stmt), payload_type=PAYLOAD_TYPE, signatures={})
    for signer in signers:
        env.sign(signer)
    return env.to_dict()


def embedded_files(facts: Facts, embed_max_bytes: int) -> dict[str, dict[str, Any]]:
    """Subject files in the bundle, in order, while they fit in `embed_max_bytes`; the others by artifact id."""
    out: dict[str, dict[str, Any]] = {}
    left = embed_max_bytes
    for f in facts.files():
        entry: dict[str, Any] = {"mediaType": f.media_type, "size": len(f.data)}
        if len(f.data) <= left:
            entry["base64"] = base64.b64encode(f.data).decode()
            left -= len(f.data)
        else:
            entry["artifact"] = f.artifact_id
        out[f.name] = entry
    return out


def sign_bundle(
    facts: Facts,
    signers: Sequence[Signer],
    *,
    builder_id: str,
    version: str,
    url: str,
    embed_max_bytes: int = 8 * 1024 * 1024,
) -> bytes:
    if not signers:
        raise ValueError("a bundle needs at least one signer")
    doc = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "workItem": facts.work_item_id,
        "scope": scope(facts),
        "envelopes": [envelope(s, signers) for s in statements(facts, builder_id=builder_id, version=version, url=url)],
        "files": embedded_files(facts, embed_max_bytes),
    }
    return canonical(doc) + b"\n"
