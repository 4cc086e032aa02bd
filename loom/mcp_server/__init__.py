"""Loom as an MCP server: streamable HTTP at `/mcp` on the API (http.py) and `loom mcp`
over stdio (loom.cli.mcp); the tools (tools.py) and the protocol server (server.py)."""
