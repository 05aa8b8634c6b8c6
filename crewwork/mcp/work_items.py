"""MCP work-item tools: status, evidence, git state of an item's change, submission and review -- each calls the
HTTP API's own route functions (crewwork.api.work_items), so policy, idempotency and tenancy are the API's."""

from __future__ import annotations

import re
from collections.abc import Awaitable
from typing import Any, Literal

from pydantic import Field
from starlette.responses import Response

from crewwork.api.changes import review
from crewwork.api.problems import ProblemError
from crewwork.api.service import refuse_unstorable
from crewwork.api.work_items import evidence, evidence_bundle, get_item, owned, submit
from crewwork.mcp.context import Args, ToolContext
from crewwork.mcp.repos import McpToolError
from crewwork.models import ReviewDecision, WorkItemSpec
from crewwork.store.store import Principal
from crewwork.store.views import StoredWorkItem

# ---------------------------------------------------------------------------------------------- work items

ItemId = Field(description="A work item of this tenant (wi_…).", min_length=1, max_length=64)


class WorkItemArgs(Args):
    work_item_id: str = ItemId


async def _problem(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except ProblemError as exc:
        raise McpToolError(exc.code, exc.detail) from None


async def _owned(ctx: ToolContext, work_item_id: str) -> StoredWorkItem:
    # MCP is tenant-scoped even for admin keys: an admin reads other tenants' items through the HTTP API.
    return await _problem(owned(ctx.store, _tenant_only(ctx.principal), work_item_id))


def _tenant_only(p: Principal) -> Principal:
    return Principal(tenant_id=p.tenant_id, key_id=p.key_id, scopes=frozenset(s for s in p.scopes if s != "admin"))


_STATUS = {"new file mode": "added", "deleted file mode": "deleted", "rename from": "renamed"}


def diff_status(diff: str) -> list[dict[str, str]]:
    """Each file a unified git diff changes, with how (added, deleted, renamed, modified)."""
    out: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            m = re.match(r'diff --git "?a/(.*?)"? "?b/(.*?)"?$', line)
            current = {"path": m.group(2) if m else line[11:], "status": "modified"}
            out.append(current)
        elif current is not None and not line.startswith(("+", "-", " ", "@")):
            for prefix, status in _STATUS.items():
                if line.startswith(prefix):
                    current["status"] = status
            if line.startswith("rename from "):
                current["from"] = line[len("rename from ") :]
    return out


async def git_status(ctx: ToolContext, args: WorkItemArgs) -> dict[str, Any]:
    """The change a work item's workspace holds, as the platform captured it (no git runs in a workspace: the
    workspace of a running attempt lives on an agent host, and its captured diff is what every step uses)."""
    row = await _owned(ctx, args.work_item_id)
    attempts = await ctx.store.list_attempts(row.id)
    chosen = None
    for a in reversed(attempts):
        ref = (a.agent or {}).get("diff_ref") if isinstance(a.agent, dict) else None
        if isinstance(ref, dict) and ref.get("id"):
            chosen = (a.number, str(ref["id"]))
            break
    out: dict[str, Any] = {
        "work_item_id": row.id,
        "state": row.state,
        "repository": (row.spec or {}).get("repo", {}).get("id") if isinstance(row.spec, dict) else None,
        "base_commit": row.base_commit,
        "delivery_branch": row.delivery_branch,
        "landed_commit": row.landed_commit,
        "attempt": None,
        "changes": [],
        "clean": True,
    }
    if chosen is not None:
        art = await ctx.store.work_item_artifact(row.id, chosen[1], with_content=True)
        if art is not None:
            diff = art.content_bytes[: ctx.settings.mcp.max_answer_bytes * 8].decode("utf-8", "replace")
            out.update(attempt=chosen[0], changes=diff_status(diff))
            out["clean"] = not out["changes"]
    return out


async def get_work_item(ctx: ToolContext, args: WorkItemArgs) -> dict[str, Any]:
    row = await _owned(ctx, args.work_item_id)
    view = await _problem(get_item(ctx.request, row.id, _tenant_only(ctx.principal), ctx.store, ctx.service, True))
    doc: dict[str, Any] = view.model_dump(mode="json")
    return doc


async def get_evidence(ctx: ToolContext, args: WorkItemArgs) -> dict[str, Any]:
    rows = await _problem(evidence(args.work_item_id, _tenant_only(ctx.principal), ctx.store))
    bundle = await evidence_bundle(ctx.store, await _owned(ctx, args.work_item_id))
    return {
        "work_item_id": args.work_item_id,
        "evidence_bundle": bundle.model_dump(mode="json"),
        "attempts": [r.model_dump(mode="json") for r in rows],
    }


class SubmitArgs(Args):
    work_item: dict[str, Any] = Field(
        description="The work item, exactly as POST /v1/work-items takes it (docs/api.md): kind, repo, instruction, "
        "validation, agent, budget, labels, ..."
    )
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Retrying with the same key and submission returns the same item (as the Idempotency-Key header).",
    )


async def submit_work_item(ctx: ToolContext, args: SubmitArgs) -> dict[str, Any]:
    from pydantic import ValidationError

    try:
        refuse_unstorable(args.work_item, "work_item.")
        spec = WorkItemSpec.model_validate(args.work_item)
    except ValidationError as exc:
        errs = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        raise McpToolError("invalid_work_item", errs) from None
    except ValueError as exc:
        raise McpToolError(getattr(exc, "code", "invalid_work_item"), str(exc)) from None
    response = Response()
    res = await _problem(
        submit(ctx.request, response, spec, _tenant_only(ctx.principal), ctx.service, args.idempotency_key)
    )
    doc: dict[str, Any] = res.model_dump(mode="json")
    return doc


class ReviewArgs(Args):
    work_item_id: str = ItemId
    action: Literal["approve", "reject", "request_changes"] = Field(description="The review decision.")
    comment: str | None = Field(
        default=None, max_length=20_000, description="Required to reject (the reason) and to request changes."
    )
    reviewer: str | None = Field(default=None, max_length=200, description="Who reviews (shown beside the key).")
    attempt: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="The attempt you looked at (the item's `under_review.attempt`): refused if another one waits.",
    )


async def review_work_item(ctx: ToolContext, args: ReviewArgs) -> dict[str, Any]:
    decision = ReviewDecision(action=args.action, comment=args.comment, reviewer=args.reviewer, attempt=args.attempt)
    res = await _problem(
        review(ctx.request, args.work_item_id, decision, _tenant_only(ctx.principal), ctx.store, ctx.service, ctx.state)
    )
    doc: dict[str, Any] = res.model_dump(mode="json")
    return doc
