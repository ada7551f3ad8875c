"""What the episode loop knows about tools: specs, results, and the Environment protocol.

Live MCP servers, synthesized arenas and BFCL's stateful backends all implement
:class:`Environment`; RL rollouts and SFT data synthesis use the same implementations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, runtime_checkable

from astra_agent.errors import ConfigError

OPENAI_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the model sees it (an OpenAI function schema) and where it comes from."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    origin: str = ""  # e.g. the MCP server's name

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    @classmethod
    def from_openai(cls, schema: dict[str, Any], origin: str = "") -> ToolSpec:
        fn = schema.get("function", schema)
        return cls(
            name=fn["name"],
            description=fn.get("description", "") or "",
            parameters=fn.get("parameters") or {"type": "object", "properties": {}},
            origin=origin,
        )


@dataclass(frozen=True)
class ToolResult:
    """What a tool returned: text for the model, an error flag, optional structured data."""

    text: str
    is_error: bool = False
    structured: Any = None


class ResetUnsupportedError(ConfigError):
    """The environment cannot go back to its initial state (e.g. live MCP servers, whose state
    lives outside this process): create a new one instead."""


@runtime_checkable
class Environment(Protocol):
    """The tools of an episode. Implementations own their state and their processes.

    ``reset()`` puts the environment back in the state it had when it was created, as if it
    were a new one: the same tools on offer (``list_tools`` returns its first answer), and
    nothing a previous call changed — files, modules, globals, the backends' state — visible
    to the next one. RL runs episode after episode on one environment, so a reset that keeps
    anything is a way to carry reward from one episode into the next. An environment that
    cannot do that raises :class:`ResetUnsupportedError`, never resets halfway; that is the
    default for implementations that subclass this protocol and do not override it (live MCP
    servers: their state is outside our process). Environments are async context managers
    (``async with``: enter as is, exit closes); subclassing this protocol gives both defaults.
    """

    async def list_tools(self) -> list[ToolSpec]:
        """The tools on offer (names unique and valid for OpenAI)."""
        ...

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one tool. Failures the model should see come back as ``is_error`` results."""
        ...

    async def reset(self) -> None:
        """Back to the initial state (see the class); or :class:`ResetUnsupportedError`."""
        raise ResetUnsupportedError(
            f"{type(self).__name__} cannot reset to its initial state",
            hint="create a new environment for each episode",
        )

    async def close(self) -> None:
        """Release everything (processes, connections). Safe to call twice."""
        ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
