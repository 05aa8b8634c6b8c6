"""Operator settings of the MCP endpoint (`/mcp` on the API; environment prefix CREWWORK_MCP_).

Every answer of the endpoint is bounded by these numbers; docs/mcp.md lists them with what a client sees when it
reaches one.
"""

from __future__ import annotations

from pydantic import AnyHttpUrl, Field, TypeAdapter, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class McpSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CREWWORK_MCP_", extra="ignore")

    enabled: bool = Field(default=True, description="Serve the MCP endpoint at /mcp on every API process.")
    resource_url: str | None = Field(
        default=None,
        description="The endpoint's public URL (e.g. https://crewwork.example.com/mcp), named by the protected-resource "
        "metadata and the 401's WWW-Authenticate header. Default: the request's own scheme and Host (once the Host "
        "passed CREWWORK_MCP_ALLOWED_HOSTS) plus /mcp.",
    )
    authorization_server: str | None = Field(
        default=None,
        description="URL the protected-resource metadata names as `authorization_servers` (RFC 9728 needs one). "
        "crewwork embeds no authorization server: API keys come from `crewwork keys create`. Default: the "
        "resource URL's origin.",
    )
    allowed_hosts: str = Field(
        default="127.0.0.1:*,localhost:*,[::1]:*",
        description="Comma-separated Host header values /mcp answers (DNS-rebinding protection); `name:*` allows any "
        "port. Behind a proxy, the public host name(s).",
    )
    allowed_origins: str = Field(
        default="http://127.0.0.1:*,http://localhost:*,http://[::1]:*",
        description="Comma-separated Origin header values /mcp accepts from browsers (`origin:*` any port). A request "
        "without Origin (a non-browser client) is accepted; any other Origin is a 403.",
    )
    max_file_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Largest file read_file opens at all (a bigger one is refused, naming its size).",
    )
    max_answer_bytes: int = Field(
        default=256 * 1024,
        ge=4096,
        description="Largest text one tool answer carries (file contents, diffs, logs); longer answers are cut and say "
        "where, so the client can ask for the rest by line range.",
    )
    max_tree_entries: int = Field(
        default=500_000,
        ge=1000,
        description="Largest tree (files and directories of one commit) the tools read; a listing costs this process "
        "~400 bytes per entry (200 MiB at the default), parsed in a thread and kept in a per-process cache of "
        "1,000,000 entries.",
    )
    max_directory_entries: int = Field(default=2000, ge=10, description="Most entries list_directory returns.")
    max_search_results: int = Field(default=200, ge=1, description="Most matching lines search_code may return.")
    search_timeout_s: float = Field(
        default=10.0, gt=0, description="Wall clock of one search_code; a search cut short says so (timed_out)."
    )
    max_concurrent_calls: int = Field(
        default=8,
        ge=1,
        description="Repository tool calls (reads, searches, history, maps) one API process runs at once; more wait "
        "for a free slot (within CREWWORK_MCP_TOOL_TIMEOUT_S).",
    )
    max_concurrent_calls_per_tenant: int = Field(
        default=2,
        ge=1,
        description="Repository tool calls one tenant runs at once on one API process; one more is refused at once "
        "(`busy`), so one tenant never holds every slot.",
    )
    max_regex_program_size: int = Field(
        default=5_000,
        ge=100,
        description="Largest compiled size (RE2 program instructions) of a search_code regular expression; a bigger "
        "pattern (large counted repetitions) is refused before git sees it.",
    )
    git_timeout_s: float = Field(default=30.0, gt=0, description="Wall clock of any other git command of a tool.")
    tool_timeout_s: float = Field(
        default=180.0,
        gt=0,
        description="Wall clock of one tool call, everything included (a mirror fetch, a first repository index).",
    )
    max_log_entries: int = Field(default=200, ge=1, description="Most commits git_log returns.")
    mirror_max_age_s: float = Field(
        default=60.0,
        ge=0,
        description="A branch or tag name is resolved in this host's mirror if it was fetched less than this long ago; "
        "otherwise the mirror is fetched first. 0: fetch on every name.",
    )

    @field_validator("resource_url", "authorization_server")
    @classmethod
    def _an_http_url(cls, v: str | None) -> str | None:
        # Checked at start-up: a value no URL parser takes failed every /mcp request (and its metadata) instead.
        if v is not None:
            TypeAdapter(AnyHttpUrl).validate_python(v)
        return v
