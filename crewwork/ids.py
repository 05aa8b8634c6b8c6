"""Identifiers: time-ordered, unique, with a readable prefix (`wi_…`, `art_…`, `key_…`)."""

from __future__ import annotations

import secrets
import time


def new_id(prefix: str) -> str:
    """12 hex digits of milliseconds then 12 random hex digits: sortable by creation time, never reused."""
    return f"{prefix}_{int(time.time() * 1000):012x}{secrets.token_hex(6)}"
