"""The one episode loop: model ↔ environment until the model stops calling tools or a limit.

Start here to see what every user of the project runs: the agent CLI
(:mod:`astra_agent.agent`), BFCL and the arenas (``eval/``), RL rollouts and data synthesis
(``training/``) all call :func:`run_episode` with a :class:`~astra_agent.model.Model`, an
:class:`~astra_agent.environment.Environment` and the opening messages::

    async with ChatModel(ModelConfig(base_url=URL)) as model, FunctionEnvironment(tools) as env:
        traj = await run_episode(model, env, [{"role": "user", "content": "..."}])

The result is a :class:`~astra_agent.trajectory.Trajectory`; :class:`EpisodeLimits` bound the
steps, tokens, time and tool output.

Every failure of a call — invalid JSON arguments, an unknown tool, arguments that fail the
tool's schema, a tool error, a timeout — becomes a tool result the model can read; the episode
goes on and the event is counted. Parallel calls run concurrently; results go back in call
order. A ``CallPolicy`` can hand calls to the environment unchecked, for an evaluation that must
reproduce another harness's semantics (BFCL).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.environment import Environment, ToolResult, ToolSpec
from astra_agent.errors import ServerError
from astra_agent.model import DeltaHook, EndpointError, Model, ModelTurn, ToolCall
from astra_agent.schema import schema_error
from astra_agent.trajectory import CallEvent, CallStatus, Termination, Trajectory

log = logging.getLogger(__name__)


class EpisodeLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(20, ge=1, description="model calls per episode")
    max_tokens: int | None = Field(None, ge=1, description="prompt+completion tokens, summed")
    max_time_s: float | None = Field(None, gt=0, description="wall time of the episode")
    tool_timeout_s: float = Field(120.0, gt=0)
    max_tool_output_chars: int | None = Field(
        20_000, ge=200, description="head+tail truncation of tool results (None: keep whole)"
    )
    parallel_tool_calls: bool = True


class CallPolicy(BaseModel):
    """What the loop checks before a call reaches the environment. The defaults suit agents;
    an evaluation that reproduces another harness turns checks off (``eval.bfcl``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    check_names: bool = Field(True, description="a tool not offered: error result, not run")
    check_arguments: bool = Field(True, description="arguments against the tool's JSON schema")
    end_on_undecodable: bool = Field(
        False,
        description="a step with a call whose arguments are not a JSON object ends the "
        "episode (termination 'undecodable') and none of its calls runs",
    )


def decode_arguments(call: ToolCall) -> dict[str, Any] | None:
    """A call's arguments as a JSON object, or None when they are not one (empty included)."""
    try:
        args = json.loads(call.arguments)
    except (ValueError, RecursionError):  # JSONDecodeError, huge ints, deep nesting
        return None
    return args if isinstance(args, dict) else None


def truncate_middle(text: str, limit: int) -> tuple[str, bool]:
    """Keep the head and the tail of ``text`` within ``limit`` characters, with a marker."""
    if len(text) <= limit:
        return text, False
    cut = len(text) - limit
    marker = f"\n…[{cut} characters truncated]…\n"
    keep = max(0, limit - len(marker))
    head = keep * 2 // 3
    tail = keep - head
    return text[:head] + marker + (text[-tail:] if tail else ""), True


@dataclass
class _Outcome:
    result: ToolResult
    status: CallStatus
    duration_s: float


async def _run_call(
    env: Environment,
    tools: dict[str, ToolSpec],
    call: ToolCall,
    limits: EpisodeLimits,
    policy: CallPolicy,
) -> _Outcome:
    t0 = time.monotonic()

    def done(text: str, status: CallStatus, error: bool = True) -> _Outcome:
        return _Outcome(ToolResult(text, is_error=error), status, time.monotonic() - t0)

    spec = tools.get(call.name)
    if spec is None and policy.check_names:
        names = ", ".join(sorted(tools)) or "none"
        return done(f"Error: unknown tool '{call.name}'. Available tools: {names}.", "unknown_tool")
    try:
        args = json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return done(
            f"Error: the arguments of '{call.name}' are not valid JSON ({exc.msg} at "
            f"position {exc.pos}). Send a JSON object matching the tool's parameters.",
            "invalid_json",
        )
    except (ValueError, RecursionError) as exc:  # integers over 4,300 digits, deep nesting
        return done(
            f"Error: the arguments of '{call.name}' cannot be decoded ({type(exc).__name__}: "
            f"{str(exc)[:200]}). Send a JSON object matching the tool's parameters.",
            "invalid_json",
        )
    if not isinstance(args, dict):
        return done(f"Error: the arguments of '{call.name}' must be a JSON object.", "schema_error")
    problem = None
    if spec is not None and policy.check_arguments:
        problem = await schema_error(spec, args, limits.tool_timeout_s)
    if problem:
        return done(f"Error: invalid arguments for '{call.name}': {problem}", "schema_error")
    try:
        async with asyncio.timeout(limits.tool_timeout_s):
            result = await env.call_tool(call.name, args)
    except TimeoutError:
        return done(
            f"Error: tool '{call.name}' timed out after {limits.tool_timeout_s:g} s.", "timeout"
        )
    except Exception as exc:  # an environment bug must not kill the episode
        log.exception("tool %s raised", call.name)
        return done(f"Error: tool '{call.name}' failed: {type(exc).__name__}: {exc}", "tool_error")
    status: CallStatus = "tool_error" if result.is_error else "ok"
    return _Outcome(result, status, time.monotonic() - t0)


TurnHook = Callable[[ModelTurn], Awaitable[None] | None]
ResultHook = Callable[[ToolCall, ToolResult], Awaitable[None] | None]


async def _maybe_await(value: Awaitable[None] | None) -> None:
    if value is not None:
        await value


async def run_episode(
    model: Model,
    env: Environment,
    messages: list[dict[str, Any]],
    *,
    limits: EpisodeLimits | None = None,
    tools: list[ToolSpec] | None = None,
    on_turn: TurnHook | None = None,
    on_result: ResultHook | None = None,
    on_delta: DeltaHook | None = None,
    trajectory: Trajectory | None = None,
    policy: CallPolicy | None = None,
) -> Trajectory:
    """Run one episode from ``messages``; return its trajectory (never raises for tool or
    model failures: they end up in the trajectory).

    Pass ``trajectory`` to continue one (multi-turn evaluation: pass the next user message
    as ``messages`` and call again); its counters keep adding up. ``tools`` (default: the
    environment's) may differ from one call to the next: the trajectory records the change
    at the first message of the call (``Trajectory.tool_changes``).
    """
    limits = limits or EpisodeLimits()
    policy = policy or CallPolicy()
    t_start = time.monotonic()
    specs = tools if tools is not None else await env.list_tools()
    by_name = {t.name: t for t in specs}
    schemas = [t.to_openai() for t in specs]
    traj = trajectory if trajectory is not None else Trajectory()
    traj.offer_tools(schemas)
    traj.messages.extend(dict(m) for m in messages)
    traj.model = traj.model or model.name
    steps = 0
    while True:
        if steps >= limits.max_steps:
            _end(traj, "max_steps", f"{limits.max_steps} model calls")
            break
        if limits.max_time_s and time.monotonic() - t_start >= limits.max_time_s:
            _end(traj, "max_time", f"{limits.max_time_s:g} s")
            break
        t0 = time.monotonic()
        try:
            coro = model.complete(traj.messages, schemas or None, on_delta)
            left = limits.max_time_s - (t0 - t_start) if limits.max_time_s else None
            turn = await asyncio.wait_for(coro, left) if left else await coro
        except TimeoutError:
            _end(traj, "max_time", f"{limits.max_time_s:g} s (waiting for the model)")
            break
        except ServerError as exc:
            traj.model_failure = exc.kind if isinstance(exc, EndpointError) else "other"
            _end(traj, "model_error", str(exc))
            break
        finally:
            traj.timings.model_s += time.monotonic() - t0
        steps += 1
        traj.steps += 1
        traj.model = traj.model or model.name
        traj.usage.prompt_tokens += turn.prompt_tokens
        traj.usage.completion_tokens += turn.completion_tokens
        traj.recovered_calls += turn.recovered
        traj.answers_in_reasoning += turn.answer_in_reasoning
        traj.messages.append(turn.to_message())
        if on_turn:
            await _maybe_await(on_turn(turn))
        if turn.finish_reason == "length":
            _end(traj, "length", "the reply hit the model's token limit")
            break
        if not turn.tool_calls:
            if turn.content.strip() or turn.reasoning.strip():
                _end(traj, "stop")
            else:
                _end(traj, "empty_reply", "the model returned nothing")
            break
        if policy.end_on_undecodable and any(decode_arguments(c) is None for c in turn.tool_calls):
            _end(traj, "undecodable", "a call's arguments are not a JSON object; none was run")
            break
        await _run_calls(env, by_name, turn, traj, limits, policy, on_result)
        if limits.max_tokens and traj.usage.total_tokens >= limits.max_tokens:
            _end(traj, "max_tokens", f"{traj.usage.total_tokens} ≥ {limits.max_tokens} tokens")
            break
    traj.timings.total_s += time.monotonic() - t_start
    return traj


async def _run_calls(
    env: Environment,
    by_name: dict[str, ToolSpec],
    turn: ModelTurn,
    traj: Trajectory,
    limits: EpisodeLimits,
    policy: CallPolicy,
    on_result: ResultHook | None,
) -> None:
    t0 = time.monotonic()
    calls = turn.tool_calls
    if limits.parallel_tool_calls:
        outcomes = await asyncio.gather(
            *(_run_call(env, by_name, c, limits, policy) for c in calls)
        )
    else:
        outcomes = [await _run_call(env, by_name, c, limits, policy) for c in calls]
    traj.timings.tools_s += time.monotonic() - t0
    for call, out in zip(calls, outcomes, strict=True):
        text, truncated = out.result.text, False
        if limits.max_tool_output_chars is not None:
            text, truncated = truncate_middle(text, limits.max_tool_output_chars)
        traj.messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
        traj.events.append(
            CallEvent(
                step=traj.steps,
                call_id=call.id,
                name=call.name,
                arguments=call.arguments,
                status=out.status,
                duration_s=round(out.duration_s, 6),
                output_chars=len(out.result.text),
                truncated=truncated,
                recovered=call.recovered,
            )
        )
        if on_result:
            await _maybe_await(on_result(call, out.result))


def _end(traj: Trajectory, reason: Termination, detail: str = "") -> None:
    if reason != "model_error":
        traj.model_failure = None  # a continued trajectory ended otherwise this time
    traj.termination = reason
    traj.termination_detail = detail
