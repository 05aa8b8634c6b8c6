"""The API process's application: the HTTP API (crewwork/api) with the MCP endpoint (crewwork/mcp) mounted when
the operator serves it (CREWWORK_MCP_ENABLED). The MCP tools call the API's own route functions, so the MCP sits
above the API and this module above both; the MCP SDK is loaded only when the endpoint is served."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from crewwork.api.app import create_app
from crewwork.config import Settings
from crewwork.config.api import ApiOptions
from crewwork.store.store import Store


def api_app(settings: Settings, *, store: Store | None = None, options: ApiOptions | None = None) -> FastAPI:
    """What `crewwork api` serves."""
    extensions: list[Any] = []
    if settings.mcp.enabled:
        from crewwork.mcp.server import McpEndpoint

        extensions.append(McpEndpoint)
    return create_app(settings, store=store, options=options, extensions=extensions)
