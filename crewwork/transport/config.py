"""Typed configuration of model endpoints and workload routing.

An *endpoint* is one OpenAI-compatible server and model (Ollama, vLLM, llama.cpp server, OpenAI, Gemini's
OpenAI-compatible endpoint, ...). A *route* is the ordered list of endpoints a workload ("edit", "chat",
"summary") tries. The operator declares endpoints for a worker pool in the environment
(``CREWWORK_MODEL_ENDPOINTS``, JSON); a work item's agent config may route to them and, only where the operator sets
``allow_work_item_endpoints`` (off by default), add endpoints of its own.

API keys never appear in configuration: an endpoint names the *environment variable* that holds its key, and
the key is read on the agent worker at call time. Because a submitter could otherwise name any variable of the
worker's environment (say, the database URL) and have it sent to a server of their choosing, an endpoint that
comes from a work item may only name a key variable the operator explicitly allowed (``allowed_key_envs``),
and a work item can neither redefine an operator endpoint nor point an operator key at another URL.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ENV_ENDPOINTS = "CREWWORK_MODEL_ENDPOINTS"
"""Environment variable holding the operator's transport config as JSON (see `TransportConfig`)."""

WORKLOADS = ("edit", "chat", "summary")

Protocol = Literal["chat", "responses", "messages"]
_CHAT: tuple[Protocol, ...] = ("chat",)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_ENDPOINT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class TransportSettingsError(ValueError):
    """The transport configuration is invalid; the message says which field and why."""


class EndpointConfig(BaseModel):
    """One OpenAI-compatible chat-completions endpoint and the model to ask there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(min_length=1, max_length=2048)
    """Base URL up to and including the API version, e.g. ``http://127.0.0.1:11434/v1``; the client POSTs to
    ``{base_url}/chat/completions``."""
    model: str = Field(min_length=1, max_length=256)
    """Model name as the server knows it (``gpt-4o-mini``, ``qwen2.5-coder:7b``, ``gemini-2.0-flash``)."""
    protocols: list[Protocol] = Field(default_factory=lambda: list(_CHAT), min_length=1)
    """The protocols this endpoint speaks, for the model gateway (docs/gateway.md): `chat` (OpenAI Chat Completions,
    ``{base_url}/chat/completions``), `responses` (OpenAI Responses, ``{base_url}/responses``), `messages` (Anthropic
    Messages, ``{base_url}/messages``, the key sent as ``x-api-key``). An agent CLI's calls go to the endpoints of its
    route that speak its protocol; the model agent speaks `chat`."""
    api_key_env: str | None = None
    """Name of the environment variable (on the agent worker) holding the API key, sent as a Bearer token.
    None for servers without auth (Ollama, llama.cpp). Never the key itself."""
    connect_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """Seconds to establish the TCP/TLS connection."""
    read_timeout_s: float = Field(default=300.0, gt=0, le=3600)
    """Seconds to wait for the response (a local model generating a long edit can be slow)."""
    price_per_1k_input_usd: float | None = Field(default=None, ge=0)
    """Price of 1,000 prompt tokens in USD; with the output price, enables cost accounting."""
    price_per_1k_output_usd: float | None = Field(default=None, ge=0)
    """Price of 1,000 completion tokens in USD."""
    max_output_tokens: int | None = Field(default=None, gt=0)
    """Sent as ``max_tokens`` in each request when set (caps one completion)."""
    temperature: float | None = Field(default=0.0, ge=0, le=2)
    """Sampling temperature; 0 keeps edits as repeatable as the server allows. None omits the field."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Provider-specific request fields merged into the body (e.g. ``{"top_p": 1}``). Not for secrets."""
    extra_headers: dict[str, str] = Field(default_factory=dict)
    """Extra request headers. Not for secrets: ``Authorization`` is refused here; use ``api_key_env``."""

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError("base_url must start with http:// or https://")
        return v.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env_name_not_key(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not _ENV_NAME.match(v):
            # A value that is not an identifier is most likely a pasted key; do not echo it back.
            raise ValueError("api_key_env must be the NAME of an environment variable (e.g. OPENAI_API_KEY)")
        return v

    @field_validator("extra_headers")
    @classmethod
    def _no_auth_headers(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if name.lower() in {"authorization", "proxy-authorization", "x-api-key", "api-key"}:
                raise ValueError(f"header {name!r} may carry a secret; use api_key_env instead")
        return v

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Cost of one call, 0.0 when no price is configured."""
        cost = 0.0
        if self.price_per_1k_input_usd is not None:
            cost += prompt_tokens / 1000.0 * self.price_per_1k_input_usd
        if self.price_per_1k_output_usd is not None:
            cost += completion_tokens / 1000.0 * self.price_per_1k_output_usd
        return cost


class TransportConfig(BaseModel):
    """Named endpoints plus routing by workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoints: dict[str, EndpointConfig] = Field(default_factory=dict)
    """Endpoints by name. Names are what routes refer to and what transcripts and evidence record."""
    routes: dict[str, list[str]] = Field(default_factory=dict)
    """Workload ("edit", "chat", "summary", or "default") to an ordered list of endpoint names. A workload
    with no route uses "default", then every endpoint in declaration order."""
    allowed_key_envs: list[str] = Field(default_factory=list)
    """Operator only: key variable names that endpoints declared by a work item may use. Listing a name here
    trusts submitters to send that key to a server of their choosing; leave empty to allow only keyless
    work-item endpoints (local servers)."""
    allow_work_item_endpoints: bool = False
    """Operator only: whether work items may declare endpoints of their own (off by default). A declared
    endpoint makes the agent worker POST prompts, with headers the submitter chose, to a URL the submitter chose
    (keyless unless allowed above): from inside the operator's network, so set it true only where workers can
    reach nothing a tenant must not (a single-user setup, a worker network with only model servers in it)."""
    max_retry_after_s: float = Field(default=600.0, gt=0)
    """Upper bound on a provider's ``Retry-After`` before it is handed to Temporal as the next retry delay."""

    @field_validator("endpoints")
    @classmethod
    def _endpoint_names(cls, v: dict[str, EndpointConfig]) -> dict[str, EndpointConfig]:
        for name in v:
            if not _ENDPOINT_NAME.match(name):
                raise ValueError(f"endpoint name {name!r} must be 1-64 of [A-Za-z0-9_.-]")
        return v

    def route(self, workload: str) -> list[str]:
        """Endpoint names to try, in order, for `workload`."""
        names = self.routes.get(workload) or self.routes.get("default") or list(self.endpoints)
        if not names:
            raise TransportSettingsError(
                f"no model endpoint is configured for workload {workload!r}: set {ENV_ENDPOINTS} on the "
                "agent worker or `endpoints` in the work item's agent config"
            )
        unknown = [n for n in names if n not in self.endpoints]
        if unknown:
            raise TransportSettingsError(f"route {workload!r} names unknown endpoint(s): {', '.join(unknown)}")
        return list(names)

    def key_env_names(self) -> set[str]:
        return {e.api_key_env for e in self.endpoints.values() if e.api_key_env}


def parse_transport_config(data: Mapping[str, Any] | None, *, source: str) -> TransportConfig:
    """Validate `data` (either a full `TransportConfig` or just a mapping of endpoints by name)."""
    if not data:
        return TransportConfig()
    payload: Mapping[str, Any] = data
    if "endpoints" not in data and all(isinstance(v, Mapping) and "base_url" in v for v in data.values()):
        payload = {"endpoints": data}
    try:
        return TransportConfig.model_validate(payload)
    except ValidationError as e:
        raise TransportSettingsError(f"invalid model transport config in {source}: {_brief(e)}") from None


def operator_config(raw: str) -> TransportConfig:
    """The operator's transport config from the JSON text of ``CREWWORK_MODEL_ENDPOINTS`` (Settings.model_endpoints;
    empty when unset)."""
    raw = raw.strip()
    if not raw:
        return TransportConfig()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise TransportSettingsError(f"{ENV_ENDPOINTS} is not valid JSON: {e.msg} at {e.pos}") from None
    if not isinstance(data, dict):
        raise TransportSettingsError(f"{ENV_ENDPOINTS} must be a JSON object")
    return parse_transport_config(data, source=ENV_ENDPOINTS)


def merge_configs(operator: TransportConfig, work_item: TransportConfig) -> TransportConfig:
    """Overlay a work item's endpoints and routes on the operator's, enforcing the key-variable allowlist."""
    if work_item.endpoints and not operator.allow_work_item_endpoints:
        raise TransportSettingsError(
            "this deployment does not allow work items to declare model endpoints "
            f"(allow_work_item_endpoints is false in {ENV_ENDPOINTS}); route to operator endpoints instead"
        )
    allowed = set(operator.allowed_key_envs)
    for name, ep in work_item.endpoints.items():
        if name in operator.endpoints and ep != operator.endpoints[name]:
            raise TransportSettingsError(
                f"endpoint {name!r} is defined by the operator; a work item may route to it but not redefine it"
            )
        if ep.api_key_env and ep.api_key_env not in allowed:
            raise TransportSettingsError(
                f"endpoint {name!r} in the work item names key variable {ep.api_key_env!r}, "
                f"which the operator has not allowed (add it to allowed_key_envs in {ENV_ENDPOINTS})"
            )
    if work_item.allowed_key_envs or "allow_work_item_endpoints" in work_item.model_fields_set:
        raise TransportSettingsError("allowed_key_envs and allow_work_item_endpoints are set by the operator only")
    return TransportConfig(
        endpoints={**operator.endpoints, **work_item.endpoints},
        routes={**operator.routes, **work_item.routes},
        allowed_key_envs=operator.allowed_key_envs,
        allow_work_item_endpoints=operator.allow_work_item_endpoints,
        max_retry_after_s=min(operator.max_retry_after_s, work_item.max_retry_after_s),
    )


def _brief(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
