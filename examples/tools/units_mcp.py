"""A tiny MCP server over stdio: the `mcp` kind's example in docs/tools.md.

    python examples/tools/units_mcp.py        # speaks MCP on stdin/stdout (the run starts it)
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
    server.run()
