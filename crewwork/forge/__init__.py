"""Forges: pull requests for landed delivery branches, and intake of work from a forge's issues (docs/forge.md).

common.py         `ForgeError`, and `forge_for(url, forges)`: the operator's forge whose scope covers a repository
intake.py         what every forge dialect gives intake: the webhook side (`WebhookDialect`) and the REST side
                  (`IntakeForge`), and the values between them (`Trigger`, `IntakeRules`, `WebhookRefused`)
kinds.py          the dialects by `ForgeConfig.kind`: the one table a second dialect (GitLab, Gitea) joins
github.py         the GitHub (and GitHub Enterprise) REST dialect: pull requests, permissions, comments
github_events.py  GitHub's webhooks: the signature, the delivery, the triggers
untrusted.py      a trigger's text as an agent receives it: fenced and labelled as untrusted data
"""

from __future__ import annotations

from crewwork.forge.common import ForgeError, forge_for

__all__ = ["ForgeError", "forge_for"]
