"""A small MCP server for the tests, on the SDK's own server: `python mcp_test_server.py` serves over stdio,
`python mcp_test_server.py http PORT` over Streamable HTTP on loopback.

Its tools cover what a client meets: an answer, a tool that reports an error, one that kills the server
mid-call, and one that never answers."""

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("fucina-test")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return f"echo: {text}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool()
def fail(reason: str) -> str:
    """Fail with the reason given."""
    raise ToolError(reason)


@server.tool()
def crash() -> str:
    """End the server's process in the middle of the call."""
    os._exit(3)


@server.tool()
def hang() -> str:
    """Never answer."""
    while True:
        time.sleep(1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
