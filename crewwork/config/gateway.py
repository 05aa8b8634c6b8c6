"""Operator settings of the model gateway (environment prefix CREWWORK_GATEWAY_; docs/gateway.md).

Every bound of the gateway is here, with its unit and default: what one request may carry, how long and how large one
answer may be, how many calls an attempt may make and how many at once, how fast a tenant may call, how large the
transcript may grow.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CREWWORK_GATEWAY_", extra="ignore", frozen=True)

    port: int = Field(
        default=8739,
        ge=1024,
        le=65535,
        description="The port on the sandbox's own loopback where an agent reaches the gateway (each sandbox has a "
        "network namespace of its own, so every attempt uses the same number).",
    )
    max_request_bytes: int = Field(
        default=8 * 1024 * 1024, gt=0, description="Largest request body an agent may send (more: 413, not read)."
    )
    max_response_bytes: int = Field(
        default=32 * 1024 * 1024,
        gt=0,
        description="Largest answer (a whole body, or a stream's bytes) passed back for one call; a stream is cut "
        "there and the call is recorded as cut.",
    )
    max_call_s: float = Field(
        default=900.0, gt=0, description="Longest one call may take, streaming included; it is cut there."
    )
    max_calls: int = Field(default=1000, ge=1, description="Model calls one attempt may make.")
    max_concurrent_calls: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Calls of one attempt forwarded at once (more wait their turn). 1 keeps a budget's overshoot to "
        "the one call that crossed it; n allows up to n.",
    )
    calls_per_minute: float = Field(
        default=120.0,
        ge=0,
        description="Model calls per minute per tenant on one agent-pool process (a token bucket, bursts of ten "
        "seconds' worth); over it: the protocol's 429 with Retry-After. 0: no limit. Per tenant: "
        "CREWWORK_TENANT_POLICIES' model_calls_per_minute.",
    )
    max_transcript_bytes: int = Field(
        default=16 * 1024 * 1024,
        gt=0,
        description="Size at which the transcript keeps only each further call's summary (also capped by "
        "CREWWORK_MAX_ARTIFACT_BYTES).",
    )
    max_exchange_bytes: int = Field(
        default=4 * 1024 * 1024, gt=0, description="Largest request or response kept whole in the transcript."
    )
    request_timeout_s: float = Field(
        default=60.0, gt=0, description="Time an agent has to send one whole request to the gateway."
    )
