"""The API process's application: the HTTP API (crewwork/api) with the MCP endpoint (crewwork/mcp) mounted when
the operator serves it (CREWWORK_MCP_ENABLED). The MCP tools call the API's own route functions, so the MCP sits
above the API and this module above both; the MCP SDK is loaded only when the endpoint is served.

`ApiServer` is the uvicorn server `crewwork api` runs it with: on shutdown it first ends the live event streams
(each with a resumable close, crewwork/api/streams.py), which uvicorn would otherwise wait on for as long as a
client keeps one open."""

from __future__ import annotations

import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

from crewwork.api.app import create_app
from crewwork.api.appstate import NotRunning, api_state
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


class ApiServer(uvicorn.Server):
    """uvicorn's server for the API app: on shutdown, the app's open event streams end first (a resumable close),
    so the server's wait for open connections is over at once instead of lasting until every client goes away."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.api = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            api_state(self.api).horizon.close()
        except NotRunning:  # stopped before its lifespan started: no stream to end
            pass
        await super().shutdown(sockets)
