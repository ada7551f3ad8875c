"""The agent as a library: what ``astra-agent run`` does, callable from Python.

Start here to run ASTRA (or any OpenAI-compatible model) against live MCP servers from code::

    import asyncio
    from pathlib import Path
    from astra_agent.agent import load_agent_config, run_task

    cfg, mcp = load_agent_config(Path("mcp.json"), model={"base_url": "http://127.0.0.1:8000/v1"})
    traj = asyncio.run(run_task(cfg, mcp, "What time is it in Tokyo?"))
    print(traj.final_answer)

* :class:`AgentConfig` is the config file: ``mcpServers`` as other MCP clients write it, plus
  optional ``model``, ``limits``, ``system``, ``strict`` and ``toolTimeout``;
  :func:`load_agent_config` reads it with overrides and ``ASTRA_AGENT_*`` variables on top.
* :func:`open_environment` starts the servers as one :class:`~astra_agent.mcp_env.MCPEnvironment`
  (a server that fails is named and left out unless ``strict``).
* :func:`run_task` runs one task through :func:`~astra_agent.episode.run_episode` and returns
  the :class:`~astra_agent.trajectory.Trajectory`.

The ``astra-agent`` CLI (:mod:`astra_agent.cli`) and the interactive chat
(:mod:`astra_agent.chat`) are thin layers over these; nothing here imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.config import deep_merge, load_config, read_mapping, unknown_keys
from astra_agent.episode import EpisodeLimits, ResultHook, TurnHook, run_episode
from astra_agent.mcp_config import MCPConfig, parse_mcp_config
from astra_agent.mcp_env import DEFAULT_TOOL_TIMEOUT_S, MCPEnvironment
from astra_agent.model import ChatModel, ModelConfig
from astra_agent.trajectory import Trajectory

Warn = Callable[[str], None]


class AgentConfig(BaseModel):
    """The agent's config file: `mcpServers` as other MCP clients write it, plus optional
    `model`, `limits`, `system` and `toolTimeout` sections."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    model: ModelConfig = Field(default_factory=ModelConfig)
    limits: EpisodeLimits = Field(default_factory=EpisodeLimits)
    system: str | None = Field(None, description="system prompt")
    strict: bool = Field(False, description="fail if any MCP server fails to start")
    tool_timeout_s: float = Field(
        DEFAULT_TOOL_TIMEOUT_S, gt=0, alias="toolTimeout", description="seconds per tool call"
    )


# Keys that other MCP clients keep beside their servers, in the files users point us at:
# Claude Desktop (claude_desktop_config.json: globalShortcut, preferences, theme, telemetry),
# VS Code (.vscode/mcp.json: servers, inputs), and a JSON schema reference. Read without a
# warning; every other unknown top-level key is named (a typo would otherwise pass silently).
OTHER_CLIENTS_KEYS = frozenset(
    {"$schema", "globalShortcut", "inputs", "preferences", "servers", "telemetry", "theme"}
)


def warn_on_stderr(message: str) -> None:
    """The default ``warn``: one yellow ``warning:`` line on stderr."""
    # Imported here: rich (and typer, via the console) load only when a warning is printed.
    from rich.markup import escape

    from astra_agent.console import err_console

    err_console.print(f"[yellow]warning:[/] {escape(message)}")


def load_agent_config(
    config: Path | None,
    *,
    model: dict[str, Any] | None = None,
    max_steps: int | None = None,
    tool_timeout: float | None = None,
    system: str | None = None,
    strict: bool = False,
    overrides: Mapping[str, Any] | None = None,
    warn: Warn = warn_on_stderr,
) -> tuple[AgentConfig, MCPConfig]:
    """The agent's config and its MCP servers, from ``config`` (JSON/YAML; None: no file),
    then ``ASTRA_AGENT_*`` variables, then the arguments given here (None: not given).

    ``model`` overrides fields of :class:`~astra_agent.model.ModelConfig`; ``overrides`` is
    any part of the config as a mapping (the CLI's flags and ``--set``). Unknown top-level
    keys of the file are passed to ``warn`` by name (other MCP clients' keys are not). Raises
    :class:`~astra_agent.errors.ConfigError` on a file or value that cannot be used.
    """
    raw = read_mapping(config) if config else {}
    if config:
        allowed = OTHER_CLIENTS_KEYS | {"mcpServers"}
        for message in unknown_keys(raw, AgentConfig, allowed=allowed):
            warn(f"{message} in {config}")
    given: dict[str, Any] = {
        "model": model or {},
        "limits": {"max_steps": max_steps} if max_steps is not None else {},
        "system": system,
        "toolTimeout": tool_timeout,
        "strict": strict or None,
    }
    cfg = load_config(
        AgentConfig, config, deep_merge(given, overrides or {}), env_prefix="ASTRA_AGENT_"
    )
    mcp = parse_mcp_config(raw, source=str(config)) if config and raw else MCPConfig()
    # The episode's own guard sits above every server's timeout, so the server's wording wins.
    timeouts = [s.timeout for s in mcp.servers.values() if s.timeout] + [cfg.tool_timeout_s]
    cfg.limits = cfg.limits.model_copy(update={"tool_timeout_s": max(timeouts) + 5})
    return cfg, mcp


def task_messages(cfg: AgentConfig, task: str) -> list[dict[str, Any]]:
    """The opening messages of a task: the configured system prompt (if any), then ``task``."""
    msgs = [{"role": "system", "content": cfg.system}] if cfg.system else []
    return [*msgs, {"role": "user", "content": task}]


async def open_environment(
    mcp: MCPConfig, cfg: AgentConfig, warn: Warn = warn_on_stderr
) -> MCPEnvironment:
    """The configured MCP servers, started; each one that failed to start is passed to
    ``warn`` (with ``strict``, a failure raises instead). Close it when done."""
    env = MCPEnvironment(mcp, tool_timeout_s=cfg.tool_timeout_s, strict=cfg.strict)
    await env.start()
    for name, why in env.failures.items():
        warn(f"MCP server {name!r} is unavailable: {(why.splitlines() or [''])[0]}")
    return env


async def run_task(
    cfg: AgentConfig,
    mcp: MCPConfig,
    task: str,
    *,
    on_turn: TurnHook | None = None,
    on_result: ResultHook | None = None,
    warn: Warn = warn_on_stderr,
) -> Trajectory:
    """One task, end to end: check the endpoint, start the servers, run the episode, close
    both. ``on_turn``/``on_result`` see each model turn and tool result as they happen.

    An endpoint that does not answer at the start raises
    :class:`~astra_agent.model.EndpointError`; one that fails later ends the episode with
    ``termination == "model_error"``.
    """
    model = ChatModel(cfg.model)
    try:
        name = await model.check_model()
        env = await open_environment(mcp, cfg, warn)
        try:
            traj = await run_episode(
                model,
                env,
                task_messages(cfg, task),
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
