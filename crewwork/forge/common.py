"""What every forge dialect shares: its failure (`ForgeError`, retryable or not) and the choice of the operator's
`ForgeConfig` whose scope covers a repository (`forge_for`)."""

from __future__ import annotations

from crewwork.boundary.urls import RepoURL
from crewwork.config.repos import ForgeConfig, matches


class ForgeError(RuntimeError):
    """The forge refused or failed a request. `retryable` says whether trying again later can help."""

    def __init__(self, message: str, *, retryable: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


def forge_for(url: RepoURL, forges: list[ForgeConfig]) -> ForgeConfig | None:
    """The forge hosting `url` (longest matching scope), or None."""
    best: tuple[int, ForgeConfig] | None = None
    for f in forges:
        for p in f.match:
            if matches(p, url.url) and (best is None or len(p) > best[0]):
                best = (len(p), f)
    return best[1] if best else None
