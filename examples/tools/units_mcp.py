"""A tiny MCP server over stdio: the `mcp` kind's example in docs/tools.md.

    python examples/tools/units_mcp.py                # speaks MCP on stdin/stdout (the run starts it)
    python examples/tools/units_mcp.py --http 8765    # streamable HTTP at http://127.0.0.1:8765/mcp
"""
from __future__ import annotations

from typing import Literal

from mcp.server.mcpserver import MCPServer

server = MCPServer("units")
TO_METRES = {"m": 1.0, "km": 1000.0, "mi": 1609.344, "ft": 0.3048}


@server.tool()
def convert_length(value: float, unit: Literal["m", "km", "mi", "ft"], to: Literal["m", "km", "mi", "ft"]) -> float:
    """Convert a length from one unit to another.

    Args:
        value: the length
        unit: its unit
        to: the unit wanted
    """
    return round(value * TO_METRES[unit] / TO_METRES[to], 6)


@server.tool()
def echo(text: str) -> str:
    """Repeat the text (a second tool, to show include/exclude)."""
    return text


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="the units MCP server")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on this port, not stdio")
    args = parser.parse_args()
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run()
