"""The repository map in the model agent's prompt: built (or taken from this host's cache) for the attempt's base
commit from the workspace's private git directory, keyed by the work item's repository registration, focused on the
files and names the instruction, the diagnostics and the review comment mention. A help, never a requirement: a
map that cannot be made is left out and logged, the attempt goes on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from pathlib import Path
from typing import Any

from crewwork.codeintel.repomap import IndexCache, cached_index, rank, render
from crewwork.config.codeintel import CodeIntelSettings
from crewwork.repos.trees import load_index

log = logging.getLogger("crewwork.codeintel")

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
HEARTBEAT_S = 5.0


def mentioned(text: str, paths: list[str]) -> tuple[list[str], set[str]]:
    """Files of `paths` the text names (whole path or file name) and the identifiers it uses."""
    words = set(_WORD.findall(text))
    focus = [p for p in paths if p in text or p.rsplit("/", 1)[-1] in text.split()]
    return focus[:50], words


async def repo_map_for_prompt(ctx: Any, max_tokens: int | None, context_files: list[str]) -> str | None:
    """The map text for an agent's prompt, or None (no map asked for, no registration, or it could not be made)."""
    settings = ctx.extra.get("codeintel")
    scope = ctx.extra.get("repo_id")
    ws = ctx.host_workspace
    if not isinstance(settings, CodeIntelSettings) or not scope or ws is None:
        return None
    tokens = settings.agent_map_tokens if max_tokens is None else max_tokens
    if tokens <= 0:
        return None
    git_dir: Path = ws.git.path
    commit: str = ws.base_commit
    try:
        tree = await load_index(git_dir, commit, scope=str(scope), timeout_s=settings.index_timeout_s)
        cache = IndexCache(Path(ctx.extra["codeintel_dir"]), settings.cache_max_bytes)
        build = asyncio.ensure_future(cached_index(cache, str(scope), git_dir, commit, tree.files, settings))
        while not build.done():
            ctx.heartbeat()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(build), HEARTBEAT_S)
        index, _cached = build.result()
    except Exception as exc:  # the map is a help: an attempt never fails for want of one
        log.warning("no repository map for %s at %s: %s", scope, commit[:12], exc)
        return None
    text = "\n".join(t for t in (ctx.instruction, ctx.review_comment, ctx.diagnostics) if t)
    focus, words = mentioned(text, [f.path for f in index.files])
    ranked = await asyncio.to_thread(rank, index, [*context_files, *focus], words)
    rendered = render(ranked, tokens)
    return rendered.text or None
