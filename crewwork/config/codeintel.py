"""Operator settings of code intelligence, the repository map (environment prefix CREWWORK_CODEINTEL_)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class CodeIntelSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CREWWORK_CODEINTEL_", extra="ignore")

    cache_dir: Path | None = Field(
        default=None,
        description="This host's cache of repository indexes, one file per (tenant's repository registration, "
        "commit). Default DATA/codeintel.",
    )
    cache_max_bytes: int = Field(
        default=1024**3,
        ge=1024 * 1024,
        description="Bound of the index cache on this host (least recently used first).",
    )
    max_files: int = Field(
        default=20_000, ge=1, description="Most source files one index parses (the rest are named as skipped)."
    )
    max_file_bytes: int = Field(
        default=512 * 1024, ge=1024, description="Largest source file parsed (bigger ones are generated or data)."
    )
    index_timeout_s: float = Field(
        default=120.0, gt=0, description="Wall clock of building one index; past it the index is refused, not cut."
    )
    parse_workers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Source-parse worker processes per host process (API, agent pool): the most files parsed at once. "
        "Parsing never runs in the API's own process.",
    )
    parse_memory_mb: int = Field(
        default=512,
        ge=64,
        description="Memory (RLIMIT_DATA) of one parse worker; a file that needs more is refused (and the worker "
        "restarted), never the index.",
    )
    parse_file_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Wall clock of parsing one file; past it the worker is killed and the file refused (and "
        "remembered, so it is never parsed again).",
    )
    parse_max_depth: int = Field(
        default=256,
        ge=8,
        description="Deepest bracket nesting ((), [], {}) of a file that is parsed; deeper files are refused before "
        "the parser sees them.",
    )
    parse_max_line_chars: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Longest line of a file that is parsed (minified or generated code is refused before parsing).",
    )
    agent_map_tokens: int = Field(
        default=1024,
        ge=0,
        description="Size budget (tokens, ~4 characters each) of the repository map in the model agent's prompt; "
        "0 leaves it out. A work item may ask for less or more (`repo_map_tokens`, at most 8192).",
    )
