"""An MCP server for tests and benchmarks whose tools misbehave on demand.

    python -m astra_agent.testing.mcp_fixture               # stdio
    python -m astra_agent.testing.mcp_fixture --http PORT   # streamable HTTP at /mcp

Environment: ``FIXTURE_STARTUP_DELAY`` (seconds to wait before serving), ``FIXTURE_EXIT_AT_START``
(exit code to die with at start-up, after printing to stderr), ``FIXTURE_NAME``.
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer(os.environ.get("FIXTURE_NAME", "fixture"), log_level="WARNING")
_calls = {"n": 0}

# 1×1 PNG, for a non-text content block.
_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415478"
    "9c63f8cfc000000301010018dd8db00000000049454e44ae426082"
)


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def count() -> int:
    """How many times this tool has been called in this server process."""
    _calls["n"] += 1
    return _calls["n"]


@server.tool()
def fail(message: str) -> str:
    """Always fails with the given message (an is_error result)."""
    raise ToolError(message)


@server.tool()
async def sleep(seconds: float) -> str:
    """Wait, then say so. A large value makes the call hang."""
    import anyio

    await anyio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def crash() -> str:
    """Kill this server process at once (exit code 3)."""
    print("fixture: crash() called", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
def huge(n: int) -> str:
    """Return n characters: 'H' for the first half, 'T' for the second."""
    return "H" * (n // 2) + "T" * (n - n // 2)


@server.tool()
def image() -> Image:
    """Return a 1×1 PNG image block."""
    return Image(data=_PNG, format="png")


@server.tool(name="dotted.name")
def dotted_name() -> str:
    """A tool whose name is not valid for OpenAI (it has a dot)."""
    return "dotted ok"


def main() -> None:
    if code := os.environ.get("FIXTURE_EXIT_AT_START"):
        print(f"fixture: refusing to start (exit {code})", file=sys.stderr, flush=True)
        sys.exit(int(code))
    delay = float(os.environ.get("FIXTURE_STARTUP_DELAY") or 0)
    if delay:
        time.sleep(delay)
    if len(sys.argv) >= 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()


if __name__ == "__main__":
    main()
