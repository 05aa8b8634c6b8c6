"""Masking secrets in text that is stored (transcripts, error messages, logs).

Masking happens when the text is produced, not when it is shown, so a stored transcript never holds a key.
Three layers: exact values of the configured key variables, ``Authorization``-style header values, and
common token shapes (OpenAI ``sk-...``, Google ``AIza...``, GitHub, Slack, AWS access keys, JWTs).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

MASK = "[REDACTED]"

_PATTERNS = [
    re.compile(
        r"(?i)\b(authorization|proxy-authorization|x-api-key|api-key)"
        r"(\"?\s*[:=]\s*\"?)([^\s\"',}]+(?: [^\s\"',}]+)?)"
    ),
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),
]

# Values shorter than this are not masked by value: masking "1" or "abc" everywhere would wreck a transcript
# and such values are not secrets anyone relies on.
_MIN_SECRET_LEN = 6


class Redactor:
    """Masks a fixed set of secret values plus the common token patterns."""

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
        for pattern in _PATTERNS:
            if pattern.groups == 3:
                text = pattern.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
            else:
                text = pattern.sub(MASK, text)
        return text


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    return Redactor(secrets)(text)
