"""Runtime configuration, entirely from environment variables (prefix `CREWWORK_`): the one reader of them.

This file is the package's face (`from crewwork.config import Settings, get_settings`); the definitions are in

    settings.py       `Settings`: every top-level knob, with its unit in its name and a description; `get_settings()`
    describe.py       what `crewwork config` prints, and the start-up message for an invalid setting
    api.py            CREWWORK_API_*: the API process's own options
    mcp.py            CREWWORK_MCP_*: the MCP endpoint
    codeintel.py      CREWWORK_CODEINTEL_*: repository maps
    attestation.py    CREWWORK_EVIDENCE_*: who signs evidence bundles, with which key, what is published
    gateway.py        CREWWORK_GATEWAY_*: the model gateway's port and bounds
    sandbox.py        CREWWORK_SANDBOX_*: sandbox limits and operator maximums
    operations.py     CREWWORK_DEPLOYMENT_*, CREWWORK_RETENTION_*, CREWWORK_SWEEP_*: builds, retention, the host sweep
    repos.py          the repositories' credentials, forges and setup secrets
    tenant_policy.py  the shape of a per-tenant policy override (CREWWORK_TENANT_POLICIES)

The package imports no code that acts on the settings, so every process can read them cheaply. Code is handed the
settings it needs; `get_settings()` is for a process's entry point. tests/unit/test_config_surface.py fails when the
code names a CREWWORK_* variable that is not a field here.
"""

from __future__ import annotations

from crewwork.config.describe import SECRET_SETTINGS, describe_settings, invalid_settings_message
from crewwork.config.settings import DEFAULT_DATA_DIR, Settings, get_settings, reset_settings_cache

__all__ = [
    "DEFAULT_DATA_DIR",
    "SECRET_SETTINGS",
    "Settings",
    "describe_settings",
    "get_settings",
    "invalid_settings_message",
    "reset_settings_cache",
]
