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
    max_download_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="Largest artifact the API serves in one response."
    )
