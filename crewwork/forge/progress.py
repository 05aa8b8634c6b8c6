"""What a work item's one progress comment on its issue says, as a pure function of the item as it is now.

The intake (crewwork/api/forge_intake.py) posts it once and edits it in place whenever this text changes: admitted,
attempt k running, validating, awaiting review (with links to the console and the Temporal Web UI), then the end.
An item says **done** only when the forge agrees: its pull request's head, as the forge reports it, is the commit
crewwork landed. Otherwise it says what it landed and that the pull request does not show it, and is not done.
"""

from __future__ import annotations

from dataclasses import dataclass

MARKER = "<!-- crewwork:progress -->"
"""First line of every progress comment (invisible on the forge): what the comment is, for people and tools."""


@dataclass(frozen=True)
class ItemProgress:
    work_item_id: str
    state: str
    attempts: int
    reason: str
    console_url: str
    temporal_url: str
    mock: bool = False
    pull_request_url: str | None = None
    landed_commit: str | None = None
    delivery_branch: str | None = None
    pr_head: str | None = None
    """The pull request's head commit as the forge reported it (None: not asked, or no pull request)."""
    review_pull_url: str | None = None
    """The pull request the attempt awaiting review is shown in (review on the forge), if any."""
    posted_review_url: str | None = None
    """A `pr_review` item's review as posted on the pull request ("" when the agent's review could not be posted)."""


TERMINAL = frozenset({"succeeded", "failed", "rejected", "cancelled", "dead"})

_NOW = {
    "submitted": "admitted, starting",
    "queued": "waiting for a place in this tenant's queue",
    "admitted": "admitted, starting",
    "validating": "validating the change with the repository's tests",
    "landing": "approved; landing the change",
}


def progress_body(p: ItemProgress) -> tuple[str, bool]:
    """The comment's markdown, and whether it is the item's last word (the item ended, and any "done" was checked)."""
    links = f"[console]({p.console_url}) · [Temporal]({p.temporal_url})"
    mock = " (scripted mock agent)" if p.mock else ""
    head = f"{MARKER}\n**crewwork** work item `{p.work_item_id}`{mock}: "
    if p.state == "running":
        return f"{head}attempt {max(1, p.attempts)} running.\n\n{links}", False
    if p.state == "awaiting_review":
        where = f"on {p.review_pull_url} or " if p.review_pull_url else ""
        return (
            f"{head}validated on attempt {max(1, p.attempts)}; **awaiting review** by a person before it lands.\n\n"
            f"Review it {where}in the {links}",
            False,
        )
    if p.state not in TERMINAL:
        return f"{head}{_NOW.get(p.state, p.state)}.\n\n{links}", False
    if p.state != "succeeded":
        reason = " ".join(p.reason.split())[:500] or "no reason given"
        return f"{head}**{p.state}**: {reason}\n\n{links}", True
    if p.posted_review_url is not None:
        if not p.posted_review_url:
            return f"{head}**failed**: the agent's review could not be posted.\n\n{links}", True
        return f"{head}**done**: the agent's review is posted: {p.posted_review_url}\n\n{links}", True
    commit = (p.landed_commit or "")[:12]
    if p.pull_request_url is None:
        return f"{head}**done**: landed as `{commit}` on `{p.delivery_branch}`.\n\n{links}", True
    if p.pr_head is not None and p.landed_commit is not None and p.pr_head == p.landed_commit:
        return f"{head}**done**: {p.pull_request_url} (head `{commit}`, as landed).\n\n{links}", True
    shown = f"`{p.pr_head[:12]}`" if p.pr_head else "nothing the forge would report"
    return (
        f"{head}landed `{commit}`, but {p.pull_request_url} shows {shown} as its head, so this is not done yet.\n\n"
        f"{links}",
        False,
    )
