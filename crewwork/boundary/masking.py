"""The one masking of secrets, and what makes untrusted text storable. Secrets are masked when a record is
*written*, never when it is shown: events are append-only, and a secret that reached a log, an event or a
transcript could never be taken out again.

One table of secret shapes (`SECRET_PATTERNS`) serves every place that writes: records (events, attempts, webhook
payloads, what `crewwork config` shows; `mask_secrets`, marker `***`), and text (transcripts, error messages, git
output, log lines; `Redactor`, which also masks the exact values it is given, marker `[REDACTED]`). A URL's
password is replaced by `***` in place in both, so the URL keeps its shape (`postgresql://crew:***@db/crewwork`).

Storable text (`without_nul`, `unstorable_at`, `too_deep_at`): NUL and lone surrogates, which no store column can
keep, and JSON nested deeper than the serializers can walk.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

MASK = "[REDACTED]"
"""What replaces a secret in text (transcripts, error messages, git output, log lines)."""

RECORD_MASK = "***"
"""What replaces a secret in a stored record (events, attempts, webhook payloads, `crewwork config`)."""


@dataclass(frozen=True)
class SecretShape:
    """One shape of secret: its pattern (group 1, where it has one, is kept: a header's name, `Bearer `, a key's
    name; the rest of the match is masked), the marker it always takes (None: the caller's), and the substrings
    without which it cannot match (`needles`, looked for in the text case-folded when `folded`): most text holds
    none of them, and is then never run through the pattern."""

    pattern: re.Pattern[str]
    needles: tuple[str, ...]
    folded: bool = False
    marker: str | None = None

    def may_match(self, text: str, folded: str) -> bool:
        haystack = folded if self.folded else text
        return any(n in haystack for n in self.needles)


# Applied in this order, each to the text the one before left.
SECRET_PATTERNS = (
    # A PEM private key (an evidence signing key, an SSH key), to its END line or the end of the text.
    SecretShape(
        re.compile(
            r"(-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----)[\s\S]*?(?:-----END [A-Z0-9 ]{0,40}PRIVATE KEY-----|$)"
        ),
        ("PRIVATE KEY-----",),
    ),
    # A URL's password (scheme://user:password@): replaced in place by `***`, whatever the marker.
    SecretShape(re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]+:)[^\s@/]*(?=@)"), ("://",), marker=RECORD_MASK),
    # Authorization-style header values: one word, or two ("Bearer <token>").
    SecretShape(
        re.compile(
            r"(?i)(\b(?:proxy-authorization|authorization|x-api-key|api-key)\"?\s*[:=]\s*\"?)"
            r"[^\s\"',}]+(?: [^\s\"',}]+)?"
        ),
        ("authorization", "api-key"),
        folded=True,
    ),
    SecretShape(re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}"), ("bearer",), folded=True),
    # key=value, "key": "value" for the names secrets go by.
    SecretShape(
        re.compile(r"(?i)((?:api[_-]?key|password|secret|token)\"?\s*[:=]\s*\"?)[^\s\",}]{6,}"),
        ("apikey", "api_key", "api-key", "password", "secret", "token"),
        folded=True,
    ),
    # Token shapes: OpenAI, crewwork API keys, webhook secrets, Google, GitHub, Slack, AWS access keys, JWTs,
    # Hugging Face.
    SecretShape(
        re.compile(
            r"\b(?:sk-[A-Za-z0-9_-]{8,}|cw_[A-Za-z0-9_-]{8,}|whsec_[A-Za-z0-9+/=_-]{8,}|AIza[0-9A-Za-z_-]{30,}"
            r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}"
            r"|(?:AKIA|ASIA)[0-9A-Z]{16}\b|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
            r"|hf_[A-Za-z0-9]{20,})"
        ),
        (
            "sk-",
            "cw_",
            "whsec_",
            "AIza",
            "ghp_",
            "gho_",
            "ghu_",
            "ghs_",
            "ghr_",
            "github_pat_",
            "xoxa-",
            "xoxb-",
            "xoxp-",
            "xoxo-",
            "xoxs-",
            "xoxr-",
            "AKIA",
            "ASIA",
            "eyJ",
            "hf_",
        ),
    ),
)
"""The one table of secret shapes."""

# What `re`'s IGNORECASE matches to an ASCII letter that `str.lower` does not lower to it (U+0130 and U+0131 to i,
# U+017F to s): folded first, so a needle is found wherever its case-insensitive pattern could match.
_FOLD = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s"})

# Values shorter than this are not masked by value: masking "1" or "abc" everywhere would wreck a transcript, and
# such values are not secrets anyone relies on.
_MIN_SECRET_LEN = 6


# Every needle, in one pattern each for the text as it is and case-folded: most text holds none, and is returned
# after these two scans.
_RAW_NEEDLES = re.compile("|".join(re.escape(n) for s in SECRET_PATTERNS if not s.folded for n in s.needles))
_FOLDED_NEEDLES = re.compile("|".join(re.escape(n) for s in SECRET_PATTERNS if s.folded for n in s.needles))


def mask_text(text: str, marker: str = MASK) -> str:
    """`text` with every secret-looking substring (`SECRET_PATTERNS`) replaced by `marker`."""
    if not text:
        return text
    folded = text.lower() if text.isascii() else text.translate(_FOLD).lower()
    if _RAW_NEEDLES.search(text) is None and _FOLDED_NEEDLES.search(folded) is None:
        return text
    for shape in SECRET_PATTERNS:
        if shape.may_match(text, folded):
            mark = (shape.marker or marker).replace("\\", "\\\\")
            text = shape.pattern.sub(rf"\g<1>{mark}" if shape.pattern.groups else mark, text)
    return text


def mask_secrets(value: Any) -> Any:
    """A record as it is written: `value` with every secret-looking substring of every string in it replaced by
    `***` (dicts and lists are walked; other values are returned as they are)."""
    if isinstance(value, str):
        return mask_text(value, RECORD_MASK)
    if isinstance(value, dict):
        return {k: mask_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_secrets(v) for v in value]
    return value


class Redactor:
    """Masks a fixed set of secret values (the configured keys, a credential's token) plus the secret shapes, in
    text that is stored or shown: transcripts, error messages, git output."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if s and len(s) >= _MIN_SECRET_LEN}
        # Longest first, so a secret that contains another is masked whole.
        self._values = sorted(values, key=len, reverse=True)

    @classmethod
    def for_key_envs(cls, names: Iterable[str], env: Mapping[str, str] | None = None) -> Redactor:
        env = os.environ if env is None else env
        return cls(env.get(n, "") for n in names)

    def extended(self, secrets: Iterable[str]) -> Redactor:
        """A redactor masking these values as well."""
        return Redactor([*self._values, *secrets])

    def __call__(self, text: str) -> str:
        for value in self._values:
            text = text.replace(value, MASK)
        return mask_text(text)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    return Redactor(secrets)(text)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


MAX_NESTING = 64
"""How deep a client's JSON may nest (a submission's `input`, an agent's `config`): pydantic's serializer gives up
at a few hundred levels, which made a deeper submission a server error; 64 is far beyond any real input."""


def too_deep_at(value: Any, limit: int = MAX_NESTING, path: str = "") -> str | None:
    """Where `value` (JSON-like, or a pydantic model) nests deeper than `limit` containers, or None. Iterative: a
    recursion of its own would fail on the very input it is there to refuse."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        v, here, depth = stack.pop()
        if isinstance(v, BaseModel):
            v = v.__dict__
        if isinstance(v, dict):
            items: Any = v.items()
        elif isinstance(v, list | tuple):
            items = enumerate(v)
        else:
            continue
        if depth >= limit:
            return without_nul(here)
        for k, child in items:
            stack.append((child, f"{here}.{k}" if here else str(k), depth + 1))
    return None


def unstorable_at(value: Any, path: str = "") -> str | None:
    """Where in `value` (JSON-like, or a pydantic model) the first string holding a character no store column can keep is (NUL, a lone
    surrogate; see `without_nul`), as a dotted path ("labels.team", "validation.command.2"), or None. A submission is
    refused with it rather than stored altered: what the tenant asked for is not silently changed."""
    if isinstance(value, str):
        return path if _UNSTORABLE.search(value) else None
    if isinstance(value, BaseModel):
        # The model's own values: a JSON-mode dump replaces a lone surrogate in a dict key by U+FFFD, hiding it.
        value = value.__dict__
    if isinstance(value, dict):
        for k, v in value.items():
            here = f"{path}.{k}" if path else str(k)
            if isinstance(k, str) and _UNSTORABLE.search(k):
                return without_nul(here)
            found = unstorable_at(v, here)
            if found is not None:
                return without_nul(found)
        return None
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            found = unstorable_at(v, f"{path}.{i}" if path else str(i))
            if found is not None:
                return found
    return None


def without_nul(value: Any) -> Any:
    """`value` with every NUL character and every lone surrogate of every string in it (dict keys included) replaced
    by U+FFFD. PostgreSQL can store no NUL in a text column nor in `jsonb` (only in `json`), no text column can hold a
    surrogate (it is not UTF-8), and `jsonb` refuses one; what reaches a record is often untrusted (a test's failure
    message, an agent's claim, a review comment, a file name of non-UTF-8 bytes decoded with `surrogateescape`):
    written as it came, such a character failed the write, and with it the attempt, every time it was retried."""
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value) if _UNSTORABLE.search(value) else value
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_nul(v) for v in value]
    return value
