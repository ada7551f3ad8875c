"""ASTRA agent runtime: model client, episode loop, environments, the ``astra-agent`` CLI."""

from astra_agent.config import load_config, read_mapping
from astra_agent.errors import (
    AstraError,
    CheckpointError,
    ConfigError,
    ModelBehaviorError,
    ServerError,
    ToolError,
)

__all__ = [
    "AstraError",
    "CheckpointError",
    "ConfigError",
    "ModelBehaviorError",
    "ServerError",
    "ToolError",
    "load_config",
    "read_mapping",
]
