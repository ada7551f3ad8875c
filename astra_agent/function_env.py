"""An Environment over plain Python callables (sync or async) — for libraries and tests."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from typing import Any

from astra_agent.environment import Environment, ResetUnsupportedError, ToolResult, ToolSpec


class FunctionEnvironment(Environment):
    """Tools from ``(spec, function)`` pairs; the function gets the arguments as keywords.

    A function that raises becomes an error result; a non-string return value is sent as
    JSON and kept as structured data. The functions' state is theirs, so ``reset()`` calls the
    ``reset`` function given here (sync or async: it must restore that state), and without one
    raises :class:`ResetUnsupportedError`. ``async with`` closes it (nothing to release).
    """

    def __init__(
        self,
        tools: list[tuple[ToolSpec, Callable[..., Any]]],
        *,
        reset: Callable[[], Any] | None = None,
    ) -> None:
        self._tools = {spec.name: (spec, fn) for spec, fn in tools}
        self._reset = reset

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

    async def reset(self) -> None:
        if self._reset is None:
            raise ResetUnsupportedError(
                "this FunctionEnvironment has no reset function",
                hint="pass reset= (a function that restores the tools' state)",
            )
        value = self._reset()
        if inspect.isawaitable(value):
            await value

    async def close(self) -> None:
        return None
