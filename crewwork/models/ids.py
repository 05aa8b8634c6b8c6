"""Identifiers: time-ordered, unique, with a readable prefix (`wi_…`, `art_…`, `key_…`)."""

from __future__ import annotations

import re
import secrets
import time

_TENANT_ID = re.compile(r"tn_[0-9a-f]{24}")


def new_id(prefix: str) -> str:
    """12 hex digits of milliseconds then 12 random hex digits: sortable by creation time, never reused."""
    return f"{prefix}_{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def is_tenant_id(value: str) -> bool:
    """Whether `value` has the shape of a tenant id (`new_id("tn")`). Operator scopes name tenants by id or by name
    (crewwork.models.TenantRef), so no tenant's name may have this shape: it could pass for another tenant's id."""
    return _TENANT_ID.fullmatch(value) is not None
