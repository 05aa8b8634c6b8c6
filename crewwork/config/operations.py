"""Settings of running crewwork for months: worker builds (CREWWORK_DEPLOYMENT_*), retention of the items that ended
(CREWWORK_RETENTION_*) and the per-host sweep of what dead attempts left on disk (CREWWORK_SWEEP_*).
docs/operations.md has the procedures these serve."""

from __future__ import annotations

import re

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_BUILD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class DeploymentSettings(BaseSettings):
    """Temporal Worker Versioning: every pool process of one build declares the same deployment version."""

    model_config = SettingsConfigDict(env_prefix="CREWWORK_DEPLOYMENT_", extra="ignore")

    build_id: str | None = Field(
        default=None,
        description="This process's build (e.g. the image tag or commit). Set: the pools poll as version "
        "NAME:BUILD_ID of the worker deployment NAME; a work item's workflow is pinned to the build it started on "
        "and runs to its end there, new items take the deployment's current version (`temporal worker deployment "
        "set-current-version`). Unset: unversioned workers, every item moves to whatever code polls.",
    )
    name: str = Field(
        default="crewwork",
        description="The Temporal worker deployment the pools belong to (one per crewwork installation and task "
        "queue prefix).",
    )

    @field_validator("build_id", "name")
    @classmethod
    def _word(cls, v: str | None) -> str | None:
        if v is not None and not _BUILD_ID.match(v):
            raise ValueError("letters, digits, '.', '_' and '-' only, at most 100, starting with a letter or digit")
        return v


class RetentionSettings(BaseSettings):
    """How long the details of an item that ended are kept, and how the retention workflow goes about it."""

    model_config = SettingsConfigDict(env_prefix="CREWWORK_RETENTION_", extra="ignore")

    days: float = Field(
        default=0.0,
        ge=0,
        description="Days after an item ended before its artifacts' bytes, its events and its attempts' details are "
        "removed (its record, result, verdicts, evidence bundles and the digests they sign stay); 0 keeps them for "
        "ever. A tenant's `retention_days` in CREWWORK_TENANT_POLICIES overrides it.",
    )
    interval_s: float = Field(
        default=3600.0,
        ge=0,
        description="How often the retention workflow runs (a Temporal Schedule the control pools keep): compaction "
        "of artifacts into shared chunks, retention, removal of unreferenced chunks. 0: no schedule.",
    )
    batch: int = Field(default=100, ge=1, le=10_000, description="Items (or artifacts) per activity of a pass.")
    max_batches: int = Field(
        default=50, ge=1, description="Batches of each kind per run; what is left waits for the next run."
    )
    compact_after_s: float = Field(
        default=3600.0,
        ge=0,
        description="An ended item's artifacts are stored by content (deduplicated, compressed) this long after it "
        "ended: the previous release's processes read inline artifacts only, so keep it longer than a rolling "
        "upgrade.",
    )


class SweepSettings(BaseSettings):
    """The per-host sweep of workspaces, sandboxes and locks that attempts which died on this host left behind."""

    model_config = SettingsConfigDict(env_prefix="CREWWORK_SWEEP_", extra="ignore")

    interval_s: float = Field(
        default=300.0,
        ge=0,
        description="How often each pool process sweeps its host (also once at start); 0: only at start.",
    )
    min_age_s: float = Field(
        default=60.0,
        ge=0,
        description="A workspace or lock newer than this is left alone whatever else holds: an attempt may be "
        "making it right now.",
    )
