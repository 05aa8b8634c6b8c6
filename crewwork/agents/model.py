"""The model agent: a small, bounded edit loop against an OpenAI-compatible chat-completions endpoint.

One run (one repair-loop attempt):

1. Build the prompt: the instruction, the reviewer's comment, the previous attempt's diagnostics, a listing of
   the repository and the contents of a bounded selection of files (files named in the instruction,
   diagnostics or review comment, the modules those import, then — only when nothing was named — the first
   files of the listing, all within `max_context_files` / `max_context_chars`), and a map of the repository's
   most referenced definitions at the base commit (crewwork.codeintel, within `repo_map_tokens`).
2. Ask the model (workload "edit") for SEARCH/REPLACE blocks (`crewwork.agents.edits` defines the format).
3. Apply them all-or-nothing. If the response is malformed or does not apply, send the error back and ask
   again, at most `max_edit_rounds` calls in all. The first response that applies ends the run.

A `task` work item is one "chat" call whose answer becomes ``output["text"]``.

**Resumability.** After every model call the agent heartbeats ``{"agent": "model", "responses": [...], ...}``
(and repeats the same details while waiting on a slow call, so a liveness heartbeat never erases progress).
When a later Temporal attempt of the same activity starts with those details in ``ctx.resume_details``, the
recorded responses are replayed, in order, onto the fresh workspace instead of calling the model again, and
the loop goes on from there. The details are checked against the work item, the attempt and a hash of the
prompt, so a response is never replayed into a different conversation.

**Accounting.** ``tokens_used``/``cost_usd`` count every call of this attempt, replayed ones included (they
were paid for by the earlier Temporal attempt). A failing run raises with the same figures attached to the
exception (``tokens_used``, ``cost_usd``, ``transcript``) so a failed attempt's spend still reaches the
budget.

**Errors.** Provider errors keep their class (`ProviderUnavailable` is an `AgentInfraError`, retryable;
`ProviderRejected` an `AgentError`), budget exhaustion and "no applicable edit after N rounds" are
`AgentError`s. Nothing here ever turns a provider failure into a success.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from crewwork.agents.base import (
    Agent,
    AgentContext,
    AgentError,
    AgentInfraError,
    AgentRunResult,
    OperatorAgentSettings,
)
from crewwork.agents.edits import (
    DIVIDER_MARK,
    REPLACE_MARK,
    SEARCH_MARK,
    EditError,
    apply_edit_text,
)
from crewwork.agents.model_config import ModelAgentConfig, brief, validate_model_config
from crewwork.agents.model_prompt import _reask, build_prompt
from crewwork.models import WorkItemKind
from crewwork.transport import (
    ChatResult,
    EndpointConfig,
    ModelClient,
    TransportConfig,
    TransportSettingsError,
    merge_configs,
    operator_config,
)

T = TypeVar("T")

RESUME_FORMAT = 1
# Temporal rejects heartbeat details over 2 MiB (and warns from 512 KiB). Responses that do not fit are left
# out of the details; a resumed run then asks the model again from that point instead of failing to heartbeat.
RESUME_MAX_BYTES = 1024 * 1024
_SECRET_KEY_NAMES = re.compile(r"(?i)(api[_-]?key|token|secret|password|passwd|credential|authorization)")


SYSTEM_PROMPT = f"""You are a careful software engineer editing a git repository to complete a task.
Reply with edits in this exact format, one block per change:

path/to/file.py
{SEARCH_MARK}
exact lines copied from the current file
{DIVIDER_MARK}
the lines that replace them
{REPLACE_MARK}

Rules:
- Put the file path (relative to the repository root) alone on the line before {SEARCH_MARK}.
- The SEARCH lines must match the current file exactly, including indentation, and occur exactly once;
  include enough surrounding lines to make them unique. Keep SEARCH short.
- To create a new file, leave the SEARCH section empty.
- Several blocks may touch the same file; they apply in order.
- Do not edit files under .git. Do not weaken or delete tests to make them pass.
- Text outside blocks is allowed but ignored; keep it to a sentence or two.
"""


class ModelAgent(Agent):
    """Edits the workspace by asking an OpenAI-compatible model for SEARCH/REPLACE blocks."""

    name = "model"
    mock = False
    needs_sandbox = False  # edits files in the worktree itself; runs no commands
    # Inline, not in a child process: platform code whose waits are all cancellable asyncio I/O (httpx with connect
    # and read timeouts, heartbeating while a call is in flight) plus bounded work on bounded input (a prompt read
    # with size limits, SEARCH/REPLACE applied through safefs). Cancelling the attempt stops it at its next await,
    # and it keeps its resumable session (heartbeat details) without a pickled round trip per model call.
    runs_inline = True

    def __init__(self, operator: OperatorAgentSettings | None = None, env: Mapping[str, str] | None = None) -> None:
        """`operator`: the deployment's endpoints (default: this process's settings); `env`: where the endpoints'
        API keys are looked up by name (default: this process's environment)."""
        self._operator = OperatorAgentSettings.of_process() if operator is None else operator
        self._env = os.environ if env is None else env

    @classmethod
    def validate_config(cls, kind: WorkItemKind, config: dict[str, Any]) -> None:
        validate_model_config(kind, config)

    async def run(self, ctx: AgentContext) -> AgentRunResult:
        try:
            cfg = ModelAgentConfig.from_agent_config(ctx.config)
            transport = merge_configs(operator_config(self._operator.model_endpoints), cfg.transport())
            workload = "chat" if ctx.kind == WorkItemKind.task else cfg.workload
            transport.route(workload)  # fail early, with the configuration message, on a missing route
        except ValidationError as e:
            raise AgentError(f"model agent config: {brief(e)}") from None
        except TransportSettingsError as e:
            raise AgentError(str(e)) from None
        handle = ctx.extra.get("gateway")
        client = ModelClient(transport, env=self._env) if handle is None else _through(handle, transport, workload)
        session = _Session(ctx, cfg, client, workload)
        try:
            if ctx.kind == WorkItemKind.task:
                return await session.run_task()
            return await session.run_edit_loop()
        except (AgentError, AgentInfraError) as e:
            session.attach(e)
            raise


class _Session:
    """The state of one run: conversation, recorded responses, spend, and the heartbeat details."""

    def __init__(self, ctx: AgentContext, cfg: ModelAgentConfig, client: ModelClient, workload: str) -> None:
        self.ctx = ctx
        self.cfg = cfg
        self.client = client
        self.workload = workload
        # The config should hold no secrets, but a value under a key named like one is masked anyway.
        secrets = [v for k, v in _keyed_strings(ctx.config) if _SECRET_KEY_NAMES.search(k) and not k.endswith("_env")]
        self.redact = client.redact.extended(secrets)
        self.messages: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        self.replay: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []
        self.tokens_used = 0
        self.cost_usd = 0.0
        self.prompt_sha = ""

    # ------------------------------------------------------------------ the two kinds of run

    async def run_task(self) -> AgentRunResult:
        payload = json.dumps(self.ctx.input or {}, indent=2, sort_keys=True)
        user = (self.ctx.instruction or "Complete the task described by the input.") + f"\n\nInput:\n{payload}"
        self.messages = [
            {"role": "system", "content": "You are a precise assistant. Answer the task directly."},
            {"role": "user", "content": user},
        ]
        self._start()
        result = await self._ask()
        self.calls[-1]["outcome"] = "answered"
        return self._result(output={"text": result.content}, claims=result.content[:2000])

    async def run_edit_loop(self) -> AgentRunResult:
        ws = self.ctx.workspace
        if ws is None:
            raise AgentError("model agent: a code change needs a workspace")
        from crewwork.codeintel.prompt import repo_map_for_prompt

        repo_map = await repo_map_for_prompt(self.ctx, self.cfg.repo_map_tokens, list(self.cfg.context_files))
        prompt, shown = await asyncio.to_thread(build_prompt, ws, self.ctx, self.cfg, repo_map)
        system = SYSTEM_PROMPT + (f"\n{self.cfg.instructions}\n" if self.cfg.instructions else "")
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        self._start()
        last_error = ""
        for round_no in range(1, self.cfg.max_edit_rounds + 1):
            result = await self._ask()
            try:
                changed = apply_edit_text(ws, result.content)
            except EditError as e:
                last_error = str(e)
                truncated = " (the response was cut off at the output limit)" if _cut_off(result) else ""
                self.calls[-1]["outcome"] = f"refused{truncated}: {last_error}"
                if round_no < self.cfg.max_edit_rounds:
                    self.messages.append({"role": "assistant", "content": result.content})
                    self.messages.append(
                        {"role": "user", "content": _reask(ws, e, shown, truncated, self.cfg.max_file_chars)}
                    )
                continue
            self.calls[-1]["outcome"] = f"applied: {', '.join(changed)}"
            return self._result(
                output={
                    "files_changed": changed,
                    "rounds": round_no,
                    "endpoint": result.endpoint,
                    "model": result.model,
                    "replayed_calls": sum(1 for c in self.calls if c["replayed"]),
                },
                claims=_commentary(result.content),
            )
        raise AgentError(
            f"model agent: no applicable edit after {self.cfg.max_edit_rounds} model call(s); "
            f"last problem: {self.redact(last_error)}"
        )

    # ------------------------------------------------------------------ calls, replay, heartbeats

    def _start(self) -> None:
        self.prompt_sha = hashlib.sha256(json.dumps(self.messages, sort_keys=True).encode()).hexdigest()[:32]
        self.replay = self._resumable_responses()

    def _resumable_responses(self) -> list[dict[str, Any]]:
        details = self.ctx.resume_details
        # Temporal hands back the heartbeat's arguments as a sequence; accept that or the bare dict.
        if isinstance(details, list | tuple):
            details = next((d for d in reversed(details) if isinstance(d, Mapping)), None)
        if not isinstance(details, Mapping) or details.get("agent") != "model":
            return []
        same = (
            details.get("format") == RESUME_FORMAT
            and details.get("work_item_id") == self.ctx.work_item_id
            and details.get("attempt") == self.ctx.attempt
            and details.get("prompt_sha") == self.prompt_sha
        )
        responses = details.get("responses")
        if not same or not isinstance(responses, list):
            return []
        return [dict(r) for r in responses if isinstance(r, Mapping)]

    def details(self) -> dict[str, Any]:
        return {
            "agent": "model",
            "format": RESUME_FORMAT,
            "work_item_id": self.ctx.work_item_id,
            "attempt": self.ctx.attempt,
            "prompt_sha": self.prompt_sha,
            "responses": self._fitting_records(),
            "tokens_used": self.tokens_used,
            "cost_usd": self.cost_usd,
        }

    def _fitting_records(self) -> list[dict[str, Any]]:
        out, size = [], 0
        for rec in self.records:
            size += len(json.dumps(rec))
            if size > RESUME_MAX_BYTES:
                break
            out.append(rec)
        return out

    async def _ask(self) -> ChatResult:
        self._check_budget(before_call=True)
        index = len(self.records)
        replayed = index < len(self.replay)
        if replayed:
            result = ChatResult.from_record(self.replay[index])
        else:
            # A zombie of this step (a later attempt has written) must not pay for another call.
            await self.ctx.ensure_current()
            result = await self._heartbeating(
                self.client.complete(self.workload, list(self.messages), max_output_tokens=self.cfg.max_output_tokens)
            )
        self.records.append(result.to_record())
        self.tokens_used += result.usage.total_tokens
        self.cost_usd += result.cost_usd
        self.calls.append(
            {
                "call": index + 1,
                "replayed": replayed,
                "endpoint": result.endpoint,
                "model": result.model,
                "prompt_tokens": result.usage.prompt_tokens,
                "completion_tokens": result.usage.completion_tokens,
                "cost_usd": result.cost_usd,
                "finish_reason": result.finish_reason,
                "failovers": result.failovers,
                "response": result.content,
            }
        )
        # Progress is durable only once Temporal has the details: heartbeat after every call.
        self.ctx.heartbeat(self.details())
        self._check_budget(before_call=False)
        return result

    async def _heartbeating(self, call: Awaitable[T]) -> T:
        task = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.cfg.heartbeat_interval_s)
                if done:
                    return task.result()
                self.ctx.heartbeat(self.details())
        finally:
            if not task.done():
                task.cancel()

    def _check_budget(self, *, before_call: bool) -> None:
        cfg = self.cfg
        over_tokens = cfg.max_tokens is not None and (
            self.tokens_used >= cfg.max_tokens if before_call else self.tokens_used > cfg.max_tokens
        )
        over_cost = cfg.max_cost_usd is not None and (
            self.cost_usd >= cfg.max_cost_usd if before_call else self.cost_usd > cfg.max_cost_usd
        )
        if over_tokens:
            raise AgentError(
                f"model agent: token budget exhausted: {self.tokens_used} tokens used, "
                f"max_tokens is {cfg.max_tokens} (after {len(self.records)} call(s))"
            )
        if over_cost:
            raise AgentError(
                f"model agent: cost budget exhausted: ${self.cost_usd:.6f} spent, "
                f"max_cost_usd is {cfg.max_cost_usd} (after {len(self.records)} call(s))"
            )

    # ------------------------------------------------------------------ results

    def transcript(self) -> str:
        doc = {
            "agent": "model",
            "workload": self.workload,
            "work_item_id": self.ctx.work_item_id,
            "attempt": self.ctx.attempt,
            "activity_attempt": self.ctx.activity_attempt,
            "tokens_used": self.tokens_used,
            "cost_usd": self.cost_usd,
            "route": self.route_summary(),
            "messages": self.messages,
            "calls": self.calls,
        }
        return self.redact(json.dumps(doc, indent=2, ensure_ascii=False))

    def route_summary(self) -> list[dict[str, Any]]:
        config = self.client.config
        out = []
        for name in config.route(self.workload):
            ep = config.endpoints[name]
            out.append({"endpoint": name, "base_url": ep.base_url, "model": ep.model, "api_key_env": ep.api_key_env})
        return out

    def _result(self, *, output: dict[str, Any], claims: str) -> AgentRunResult:
        return AgentRunResult(
            output=json.loads(self.redact(json.dumps(output))),
            claims=self.redact(claims) or None,
            transcript=self.transcript(),
            tokens_used=self.tokens_used,
            cost_usd=self.cost_usd,
        )

    def attach(self, error: BaseException) -> None:
        """Put this run's spend and transcript on a failure, so a failed attempt is still accounted."""
        error.tokens_used = self.tokens_used  # type: ignore[attr-defined]
        error.cost_usd = self.cost_usd  # type: ignore[attr-defined]
        error.transcript = self.transcript()  # type: ignore[attr-defined]
        error.args = (self.redact(str(error)),)


def _through(handle: Any, transport: TransportConfig, workload: str) -> ModelClient:
    """A client of the attempt's model gateway (its unix socket, its token), which forwards to the route's endpoints,
    fails over between them, and accounts, bounds and records every call: one path for every agent's model calls."""
    import httpx

    first = transport.endpoints[transport.route(workload)[0]]
    slowest = max(e.read_timeout_s for e in transport.endpoints.values())
    endpoint = EndpointConfig(
        base_url="http://crewwork-gateway/v1",
        model=first.model,
        api_key_env="CREWWORK_GATEWAY_TOKEN",
        read_timeout_s=min(3600.0, slowest * len(transport.route(workload)) + 30),
        temperature=first.temperature,
        max_output_tokens=first.max_output_tokens,
        extra_body=first.extra_body,
    )
    config = TransportConfig(endpoints={"gateway": endpoint}, max_retry_after_s=transport.max_retry_after_s)
    socket = httpx.AsyncHTTPTransport(uds=str(handle.socket_path), retries=0)
    return ModelClient(config, env={"CREWWORK_GATEWAY_TOKEN": handle.token}, transport=socket)


def _cut_off(result: ChatResult) -> bool:
    return result.finish_reason == "length"


def _commentary(content: str) -> str:
    """The model's words outside edit blocks (its claims, stored as claims only)."""
    out: list[str] = []
    inside = False
    for line in content.splitlines():
        s = line.rstrip()
        if s == SEARCH_MARK:
            inside = True
            if out:
                out.pop()  # the path line
            continue
        if s == REPLACE_MARK:
            inside = False
            continue
        if not inside:
            out.append(line)
    return "\n".join(out).strip()[:2000]


def _keyed_strings(obj: Any, key: str = "") -> list[tuple[str, str]]:
    """(key, value) for every string in a nested config (list items inherit their list's key)."""
    if isinstance(obj, str):
        return [(key, obj)]
    if isinstance(obj, Mapping):
        return [kv for k, v in obj.items() for kv in _keyed_strings(v, str(k))]
    if isinstance(obj, list | tuple):
        return [kv for v in obj for kv in _keyed_strings(v, key)]
    return []
