"""The ``mcpServers`` config that Claude Desktop, Cursor and other MCP clients use, plus ours.

    {"mcpServers": {
        "time": {"command": "mcp-server-time", "args": [], "env": {"TZ": "${TZ:-UTC}"}},
        "docs": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}
    }}

Our optional per-server keys: ``timeout`` (seconds per call), ``startupTimeout``,
``disabled``, ``allowedTools`` / ``disabledTools``, and for stdio servers ``maxMessageBytes``
(the largest message read from the server, 16 MiB by default: a bigger tool result becomes an
error result). JSON or YAML; ``${VAR}`` and
``${VAR:-default}`` are expanded in command, args, env, cwd, url and headers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from astra_agent.config import read_mapping
from astra_agent.errors import ConfigError
from astra_agent.mcp_stdio import DEFAULT_MAX_MESSAGE_BYTES

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    timeout: float | None = Field(None, gt=0, description="seconds per tool call")
    startup_timeout: float = Field(30.0, gt=0, alias="startupTimeout")
    disabled: bool = False
    allowed_tools: list[str] | None = Field(None, alias="allowedTools")
    disabled_tools: list[str] = Field(default_factory=list, alias="disabledTools")

    def tool_enabled(self, name: str) -> bool:
        if name in self.disabled_tools:
            return False
        return self.allowed_tools is None or name in self.allowed_tools


class StdioServerConfig(_Common):
    command: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    type: Literal["stdio"] | None = None
    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES,
        ge=1024,
        alias="maxMessageBytes",
        description="the largest message read from the server; a bigger result is an error",
    )


class HttpServerConfig(_Common):
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    type: Literal["http", "streamable-http", "streamableHttp", "sse"] | None = None

    @property
    def transport(self) -> str:
        if self.type == "sse" or (self.type is None and self.url.rstrip("/").endswith("/sse")):
            return "sse"
        return "streamable-http"


ServerConfig = StdioServerConfig | HttpServerConfig


class MCPConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    servers: dict[str, ServerConfig] = Field(default_factory=dict, alias="mcpServers")

    @model_validator(mode="before")
    @classmethod
    def _pick_kind(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        raw = data.get("mcpServers", data.get("servers", {}))
        if not isinstance(raw, Mapping):
            raise ValueError("mcpServers must be a mapping of server name → settings")
        servers: dict[str, Any] = {}
        for name, spec in raw.items():
            if not isinstance(spec, Mapping):
                raise ValueError(f"server {name!r}: settings must be a mapping")
            if "command" in spec:
                servers[name] = StdioServerConfig.model_validate(spec)
            elif "url" in spec:
                servers[name] = HttpServerConfig.model_validate(spec)
            else:
                raise ValueError(f"server {name!r}: needs either 'command' (stdio) or 'url'")
        return {"mcpServers": servers}

    def enabled(self) -> dict[str, ServerConfig]:
        return {n: s for n, s in self.servers.items() if not s.disabled}


def expand_vars(text: str, environ: Mapping[str, str], where: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise ConfigError(
            f"{where}: environment variable ${{{name}}} is not set",
            hint=f"export {name}=… or write ${{{name}:-default}}",
        )

    return _VAR.sub(sub, text)


def _expand_server(name: str, spec: dict[str, Any], environ: Mapping[str, str]) -> dict:
    out = dict(spec)
    for key in ("command", "cwd", "url"):
        if isinstance(out.get(key), str):
            out[key] = expand_vars(out[key], environ, f"server {name!r} {key}")
    if isinstance(out.get("args"), list):
        out["args"] = [expand_vars(str(a), environ, f"server {name!r} args") for a in out["args"]]
    for key in ("env", "headers"):
        if isinstance(out.get(key), Mapping):
            out[key] = {
                k: expand_vars(str(v), environ, f"server {name!r} {key}.{k}")
                for k, v in out[key].items()
            }
    return out


def parse_mcp_config(
    data: Mapping[str, Any], environ: Mapping[str, str] | None = None, source: str = "config"
) -> MCPConfig:
    env = os.environ if environ is None else environ
    raw = data.get("mcpServers", data.get("servers"))
    if raw is None:
        raise ConfigError(f"{source} has no 'mcpServers' section")
    if isinstance(raw, Mapping):
        raw = {
            n: _expand_server(n, dict(s), env) if isinstance(s, Mapping) else s
            for n, s in raw.items()
        }
    try:
        return MCPConfig.model_validate({"mcpServers": raw})
    except ValidationError as exc:
        lines = [f"  {'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"invalid MCP config in {source}:\n" + "\n".join(lines)) from exc


def load_mcp_config(path: str | Path, environ: Mapping[str, str] | None = None) -> MCPConfig:
    return parse_mcp_config(read_mapping(path), environ, str(path))
