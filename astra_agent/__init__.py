"""ASTRA agent runtime: model client, episode loop, environments, the ``astra-agent`` CLI.

Where to start reading (each module's docstring goes on from there):

* :mod:`astra_agent.agent` — the agent as a library: load an ``mcpServers`` config and run a
  task against live MCP servers (:func:`run_task`); what ``astra-agent run`` calls.
* :mod:`astra_agent.episode` — :func:`run_episode`, the one loop every user shares (agent,
  BFCL, arenas, RL rollouts, synthesis): model ↔ environment until no more tool calls or a
  limit.
* :mod:`astra_agent.model` — the :class:`Model` protocol and :class:`ChatModel`, the client of
  an OpenAI-compatible endpoint; the Qwen3 reply contract is in :mod:`astra_agent.reply`.
* :mod:`astra_agent.environment` — the :class:`Environment` protocol, the only thing the loop
  knows about tools. Implementations: :mod:`~astra_agent.function_env` (plain Python
  functions; the one to copy for a new environment), :mod:`~astra_agent.mcp_env` (live MCP
  servers), :mod:`~astra_agent.arena` (sandboxed Python arenas, on :mod:`~astra_agent.sandbox`).
* :mod:`astra_agent.trajectory` — what an episode did, as JSONL usable as SFT data.
* :mod:`astra_agent.cli` and :mod:`astra_agent.chat` — the ``astra-agent`` command, a thin layer
  over :mod:`astra_agent.agent`; :mod:`astra_agent.options` and :mod:`astra_agent.console` are
  what every CLI of the project (``astra-serve``, ``astra-eval``, ``astra-train``) shares.

``eval``, ``training`` and ``serving`` import this package; it imports none of them.
"""

from astra_agent.agent import (
    AgentConfig,
    load_agent_config,
    open_environment,
    run_task,
    task_messages,
)
from astra_agent.config import load_config, read_mapping
from astra_agent.environment import Environment, ResetUnsupportedError, ToolResult, ToolSpec
from astra_agent.episode import CallPolicy, EpisodeLimits, run_episode, truncate_middle
from astra_agent.errors import (
    AstraError,
    CheckpointError,
    ConfigError,
    ModelBehaviorError,
    ServerError,
    ToolError,
)
from astra_agent.function_env import FunctionEnvironment
from astra_agent.mcp_config import MCPConfig, load_mcp_config, parse_mcp_config
from astra_agent.mcp_env import MCPEnvironment
from astra_agent.model import ChatModel, EndpointError, Model, ModelConfig, ModelTurn, ToolCall
from astra_agent.trajectory import (
    CallEvent,
    Termination,
    TokenRecord,
    ToolChange,
    Trajectory,
    append_jsonl,
    read_jsonl,
)

__all__ = [
    "AgentConfig",
    "AstraError",
    "CallEvent",
    "CallPolicy",
    "ChatModel",
    "CheckpointError",
    "ConfigError",
    "EndpointError",
    "Environment",
    "EpisodeLimits",
    "FunctionEnvironment",
    "MCPConfig",
    "MCPEnvironment",
    "Model",
    "ModelBehaviorError",
    "ModelConfig",
    "ModelTurn",
    "ResetUnsupportedError",
    "ServerError",
    "Termination",
    "TokenRecord",
    "ToolCall",
    "ToolChange",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "Trajectory",
    "append_jsonl",
    "load_agent_config",
    "load_config",
    "load_mcp_config",
    "open_environment",
    "parse_mcp_config",
    "read_jsonl",
    "read_mapping",
    "run_episode",
    "run_task",
    "task_messages",
    "truncate_middle",
]
