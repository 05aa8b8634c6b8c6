"""The forge dialects by name (`ForgeConfig.kind`): the one table a second dialect (GitLab, Gitea) is added to."""

from __future__ import annotations

from crewwork.config.repos import ForgeConfig
from crewwork.forge.github import GitHubForge
from crewwork.forge.github_events import GitHubWebhooks
from crewwork.forge.intake import IntakeForge, WebhookDialect

WEBHOOK_DIALECTS: dict[str, WebhookDialect] = {"github": GitHubWebhooks()}


def webhook_dialect(kind: str) -> WebhookDialect | None:
    return WEBHOOK_DIALECTS.get(kind)


def intake_forge(config: ForgeConfig, token: str) -> IntakeForge:
    """The REST side of the forge `config` describes, with the operator's token."""
    if config.kind == "github":
        return GitHubForge(config.api_url, token, timeout_s=config.timeout_s)
    raise ValueError(f"no intake for forge kind {config.kind!r}")
