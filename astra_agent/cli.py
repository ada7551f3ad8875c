"""``astra-agent``: run ASTRA (or any OpenAI-compatible model) against live MCP servers."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ConfigDict, Field
from rich.markup import escape
from rich.table import Table

from astra_agent.config import check_writable, load_config, read_mapping, unknown_keys
from astra_agent.console import cli_errors, console, err_console
from astra_agent.episode import EpisodeLimits, run_episode
from astra_agent.errors import ConfigError
from astra_agent.mcp_config import MCPConfig, parse_mcp_config
from astra_agent.mcp_env import DEFAULT_TOOL_TIMEOUT_S, MCPEnvironment
from astra_agent.model import ChatModel, ModelConfig
from astra_agent.options import (
    ApiKeyOpt,
    BaseUrlOpt,
    ModelOpt,
    TemperatureOpt,
    common_callback,
    model_overrides,
)
from astra_agent.trajectory import Trajectory, append_jsonl

app = typer.Typer(
    name="astra-agent",
    help="Run ASTRA against live MCP servers (your `mcpServers` config).\n\n"
    'Example: astra-agent run "What time is it in Tokyo?" --config mcp.json',
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


class AgentConfig(BaseModel):
    """The agent's config file: `mcpServers` as other MCP clients write it, plus optional
    `model`, `limits`, `system` and `toolTimeout` sections."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    model: ModelConfig = Field(default_factory=ModelConfig)
    limits: EpisodeLimits = Field(default_factory=EpisodeLimits)
    system: str | None = None
    strict: bool = False
    tool_timeout_s: float = Field(DEFAULT_TOOL_TIMEOUT_S, gt=0, alias="toolTimeout")


# Keys that other MCP clients keep beside their servers, in the files users point us at:
# Claude Desktop (claude_desktop_config.json: globalShortcut, preferences, theme, telemetry),
# VS Code (.vscode/mcp.json: servers, inputs), and a JSON schema reference. Read without a
# warning; every other unknown top-level key is named (a typo would otherwise pass silently).
OTHER_CLIENTS_KEYS = frozenset(
    {"$schema", "globalShortcut", "inputs", "preferences", "servers", "telemetry", "theme"}
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
StepsOpt = Annotated[int | None, typer.Option(help="Model calls per task (default 20).")]
TimeoutOpt = Annotated[float | None, typer.Option(help="Seconds per tool call (default 120).")]
SystemOpt = Annotated[str | None, typer.Option(help="System prompt.")]
StrictOpt = Annotated[bool, typer.Option(help="Fail if any MCP server fails to start.")]

common_callback(app, "astra-agent")


def _warn_unknown_keys(raw: dict[str, Any], source: Path) -> None:
    allowed = OTHER_CLIENTS_KEYS | {"mcpServers"}
    for message in unknown_keys(raw, AgentConfig, allowed=allowed):
        err_console.print(f"[yellow]warning:[/] {escape(message)} in {escape(str(source))}")


def _load(
    config: Path | None,
    model_flags: dict[str, Any],
    max_steps: int | None,
    tool_timeout: float | None,
    system: str | None,
    strict: bool,
) -> tuple[AgentConfig, MCPConfig]:
    raw = read_mapping(config) if config else {}
    if config:
        _warn_unknown_keys(raw, config)
    overrides: dict[str, Any] = {
        "model": model_flags,
        "limits": {"max_steps": max_steps} if max_steps is not None else {},
        "system": system,
        "toolTimeout": tool_timeout,
        "strict": strict or None,
    }
    cfg = load_config(AgentConfig, config, overrides, env_prefix="ASTRA_AGENT_")
    mcp = parse_mcp_config(raw, source=str(config)) if config and raw else MCPConfig()
    # The episode's own guard sits above every server's timeout, so the server's wording wins.
    timeouts = [s.timeout for s in mcp.servers.values() if s.timeout] + [cfg.tool_timeout_s]
    cfg.limits = cfg.limits.model_copy(update={"tool_timeout_s": max(timeouts) + 5})
    return cfg, mcp


def _messages(cfg: AgentConfig, task: str) -> list[dict[str, Any]]:
    msgs = [{"role": "system", "content": cfg.system}] if cfg.system else []
    return [*msgs, {"role": "user", "content": task}]


def summary_table(traj: Trajectory) -> Table:
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_row(
        "termination",
        traj.termination + (f" ({traj.termination_detail})" if traj.termination_detail else ""),
    )
    t.add_row("steps", str(traj.steps))
    counts = traj.counts()
    calls = ", ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none"
    t.add_row("tool calls", f"{len(traj.events)} ({calls})")
    t.add_row(
        "tokens", f"{traj.usage.prompt_tokens} prompt + {traj.usage.completion_tokens} completion"
    )
    t.add_row(
        "time",
        f"{traj.timings.total_s:.2f} s (model {traj.timings.model_s:.2f} s, tools "
        f"{traj.timings.tools_s:.2f} s)",
    )
    return t


async def _open_env(mcp: MCPConfig, cfg: AgentConfig) -> MCPEnvironment:
    env = MCPEnvironment(mcp, tool_timeout_s=cfg.tool_timeout_s, strict=cfg.strict)
    await env.start()
    for name, why in env.failures.items():
        err_console.print(
            f"[yellow]warning:[/] MCP server {name!r} is unavailable: {escape(why.splitlines()[0])}"
        )
    return env


async def _run(cfg: AgentConfig, mcp: MCPConfig, task: str, show_reasoning: bool) -> Trajectory:
    model = ChatModel(cfg.model)
    try:
        name = await model.check_model()
        env = await _open_env(mcp, cfg)
        try:

            def on_turn(turn: Any) -> None:
                if show_reasoning and turn.reasoning:
                    err_console.print(f"[dim]{escape(turn.reasoning)}[/]")
                for c in turn.tool_calls:
                    err_console.print(f"[cyan]→ {escape(c.name)}[/]({escape(c.arguments[:200])})")

            def on_result(call: Any, result: Any) -> None:
                style = "red" if result.is_error else "green"
                err_console.print(f"[{style}]← {escape(result.text[:200])}[/]")

            traj = await run_episode(
                model,
                env,
                _messages(cfg, task),
                limits=cfg.limits,
                on_turn=on_turn,
                on_result=on_result,
            )
            traj.model = name
            return traj
        finally:
            await env.close()
    finally:
        await model.close()


@app.command()
@cli_errors
def run(
    task: Annotated[str, typer.Argument(help="The task, in words.")],
    config: ConfigOpt = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    temperature: TemperatureOpt = None,
    max_steps: StepsOpt = None,
    tool_timeout: TimeoutOpt = None,
    system: SystemOpt = None,
    strict: StrictOpt = False,
    save: Annotated[Path | None, typer.Option(help="Append the trajectory to this JSONL.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the trajectory as JSON.")] = False,
    show_reasoning: Annotated[bool, typer.Option(help="Print the model's reasoning.")] = False,
) -> None:
    """Run one task; print the final answer (and a summary on stderr).

    Example: astra-agent run "What time is it in Tokyo?" --config mcp.json --save runs.jsonl
    """
    if save:
        check_writable(save, "--save")  # now, not after the episode: its trajectory would be lost
    flags = model_overrides(base_url, model, api_key, temperature)
    cfg, mcp = _load(config, flags, max_steps, tool_timeout, system, strict)
    traj = asyncio.run(_run(cfg, mcp, task, show_reasoning))
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
def tools(
    config: ConfigOpt = None,
    tool_timeout: TimeoutOpt = None,
    strict: StrictOpt = False,
) -> None:
    """List the tools of the configured MCP servers and where each comes from.

    Example: astra-agent tools --config mcp.json
    """
    if config is None:
        raise ConfigError("no MCP config given", hint="pass --config mcp.json")
    cfg, mcp = _load(config, {}, None, tool_timeout, None, strict)

    async def go() -> tuple[list[Any], dict[str, tuple[str, str]]]:
        env = await _open_env(mcp, cfg)
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
def chat(
    config: ConfigOpt = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    temperature: TemperatureOpt = None,
    max_steps: StepsOpt = None,
    tool_timeout: TimeoutOpt = None,
    system: SystemOpt = None,
    strict: StrictOpt = False,
    save: Annotated[Path | None, typer.Option(help="Append the conversation on exit.")] = None,
    show_reasoning: Annotated[bool, typer.Option(help="Stream the reasoning too.")] = False,
) -> None:
    """Chat interactively, streaming; tool calls and results shown compactly.

    Commands: /reasoning (toggle), /reset, /exit. Example: astra-agent chat -c mcp.json
    """
    from astra_agent.chat import chat_loop

    if save:
        check_writable(save, "--save")
    flags = model_overrides(base_url, model, api_key, temperature)
    cfg, mcp = _load(config, flags, max_steps, tool_timeout, system, strict)
    asyncio.run(chat_loop(cfg, mcp, save, show_reasoning, _open_env))
