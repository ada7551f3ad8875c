"""The environments of the interaction stage: a task's tools, live or simulated, and injected
failures.

:class:`TaskTools` offers the tools of one task (pool records, named as the episode shows them)
and answers each call either through a live MCP environment shared by the run, or — for a tool
whose server cannot be run — through the teacher, which plays the tool from its schema, the
arguments and the calls made so far (``prompts/simulate_tool.v1.jinja``; the reply is a JSON
object ``{"error": bool, "output": object | list | string}``, and a tool that declares an
output schema must answer an object holding its required keys).

:class:`FailureInjection` wraps any environment and makes a share of the calls fail the way
real services do (a timeout, a 503, a rate limit, a reset connection, a 500) without reaching
the tool, so that the trajectories show the agent recovering. Which calls fail is a function
of ``(seed, task, call index)`` only (:func:`injected`): the same task fails at the same calls
in every run, and a resumed run repeats them.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from astra_agent.environment import Environment, ToolResult, ToolSpec
from astra_agent.errors import ServerError
from training.synth.teacher import Teacher, TeacherRejected
from training.synth.text import cut_text
from training.synth.tools.pool import ToolRecord

SIMULATE = "simulate_tool"  # the prompt template


# ------------------------------------------------------------------ simulated tools


class SimulatedResult(BaseModel):
    """What the teacher answers for a simulated call."""

    model_config = ConfigDict(extra="forbid")

    error: bool
    output: dict[str, Any] | list[Any] | str


@functools.cache
def _structured(required: tuple[str, ...]) -> type[SimulatedResult]:
    class StructuredResult(SimulatedResult):
        @model_validator(mode="after")
        def _fits(self) -> StructuredResult:
            if self.error:
                return self
            if not isinstance(self.output, dict):
                raise ValueError("output must be a JSON object: the tool declares an output schema")
            missing = [k for k in required if k not in self.output]
            if missing:
                raise ValueError(f"output lacks {', '.join(missing)} (the tool's output schema)")
            return self

    return StructuredResult


def result_schema(tool: ToolRecord) -> type[SimulatedResult]:
    """The reply schema for ``tool``: stricter when the tool declares an output schema."""
    schema = tool.output_schema
    if not schema or schema.get("type", "object") != "object":
        return SimulatedResult
    required = schema.get("required", [])
    names = tuple(r for r in required if isinstance(r, str)) if isinstance(required, list) else ()
    return _structured(names)


def tool_card(tool: ToolRecord, public: str) -> dict[str, Any]:
    """The tool as the simulation prompt shows it (under the name the episode uses)."""
    card: dict[str, Any] = {"name": public, "description": tool.description}
    card["parameters"] = tool.input_schema
    if tool.output_schema or tool.output_description:
        card["returns"] = tool.output_schema or tool.output_description
    return card


@dataclass(frozen=True)
class Route:
    """Where a call of one offered tool goes: the live environment's tool named ``live``, or
    the teacher (``live`` None)."""

    record: ToolRecord
    live: str | None = None


@dataclass
class Simulated:
    """One simulated call as later calls' prompts show it."""

    tool: str
    arguments: str
    result: str


class TaskTools(Environment):
    """The tools of one task (see the module). ``live`` is shared by the run and outlives
    this environment (``close`` leaves it running). A simulated call the teacher cannot
    answer returns an error result and is kept in ``rejected`` (the first), an endpoint
    failure in ``endpoint_error``, any other exception in ``fault``: the stage rejects,
    retries or stops on the whole episode."""

    def __init__(
        self,
        routes: dict[str, Route],
        *,
        simulator: Teacher | None = None,
        live: Environment | None = None,
        history_chars: int = 2000,
        history_calls: int = 20,
    ) -> None:
        if simulator is None and any(r.live is None for r in routes.values()):
            raise ValueError("simulated routes need a simulator")
        if live is None and any(r.live is not None for r in routes.values()):
            raise ValueError("live routes need a live environment")
        self.routes = routes
        self.simulator = simulator
        self.live = live
        self.history_chars = history_chars
        self.history_calls = history_calls
        self.history: list[Simulated] = []
        self.simulated_calls = 0
        self.rejected: TeacherRejected | None = None
        self.endpoint_error: ServerError | None = None
        self.fault: Exception | None = None  # anything else: a bug, which the stage raises

    async def list_tools(self) -> list[ToolSpec]:
        return [
            ToolSpec(name, r.record.description, dict(r.record.input_schema), r.record.server)
            for name, r in self.routes.items()
        ]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        route = self.routes.get(name)
        if route is None:
            return ToolResult(f"Error: unknown tool '{name}'", is_error=True)
        if route.live is not None:
            assert self.live is not None
            result = await self.live.call_tool(route.live, arguments)
        else:
            result = await self._simulate(name, route.record, arguments)
        args = json.dumps(arguments, ensure_ascii=False)
        shown = cut_text(result.text, self.history_chars, "…[{} chars cut]")
        self.history.append(Simulated(name, args, shown))
        return result

    async def _simulate(self, name: str, tool: ToolRecord, arguments: dict[str, Any]) -> ToolResult:
        assert self.simulator is not None
        if self.rejected or self.endpoint_error or self.fault:  # the episode is lost anyway
            return ToolResult(f"Error: '{name}' is unavailable.", is_error=True)
        self.simulated_calls += 1
        card = tool_card(tool, name)
        try:
            answer = await self.simulator.ask(
                SIMULATE,
                result_schema(tool),
                tool=card,
                server_description=tool.server_description,
                tool_json=json.dumps(card, ensure_ascii=False),
                arguments_json=json.dumps(arguments, ensure_ascii=False),
                history=self.history[-self.history_calls :],
            )
        except TeacherRejected as exc:
            self.rejected = self.rejected or exc
            return ToolResult(f"Error: '{name}' returned no usable result.", is_error=True)
        except ServerError as exc:
            self.endpoint_error = self.endpoint_error or exc
            return ToolResult(f"Error: '{name}' is unreachable.", is_error=True)
        except Exception as exc:  # the loop would turn it into a tool error: keep it
            self.fault = self.fault or exc
            return ToolResult(f"Error: '{name}' failed.", is_error=True)
        output = answer.value.output
        if isinstance(output, str):
            return ToolResult(output, is_error=answer.value.error)
        text = json.dumps(output, ensure_ascii=False)
        return ToolResult(text, is_error=answer.value.error, structured=output)

    async def close(self) -> None:
        return None


# ------------------------------------------------------------------ injected failures

# (kind, text): what an unreliable service answers. The agent sees only the text.
FAILURES: tuple[tuple[str, str], ...] = (
    ("timeout", "Error: the request to '{tool}' timed out after 30 s: the service did not "
                "answer in time. Try again."),
    ("unavailable", "Error: 503 Service Unavailable: '{tool}' is temporarily overloaded; "
                    "retry in a few seconds."),
    ("rate_limited", "Error: 429 Too Many Requests: the rate limit of '{tool}' was exceeded "
                     "(retry after 2 s)."),
    ("connection_reset", "Error: connection reset by peer while calling '{tool}'."),
    ("internal", "Error: 500 Internal Server Error: '{tool}' failed unexpectedly "
                 "(request id {request})."),
)  # fmt: skip


def _digest(seed: int, key: str, index: int) -> bytes:
    return hashlib.sha256(f"{seed}\x00{key}\x00{index}".encode()).digest()


def injected(rate: float, seed: int, key: str, index: int) -> bool:
    """Does call ``index`` (0-based) of the episode ``key`` fail at ``rate`` under ``seed``?"""
    draw = int.from_bytes(_digest(seed, key, index)[:8], "big") / 2**64
    return draw < rate


class InjectedFailure(BaseModel):
    """A call that was made to fail: the ``call``-th to reach the environment (0-based), and
    ``event``, its index in the trajectory's events (set by the stage)."""

    call: int
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    kind: str
    event: int | None = None
    recovered: bool = False  # a later call of the same tool succeeded


class FailureInjection(Environment):
    """``inner`` with a share ``rate`` of its calls failing (see the module)."""

    def __init__(self, inner: Environment, *, rate: float, seed: int, key: str) -> None:
        if not 0 <= rate <= 1:
            raise ValueError("the failure rate must be within 0..1")
        self.inner = inner
        self.rate, self.seed, self.key = rate, seed, key
        self.calls = 0
        self.failures: list[InjectedFailure] = []

    async def list_tools(self) -> list[ToolSpec]:
        return await self.inner.list_tools()

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        index = self.calls
        self.calls += 1
        if not injected(self.rate, self.seed, self.key, index):
            return await self.inner.call_tool(name, arguments)
        digest = _digest(self.seed, self.key, index)
        kind, text = FAILURES[digest[8] % len(FAILURES)]
        self.failures.append(InjectedFailure(call=index, tool=name, arguments=arguments, kind=kind))
        return ToolResult(text.format(tool=name, request=digest[9:13].hex()), is_error=True)

    async def close(self) -> None:
        await self.inner.close()
