"""An MCP server whose `die` tool kills the server mid-call (tests/orchestrator/tools/test_bad_tools.py)."""
import os
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("dying")


@server.tool()
def ok(x: int) -> int:
    """Return x + 1."""
    return x + 1


@server.tool()
def die(x: int) -> int:
    """Exit the server in the middle of the call."""
    os._exit(1)


@server.tool()
def stalls(x: int) -> int:
    """Take a minute to answer."""
    time.sleep(60)
    return x


if __name__ == "__main__":
    server.run()
