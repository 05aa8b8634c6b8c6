"""What `crewwork config` shows of the settings (secrets say only whether they are set), and the one-line message a
process prints at start-up when a setting is invalid, naming its CREWWORK_* variable."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python
from pydantic_settings import BaseSettings, SettingsError

from crewwork.boundary.masking import mask_secrets
from crewwork.config.settings import Settings

SECRET_SETTINGS = frozenset({"api_key", "temporal_api_key"})
"""Settings whose value is a secret: `crewwork config` says whether they are set, never what they hold."""


def _shown(name: str, value: Any) -> Any:
    """A setting's value as `crewwork config` shows it: JSON-able, secrets masked (URL passwords, tokens)."""
    if value is not None and name in SECRET_SETTINGS:
        return "***"
    if isinstance(value, BaseModel | list | dict):
        value = json.dumps(to_jsonable_python(value), sort_keys=True)
    elif not isinstance(value, str | int | float | bool | type(None)):
        value = str(value)
    if isinstance(value, str):
        return mask_secrets(value)
    return value


def describe_settings(cls: type[BaseSettings] = Settings, current: BaseSettings | None = None) -> list[dict[str, Any]]:
    """Every variable of the settings, nested sections expanded: env name, default, description, section; with
    `current` (the settings in force) also `value` (secrets masked) and `set` (it came from the environment, not
    the default)."""
    rows: list[dict[str, Any]] = []
    prefix = cls.model_config.get("env_prefix", "")
    for name, f in cls.model_fields.items():
        section = f.annotation if isinstance(f.annotation, type) and issubclass(f.annotation, BaseSettings) else None
        if section is not None:
            inner = getattr(current, name) if current is not None else None
            rows += [{**row, "section": name} for row in describe_settings(section, inner)]
            continue
        env = str(f.validation_alias) if f.validation_alias else f"{prefix}{name}".upper()
        default = f.default if isinstance(f.default, str | int | float | bool | type(None)) else str(f.default)
        row: dict[str, Any] = {"env": env, "default": default, "description": f.description, "section": None}
        if current is not None:
            row["value"] = _shown(name, getattr(current, name))
            row["set"] = name in current.model_fields_set
        rows.append(row)
    return rows


def _settings_classes() -> dict[str, type[BaseSettings]]:
    out: dict[str, type[BaseSettings]] = {"Settings": Settings}
    for f in Settings.model_fields.values():
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseSettings):
            out[f.annotation.__name__] = f.annotation
    return out


def invalid_settings_message(exc: Exception) -> str | None:
    """One line naming the environment variable(s) that do not parse, for a settings error (pydantic's
    ValidationError of a settings class, or pydantic-settings' SettingsError for JSON that is not JSON); None for
    any other exception."""
    classes = _settings_classes()

    def env_of(cls: type[BaseSettings], field: str) -> str:
        f = cls.model_fields.get(field)
        if f is None:
            return field  # an alias (OTEL_*) is its own name
        if f.validation_alias:
            return str(f.validation_alias)
        return f"{cls.model_config.get('env_prefix', '')}{field}".upper()

    if isinstance(exc, ValidationError) and exc.title in classes:
        cls = classes[exc.title]
        parts = []
        for e in exc.errors()[:5]:
            loc = [str(x) for x in e.get("loc", ())]
            where = env_of(cls, loc[0]) + "".join(f"[{x}]" for x in loc[1:]) if loc else exc.title
            got = mask_secrets(str(e.get("input")))
            parts.append(f"{where}: {e.get('msg', '')} (got {got[:80]!r})")
        return "invalid configuration: " + "; ".join(parts)
    if isinstance(exc, SettingsError):
        m = re.search(r'field "([a-z0-9_]+)"', str(exc))
        field = m.group(1) if m else ""
        cls = next((c for c in classes.values() if field in c.model_fields), Settings)
        cause = f": {exc.__cause__}" if exc.__cause__ else ""
        return f"invalid configuration: {env_of(cls, field) if field else str(exc)} is not valid JSON{cause}"
    return None
