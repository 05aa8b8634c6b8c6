"""A repository's own environment: which one applies, and whether the operator allows it (checked at registration
and submission; the validate step builds it: crewwork/steps/validate/activity.py, `setup_plan`).

The environment of a work item is its own `environment`, else the operator's default for the repository
(`CREWWORK_REPO_ENVIRONMENTS`, keyed by normalised URL). It is resolved once, at submission, and stored with the
spec, so every attempt on every host prepares the same thing.
"""

from __future__ import annotations

from crewwork.config import Settings
from crewwork.config.sandbox import DEFAULT_IMAGE
from crewwork.models import EnvironmentSpec, TenantRef


class EnvironmentRejected(ValueError):
    """The environment asks for something the operator does not allow; the message names the field."""


def resolve_environment(requested: EnvironmentSpec | None, settings: Settings, locator: str) -> EnvironmentSpec | None:
    return requested if requested is not None else settings.repo_environments.get(locator)


def check_environment(env: EnvironmentSpec, settings: Settings, tenant: TenantRef | None) -> None:
    """Everything about `env` that can be checked before anything runs."""
    if env.network and not settings.setup_allowlist():
        raise EnvironmentRejected(
            "environment.network is true but the operator allows setup no network "
            "(CREWWORK_SETUP_NETWORK_ALLOWLIST is empty)"
        )
    for name in env.secrets:
        secret = settings.setup_secrets.get(name)
        if secret is None:
            raise EnvironmentRejected(f"environment.secrets: no setup secret named {name!r} is configured")
        if secret.tenants is not None and (tenant is None or not tenant.in_scope(secret.tenants)):
            raise EnvironmentRejected(f"environment.secrets: setup secret {name!r} is not available to this tenant")
    if env.image is not None and env.image not in settings.environment_image_set() | {DEFAULT_IMAGE}:
        allowed = ", ".join(sorted(settings.environment_image_set() | {DEFAULT_IMAGE}))
        raise EnvironmentRejected(
            f"environment.image {env.image!r} is not one the operator allows (CREWWORK_ENVIRONMENT_IMAGES: {allowed})"
        )
