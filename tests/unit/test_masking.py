"""One masking of secrets (crewwork/boundary/masking.py): what a record keeps (events, attempts, webhook payloads) and
what a transcript, an error message or a log line keeps are masked by one table of secret shapes, so a secret
masked in one is masked in the other; and the quick look for a shape's substrings never lets one through."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from crewwork.boundary.masking import MASK, RECORD_MASK, SECRET_PATTERNS, Redactor, mask_secrets, mask_text

# One secret of each shape, and the part of it that must not survive.
SECRETS = {
    "pem": (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
        "b3Blbn",
    ),
    "url password": ("postgresql+asyncpg://crew:s3cr3t-pw@db.internal/crewwork", "s3cr3t-pw"),
    "header": ("X-Api-Key: k3y-0f-the-endpoint", "k3y-0f-the"),
    "bearer": ("Bearer abcdefghijklmnop123", "abcdefghijklmnop123"),
    "key=value": ("password=hunter2-hunter2", "hunter2-hunter2"),
    "json key": ('{"secret": "s0me-s3cret-value"}', "s0me-s3cret-value"),
    "openai": ("sk-proj-ABCDEFGHIJKLMNOPQRSTUV", "ABCDEFGHIJKLMNOPQRSTUV"),
    "crewwork key": ("cw_AbCdEfGhIjKlMnOpQrStUv", "AbCdEfGhIjKlMnOpQrStUv"),
    "webhook secret": ("whsec_MDEyMzQ1Njc4OWFiY2RlZjAx", "MDEyMzQ1Njc4OWFi"),
    "github": ("ghp_0123456789abcdefghijABCDEFGHIJ", "0123456789abcdefghij"),
    "github pat": ("github_pat_0123456789abcdefghij_KLMNOP", "0123456789abcdefghij"),
    "google": ("AIzaSyA0123456789abcdefghijklmnopqrstuv", "0123456789abcdefghijklmnop"),
    "slack": ("xoxb-1234567890-abcdefghij", "1234567890-abcdefghij"),
    "aws": ("AKIAABCDEFGHIJKLMNOP", "ABCDEFGHIJKLMNOP"),
    "jwt": ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlLXZhbHVl", "c2lnbmF0dXJl"),
    "hugging face": ("hf_abcdefghijklmnopqrstuvwx", "abcdefghijklmnopqrstuvwx"),
}


def test_records_and_text_mask_the_same_secret_shapes() -> None:
    """Before there was one table, a record (an event, an attempt) kept GitHub, Google, Slack, AWS, Hugging Face
    tokens and JWTs that a transcript masked, and a transcript or a git error kept a PEM private key, a `password=`
    value and a crewwork API key that a record masked; neither masked a webhook secret or a URL's password."""
    redact = Redactor()
    for shape, (secret, core) in SECRETS.items():
        text = f"the run said: {secret} (done)"
        record = mask_secrets({"reason": text, "output": [text]})
        assert core not in str(record), f"a record keeps a {shape}: {record}"
        assert core not in redact(text), f"text keeps a {shape}: {redact(text)}"
        assert redact(text).startswith("the run said: ")


def test_records_say_masked_as_they_did_and_text_as_it_did() -> None:
    """The markers are those the stored records and the logs already carry: `***` in a record and in place of a
    URL's password, `[REDACTED]` in text."""
    assert mask_secrets("api_key=supersecretvalue") == f"api_key={RECORD_MASK}"
    assert Redactor()("api_key=supersecretvalue") == f"api_key={MASK}"
    assert mask_text("postgresql://user:p%40ss@h/db") == "postgresql://user:***@h/db"
    assert Redactor(["my-own-secret-value-42"])("a my-own-secret-value-42 b") == f"a {MASK} b"
    assert mask_text("sqlite+aiosqlite:////tmp/x.db and http://example.test/a token abcdef") == (
        "sqlite+aiosqlite:////tmp/x.db and http://example.test/a token abcdef"
    )


def _every_pattern(text: str, marker: str) -> str:
    """The table applied without the quick look for substrings: what `mask_text` must always equal."""
    for shape in SECRET_PATTERNS:
        mark = (shape.marker or marker).replace("\\", "\\\\")
        text = shape.pattern.sub(rf"\g<1>{mark}" if shape.pattern.groups else mark, text)
    return text


# Pieces secrets are made of, spelled in every case IGNORECASE matches, including the non-ASCII letters it takes for
# ASCII ones (U+0130 and U+0131 for i, U+017F for s, U+212A for k).
_WORDS = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "api_key",
    "apikey",
    "bearer",
    "password",
    "secret",
    "token",
    "sk-",
    "cw_",
    "whsec_",
    "ghp_",
    "github_pat_",
    "xoxb-",
    "AKIA",
    "eyJ",
    "hf_",
    "AIza",
    "https://",
    "@",
    "PRIVATE KEY-----",
    "-----BEGIN RSA PRIVATE KEY-----",
]
_VARIANTS = {"i": "iI\u0130\u0131", "s": "sS\u017f", "k": "kK\u212a"}


@st.composite
def _spelled(draw: st.DrawFn) -> str:
    word = draw(st.sampled_from(_WORDS))
    return "".join(
        draw(st.sampled_from(_VARIANTS.get(c.lower(), c.lower() + c.upper()))) if c.isalpha() else c for c in word
    )


_SEPARATORS = st.sampled_from(["", ":", "=", " ", ": ", '": "', "'", ",", "}", "\n", ".", "/", "user:"])
_VALUES = st.from_regex(re.compile(r"[A-Za-z0-9_\-]{1,24}"), fullmatch=True)
# A secret-like piece: a spelled word, a separator, a value; and anything else around it.
_PIECES = st.one_of(
    st.tuples(_spelled(), _SEPARATORS, _VALUES).map("".join),
    _spelled(),
    _SEPARATORS,
    _VALUES,
    st.text(max_size=4),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=12).map("".join), st.sampled_from([MASK, RECORD_MASK]))
def test_the_quick_look_never_skips_a_secret(text: str, marker: str) -> None:
    assert mask_text(text, marker) == _every_pattern(text, marker)
