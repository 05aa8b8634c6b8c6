"""An example crewwork agent plugin: `textstats`, a `task` agent in plain Python.

Given `input: {"text": "..."}` it answers with word, line and character counts and the most common words. Replace
the body of `run` with a call into LangGraph, pydantic-ai, the OpenAI Agents SDK or anything else: crewwork runs it
as an activity on the agent pool (retries, heartbeats, budget and evidence as for the built-in agents).
"""

from __future__ import annotations

import collections
import re
from typing import Any, ClassVar

from crewwork.agents.base import Agent, AgentConfigError, AgentContext, AgentRunResult
from crewwork.models import WorkItemKind

MAX_TEXT_CHARS = 200_000


class TextStatsAgent(Agent):
    name: ClassVar[str] = "textstats"
    mock: ClassVar[bool] = False
    needs_sandbox: ClassVar[bool] = False  # it runs no commands

    @classmethod
    def validate_config(cls, kind: WorkItemKind, config: dict[str, Any]) -> None:
        """Called at submission: a bad config is a 422 naming the field, before anything is stored."""
        if kind != WorkItemKind.task:
            raise AgentConfigError("agent `textstats` runs `task` work items only")
        unknown = set(config) - {"top"}
        if unknown:
            raise AgentConfigError(f"agent `textstats`: unknown config keys {sorted(unknown)}")
        top = config.get("top", 3)
        if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= 50:
            raise AgentConfigError("agent `textstats`: `top` must be an integer from 1 to 50")

    async def run(self, ctx: AgentContext) -> AgentRunResult:
        text = (ctx.input or {}).get("text")
        if not isinstance(text, str):
            from crewwork.agents.base import AgentError

            raise AgentError("agent `textstats` needs `input.text` (a string)")
        text = text[:MAX_TEXT_CHARS]
        ctx.heartbeat()
        words = re.findall(r"[A-Za-z']+", text.lower())
        top = collections.Counter(words).most_common(int(ctx.config.get("top", 3)))
        return AgentRunResult(
            output={
                "words": len(words),
                "lines": len(text.splitlines()),
                "chars": len(text),
                "top": [[w, n] for w, n in top],
            },
            claims=f"counted {len(words)} words",
        )
