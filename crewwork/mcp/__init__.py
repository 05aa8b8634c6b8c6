"""The MCP endpoint of the API (docs/mcp.md): external agents read, search and hand off work over a tenant's own
registered repositories and work items, through the same rules as the HTTP API.
"""
