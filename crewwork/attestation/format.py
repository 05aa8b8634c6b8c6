"""The evidence bundle's format: media and predicate types, subject names, and every limit a verifier enforces.

A bundle is one JSON document:

    {"mediaType": BUNDLE_MEDIA_TYPE,
     "workItem": "wi_…", "scope": "landed" | "attempt",        # hints only: nothing here is trusted unsigned
     "envelopes": [DSSE envelope, …],                          # each over one in-toto Statement v1
     "files": {"<subject name>": {"mediaType": …, "size": N, "base64": "…"}     # subject contents, embedded
                                 | {"mediaType": …, "size": N, "artifact": "art_…"}}}   # too large: an artifact

Trust comes only from the envelopes' signatures; `files` are checked against the signed subjects' digests, and the
`git:` subjects against a repository. The scope and the work item a verifier reports are read from the signed
provenance, never from the wrapper.
"""

from __future__ import annotations

import re

BUNDLE_MEDIA_TYPE = "application/vnd.crewwork.attestation-bundle.v1+json"
BUNDLE_CONTENT_TYPE = "application/json"
"""How the API serves and stores a bundle (a JSON document; the media type above is inside it)."""
PAYLOAD_TYPE = "application/vnd.in-toto+json"
"""The DSSE payload type of every envelope: an in-toto Statement. Anything else is refused (type confusion)."""
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PROVENANCE = "https://slsa.dev/provenance/v1"
TEST_RESULT = "https://in-toto.io/attestation/test-result/v0.1"
REVIEW = "https://crewwork.dev/attestation/review/v1"
BUILD_TYPE = "https://crewwork.dev/evidence/work-item/v1"
PREDICATE_NAMES = {PROVENANCE: "provenance", TEST_RESULT: "test result", REVIEW: "review"}

SCOPE_LANDED = "landed"
SCOPE_ATTEMPT = "attempt"
REQUIRED_STATEMENTS = {
    SCOPE_LANDED: (PROVENANCE, TEST_RESULT, REVIEW),
    SCOPE_ATTEMPT: (PROVENANCE, TEST_RESULT),
}
"""What a bundle of each scope must hold, exactly once each."""

# Subjects that name git objects (checked against a repository); every other subject names a file.
COMMIT_SUBJECT = "git:commit"
TREE_SUBJECT = "git:tree"
GIT_SUBJECTS = (COMMIT_SUBJECT, TREE_SUBJECT)
SANDBOX_FILE = "sandbox.json"
ENVIRONMENT_FILE = "environment.json"
VALIDATION_FILE = "validation.json"
LANDED_DIFF = "landed.patch"
TREE_DIGEST = "sha256"
"""The tree subject's sha256 is the crewwork tree digest v1 of its content (crewwork.attestation.treedigest)."""


def run_url(work_item_id: str, attempt: int) -> str:
    """The Test Result's `url`: names the work item and attempt it is about (bound by the signature)."""
    return f"urn:crewwork:work-item:{work_item_id}:attempt:{attempt}"


FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""A subject that names a file is a plain file name: no directory, no `..`, no leading dot, nothing to escape."""
HEX64 = re.compile(r"^[0-9a-f]{64}$")
GIT_ID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")

# ------------------------------------------------------------------------------------------------------ limits
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
"""A bundle larger than this is refused before it is parsed."""
MAX_ENVELOPES = 16
MAX_SIGNATURES = 16
MAX_KEYID_CHARS = 256
MAX_SIGNATURE_CHARS = 4096
"""A signature's keyid and base64 `sig` are refused past these lengths before anything is decoded (a key id is 64
hex digits, an Ed25519 signature 88 characters): a 40 MiB `sig` cost seconds of decoding for nothing."""
"""Signatures one envelope may carry (a threshold needs a few; thousands would only cost verification time)."""
MAX_SUBJECTS = 256
"""Subjects (and digest-bearing descriptors) one statement may name."""
MAX_FILES = 256
MAX_JSON_DEPTH = 64
"""Objects and lists a bundle, a statement or a keys document may nest (the API's own bound)."""
MAX_JSON_VALUES = 1_000_000
"""Values and keys one JSON document a verifier reads may hold (the bundle, each statement, each JSON subject),
counted before it is parsed: a 60 MiB bundle of one long array is refused after one pass over its bytes instead of
becoming 30 million objects (it took ~20 s and 2.5 GiB). A statement lists at most TEST_IDS_MAX_COUNT test ids
(crewwork.attestation.statements), far below it."""
MAX_FILE_BYTES = 1024 * 1024 * 1024
"""A subject file read from a directory is hashed up to this size; a larger one is refused, not read on."""
MAX_PRINTED = 20
"""Test ids listed per outcome in the human output (all of them are in --json)."""
