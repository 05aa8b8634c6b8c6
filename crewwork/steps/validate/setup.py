"""The plan a repository's environment is prepared with (crewwork.sandbox.prepare): the setup allowlist when asked
for, and the named setup secrets read from their files."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from crewwork.config import Settings
from crewwork.models import EnvironmentSpec, TenantRef
from crewwork.repos.credentials import CredentialError, read_secret
from crewwork.repos.environment import EnvironmentRejected, check_environment
from crewwork.sandbox.envplan import SetupPlan


def setup_plan(
    env: EnvironmentSpec,
    settings: Settings,
    tenant: TenantRef | None,
    *,
    exposed: Iterable[Path] = (),
    redact: Callable[[str], str] | None = None,
) -> SetupPlan:
    """The plan the prepared-environment cache builds with: the allowlist only when asked for, the named secrets
    read from their files now (so a rotated secret is picked up by the next build)."""
    check_environment(env, settings, tenant)
    secrets: dict[str, str] = {}
    for name in env.secrets:
        ref = settings.setup_secrets[name]
        try:
            secrets[ref.env] = read_secret(name, ref.file, exposed)
        except (CredentialError, UnicodeDecodeError) as exc:
            raise EnvironmentRejected(f"environment.secrets: {exc}") from None
    return SetupPlan(
        python=env.python,
        allowlist=tuple(settings.setup_allowlist()) if env.network else (),
        secrets=secrets,
        image=env.image,
        redact=redact,
    )
