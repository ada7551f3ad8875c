"""``astra-agent``: run ASTRA (or any OpenAI-compatible model) against live MCP servers.

Commands: ``run`` (one task: the answer on stdout, a summary on stderr, ``--save`` appends the
trajectory to a JSONL), ``tools`` (what the configured servers offer) and ``chat``
(interactive, :mod:`astra_agent.chat`). The config is the ``mcpServers`` file other MCP clients
use, with optional ``model``/``limits``/``system``/``toolTimeout`` sections; the shared
endpoint flags are in :mod:`astra_agent.options`.

This module only parses flags and prints: the work is in :mod:`astra_agent.agent`, callable
from Python without the CLI. The entry point is ``app`` (``astra-agent``, ``python -m
astra_agent``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from astra_agent.agent import AgentConfig, load_agent_config, open_environment, run_task
from astra_agent.chat import chat_loop
from astra_agent.config import check_writable
from astra_agent.console import cli_errors, console, err_console
from astra_agent.environment import ToolResult
from astra_agent.episode import ResultHook, TurnHook
from astra_agent.errors import ConfigError
from astra_agent.mcp_config import MCPConfig
from astra_agent.model import ModelTurn, ToolCall
from astra_agent.options import common_callback, config_flags
from astra_agent.trajectory import Trajectory, append_jsonl

__all__ = ["app", "summary_table"]

app = typer.Typer(
    name="astra-agent",
    help="Run ASTRA against live MCP servers (your `mcpServers` config).\n\n"
    'Example: astra-agent run "What time is it in Tokyo?" --config mcp.json',
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="mcpServers config (JSON/YAML). Env: ASTRA_MCP_CONFIG.",
        envvar="ASTRA_MCP_CONFIG",
    ),
]
# The agent's options are its config's fields (declared once, in AgentConfig and the episode
# limits); --set reaches the rest (e.g. --set limits.max_time_s=60).
_AGENT_FLAGS = ("limits.max_steps", "tool_timeout_s", "system", "strict")
_agent_flags = config_flags(
    AgentConfig,
    _AGENT_FLAGS,
    flags={"tool_timeout_s": "tool_timeout"},
    helps={"limits.max_steps": "model calls per task"},
    endpoint=True,
)

common_callback(app, "astra-agent")


def _configure(
    save: Path | None, config: Path | None, overrides: dict[str, Any]
) -> tuple[AgentConfig, MCPConfig]:
    """``run``'s and ``chat``'s configuration, after checking that ``--save`` can be written
    (now, not after the episode: its trajectory would be lost)."""
    if save:
        check_writable(save, "--save")
    return load_agent_config(config, overrides=overrides)


def summary_table(traj: Trajectory) -> Table:
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_row(
        "termination",
        traj.termination + (f" ({traj.termination_detail})" if traj.termination_detail else ""),
    )
    t.add_row("steps", str(traj.steps))
    counts = traj.counts()
    counts.pop("answer_in_reasoning", None)
    calls = ", ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none"
    t.add_row("tool calls", f"{len(traj.events)} ({calls})")
    if traj.answers_in_reasoning:
        t.add_row(
            "answer",
            f"[yellow]found only in reasoning[/] ({traj.answers_in_reasoning} repl"
            f"{'y' if traj.answers_in_reasoning == 1 else 'ies'}): a model that does not think, "
            "served with a reasoning parser? (astra-serve up --profile instruct-cpu)",
        )
    t.add_row(
        "tokens", f"{traj.usage.prompt_tokens} prompt + {traj.usage.completion_tokens} completion"
    )
    t.add_row(
        "time",
        f"{traj.timings.total_s:.2f} s (model {traj.timings.model_s:.2f} s, tools "
        f"{traj.timings.tools_s:.2f} s)",
    )
    return t


def _printers(show_reasoning: bool) -> tuple[TurnHook, ResultHook]:
    """``run``'s compact view of the episode on stderr: calls, results, reasoning if asked."""

    def on_turn(turn: ModelTurn) -> None:
        if show_reasoning and turn.reasoning:
            err_console.print(f"[dim]{escape(turn.reasoning)}[/]")
        for c in turn.tool_calls:
            err_console.print(f"[cyan]→ {escape(c.name)}[/]({escape(c.arguments[:200])})")

    def on_result(call: ToolCall, result: ToolResult) -> None:
        style = "red" if result.is_error else "green"
        err_console.print(f"[{style}]← {escape(result.text[:200])}[/]")

    return on_turn, on_result


@app.command()
@cli_errors
@_agent_flags
def run(
    task: Annotated[str, typer.Argument(help="The task, in words.")],
    config: ConfigOpt = None,
    save: Annotated[Path | None, typer.Option(help="Append the trajectory to this JSONL.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the trajectory as JSON.")] = False,
    show_reasoning: Annotated[bool, typer.Option(help="Print the model's reasoning.")] = False,
    *,
    overrides: dict[str, Any],
) -> None:
    """Run one task; print the final answer (and a summary on stderr).

    Example: astra-agent run "What time is it in Tokyo?" --config mcp.json --save runs.jsonl
    """
    cfg, mcp = _configure(save, config, overrides)
    on_turn, on_result = _printers(show_reasoning)
    traj = asyncio.run(run_task(cfg, mcp, task, on_turn=on_turn, on_result=on_result))
    if save:
        append_jsonl(save, traj)
    if as_json:
        sys.stdout.write(json.dumps(traj.model_dump(mode="json"), ensure_ascii=False, indent=2))
        sys.stdout.write("\n")
    else:
        console.print(traj.final_answer or "[dim](no answer)[/]", highlight=False)
    err_console.print(summary_table(traj))
    if traj.termination == "model_error":
        raise typer.Exit(1)


@app.command()
@cli_errors
@config_flags(AgentConfig, ("tool_timeout_s", "strict"), flags={"tool_timeout_s": "tool_timeout"})
def tools(config: ConfigOpt = None, *, overrides: dict[str, Any]) -> None:
    """List the tools of the configured MCP servers and where each comes from.

    Example: astra-agent tools --config mcp.json
    """
    if config is None:
        raise ConfigError("no MCP config given", hint="pass --config mcp.json")
    cfg, mcp = load_agent_config(config, overrides=overrides)

    async def go() -> tuple[list[Any], dict[str, tuple[str, str]]]:
        env = await open_environment(mcp, cfg)
        try:
            return await env.list_tools(), env.routes()
        finally:
            await env.close()

    specs, routes = asyncio.run(go())
    table = Table(title=f"{len(specs)} tools")
    for col in ("tool", "server", "server's name", "description"):
        table.add_column(col, overflow="fold")
    for s in specs:
        table.add_row(
            s.name, s.origin, routes[s.name][1], (s.description or "").split("\n")[0][:80]
        )
    console.print(table)


@app.command()
@cli_errors
@_agent_flags
def chat(
    config: ConfigOpt = None,
    save: Annotated[Path | None, typer.Option(help="Append the conversation on exit.")] = None,
    show_reasoning: Annotated[bool, typer.Option(help="Stream the reasoning too.")] = False,
    *,
    overrides: dict[str, Any],
) -> None:
    """Chat interactively, streaming; tool calls and results shown compactly.

    Commands: /reasoning (toggle), /reset, /exit. Example: astra-agent chat -c mcp.json
    """
    cfg, mcp = _configure(save, config, overrides)
    asyncio.run(chat_loop(cfg, mcp, save, show_reasoning))
