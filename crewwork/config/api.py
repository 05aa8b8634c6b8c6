"""Options of an API process (environment, prefix `CREWWORK_`): the `api` section of Settings."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ApiOptions(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CREWWORK_", extra="ignore")

    api_rate_per_s: float = Field(
        default=20.0,
        gt=0,
        description="Requests per second each API key may make across all API processes (token bucket refill rate, "
        "kept in the store).",
    )
    api_rate_burst: int = Field(default=100, ge=1, description="Token bucket size: requests a key may burst.")
    sse_poll_s: float = Field(
        default=0.2, gt=0, description="How often the event tail polls the events table while a stream is open."
    )
    sse_keepalive_s: float = Field(default=15.0, gt=0, description="Comment line sent on idle streams.")
    webhook_delivery: bool = Field(default=True, description="Run a webhook outbox deliverer in this API process.")
    webhook_max_attempts: int = Field(default=12, ge=1, description="Failed deliveries before the dead-letter state.")
    webhook_backoff_s: float = Field(default=1.0, gt=0, description="First retry delay; doubles per attempt.")
    webhook_max_backoff_s: float = Field(default=300.0, gt=0, description="Ceiling on the retry delay.")
    forge_intake: bool = Field(
        default=True, description="Run the forge intake (triggers from forge webhooks to work items) in this process."
    )
    forge_webhook_max_bytes: int = Field(
        default=512 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="Largest forge webhook delivery accepted, bytes (docs/forge.md); refused by its Content-Length "
        "before it is read. At most the API's 1 MiB body bound.",
    )
    forge_intake_max_attempts: int = Field(
        default=20,
        ge=1,
        description="Tries of one forge trigger while the forge or Temporal is unreachable (backoff doubling from "
        "2 s to 5 min), then it fails.",
    )
    forge_poll_interval_s: float = Field(
        default=300.0,
        ge=0,
        description="How often the forge intake lists each subscribed repository's recent triggers through the "
        "forge's API, to catch up deliveries that never arrived; 0: never.",
    )
    forge_poll_lookback_s: float = Field(
        default=86400.0,
        gt=0,
        description="How far back the catch-up poll looks (never before the subscription was made).",
    )
    forge_progress_poll_s: float = Field(
        default=5.0,
        gt=0,
        description="How often the forge intake looks at each open forge-triggered work item to bring its progress "
        "comment on the issue up to date.",
    )
    forge_delivery_retention_s: float = Field(
        default=30 * 86400.0,
        gt=0,
        description="How long forge webhook delivery ids are kept for deduplication (triggers are kept for ever, so "
        "a replay of a forgotten delivery still queues nothing).",
    )
    errors_intake: bool = Field(
        default=True,
        description="Run the error intake (grouped error reports to hotfix work items) in this process "
        "(docs/errors-intake.md).",
    )
    errors_max_body_bytes: int = Field(
        default=256 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="Largest error report accepted as sent (compressed or not), bytes; refused by its Content-Length "
        "before it is read. At most the API's 1 MiB body bound.",
    )
    errors_max_decompressed_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Largest error report once decompressed, bytes: a gzip or deflate body that inflates past it "
        "(a zip bomb) is refused as soon as it does, having used no more memory than this.",
    )
    errors_max_items: int = Field(
        default=20, ge=1, le=1000, description="Items one Sentry envelope may carry (more: 413)."
    )
    errors_intake_max_attempts: int = Field(
        default=20,
        ge=1,
        description="Tries of one error group's submission while Temporal is unreachable or the tenant's queue is "
        "full (backoff doubling from 2 s to 5 min), then the group is `failed`.",
    )
    max_download_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="Largest artifact the API serves in one response."
    )
