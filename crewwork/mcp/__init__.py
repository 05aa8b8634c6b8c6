"""The MCP endpoint of the API (docs/mcp.md): external agents read, search and hand off work over a tenant's own
registered repositories and work items, through the same rules as the HTTP API.

    server.py     the endpoint: Streamable HTTP (stateless), bearer authentication, limits, the server's instructions
    tools.py      the table of tools (their modules: context, files, history, work_items, intel)
    resources.py  the MCP resources
    repos.py      a tenant's registrations opened through this host's mirror at a commit
"""
