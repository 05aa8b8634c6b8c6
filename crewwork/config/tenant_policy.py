"""The shape of a per-tenant policy override (`CREWWORK_TENANT_POLICIES`), apart from crewwork.admission.policy so that
crewwork.config can hold it without importing the checks."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TenantPolicy(BaseModel):
    """What one tenant may ask for, where it differs from the deployment's policy. Unset: the deployment's value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agents: list[str] | None = Field(default=None, description="Agents this tenant may name.")
    sandbox_backends: list[str] | None = Field(default=None, description="Sandbox backends it may name.")
    max_memory_mb: int | None = Field(default=None, gt=0, description="Most sandbox.memory_mb.")
    max_cpus: float | None = Field(default=None, gt=0, description="Most sandbox.cpus.")
    max_pids: int | None = Field(default=None, gt=0, description="Most sandbox.pids.")
    max_disk_mb: int | None = Field(default=None, gt=0, description="Most sandbox.disk_mb.")
    max_timeout_s: float | None = Field(default=None, gt=0, description="Most validation.timeout_s.")
    max_attempts: int | None = Field(default=None, ge=1, description="Most budget.max_attempts.")
    max_wall_clock_s: float | None = Field(default=None, gt=0, description="Most budget.max_wall_clock_s.")
    max_tokens: int | None = Field(default=None, gt=0, description="Most budget.max_tokens.")
    max_cost_usd: float | None = Field(default=None, gt=0, description="Most budget.max_cost_usd.")
    max_review_timeout_s: float | None = Field(default=None, gt=0, description="Most review.timeout_s.")
    model_calls_per_minute: float | None = Field(
        default=None,
        ge=0,
        description="Model calls per minute through the gateway (CREWWORK_GATEWAY_CALLS_PER_MINUTE).",
    )
    review_required_default: bool | None = Field(
        default=None, description="review.required of this tenant's code changes that leave it out."
    )
    retention_days: float | None = Field(
        default=None,
        ge=0,
        description="Days its ended items keep their details (CREWWORK_RETENTION_DAYS for this tenant; 0: for ever).",
    )
