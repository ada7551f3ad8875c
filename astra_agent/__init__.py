"""ASTRA agent runtime: model client, episode loop, environments, the ``astra-agent`` CLI."""

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
    "load_config",
    "load_mcp_config",
    "parse_mcp_config",
    "read_jsonl",
    "read_mapping",
    "run_episode",
    "truncate_middle",
]
