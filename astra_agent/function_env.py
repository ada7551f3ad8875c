"""An Environment over plain Python callables (sync or async) — for libraries and tests."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from typing import Any

from astra_agent.environment import ToolResult, ToolSpec


class FunctionEnvironment:
    """Tools from ``(spec, function)`` pairs; the function gets the arguments as keywords.

    A function that raises becomes an error result; a non-string return value is sent as
    JSON and kept as structured data.
    """

    def __init__(self, tools: list[tuple[ToolSpec, Callable[..., Any]]]) -> None:
        self._tools = {spec.name: (spec, fn) for spec, fn in tools}

    async def list_tools(self) -> list[ToolSpec]:
        return [spec for spec, _ in self._tools.values()]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        _, fn = self._tools[name]
        try:
            if inspect.iscoroutinefunction(fn):
                value = await fn(**arguments)
            else:
                value = await asyncio.to_thread(fn, **arguments)
        except Exception as exc:
            return ToolResult(f"Error: {type(exc).__name__}: {exc}", is_error=True)
        if isinstance(value, str):
            return ToolResult(value)
        return ToolResult(json.dumps(value, ensure_ascii=False, default=str), structured=value)

    async def close(self) -> None:
        return None
