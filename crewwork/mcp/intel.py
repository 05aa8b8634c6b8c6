"""MCP code-intelligence tools: a repository map and symbol lookup (crewwork.codeintel) for a tenant's
registration at a commit."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field

from crewwork.mcp.context import Args, RefField, RepoField, ToolContext, _where
from crewwork.mcp.repos import McpToolError, OpenRepo

# ---------------------------------------------------------------------------------------------- code intelligence


class RepoMapArgs(Args):
    repo: str = RepoField
    ref: str | None = RefField
    max_tokens: int = Field(default=1024, ge=64, le=16_384, description="Size budget of the map (~4 characters each).")
    focus: list[str] = Field(
        default_factory=list, max_length=50, description="Files to rank around (those being worked on)."
    )


async def _index(ctx: ToolContext, repo: OpenRepo) -> tuple[Any, bool]:
    from crewwork.codeintel.repomap import IndexCache, IndexError_, cached_index

    tree = await repo.index()
    cache = IndexCache(ctx.settings.resolved_codeintel_dir(), ctx.settings.codeintel.cache_max_bytes)
    try:
        return await cached_index(cache, repo.scope, repo.git_dir, repo.commit, tree.files, ctx.settings.codeintel)
    except IndexError_ as exc:
        raise McpToolError("index_failed", str(exc)) from None


async def repo_map(ctx: ToolContext, args: RepoMapArgs) -> dict[str, Any]:
    from crewwork.codeintel.repomap import rank, render

    async with ctx.repos.open(args.repo, args.ref) as repo:
        index, cached = await _index(ctx, repo)
        # Ranking is pure Python over tenant-derived data: in a thread, so this process keeps serving meanwhile.
        rendered = await asyncio.to_thread(lambda: render(rank(index, focus=args.focus), args.max_tokens))
        return {
            **_where(repo),
            "map": rendered.text,
            "tokens": rendered.tokens,
            "files": rendered.files,
            "definitions": rendered.definitions,
            "total_definitions": rendered.total_definitions,
            "indexed_files": len(index.files),
            "skipped": index.skipped,
            "cached": cached,
        }


class FindSymbolArgs(Args):
    repo: str = RepoField
    name: str = Field(description="The symbol's name (case-sensitive).", min_length=1, max_length=200)
    ref: str | None = RefField
    prefix: bool = Field(default=False, description="Also names that start with `name`.")
    max_results: int = Field(default=50, ge=1, le=500)


async def find_symbol(ctx: ToolContext, args: FindSymbolArgs) -> dict[str, Any]:
    from crewwork.codeintel.repomap import find

    async with ctx.repos.open(args.repo, args.ref) as repo:
        index, cached = await _index(ctx, repo)
        defs, refs = await asyncio.to_thread(find, index, args.name, prefix=args.prefix, limit=args.max_results)
        return {**_where(repo), "name": args.name, "definitions": defs, "referenced_in": refs, "cached": cached}
