"""An Environment over live MCP servers (MCP Python SDK ≥ 2.3), stdio and HTTP.

Each server runs its client session in a task of its own (the SDK's context managers must be
entered and left in one task). Faults stay contained: a server that fails to start is reported
by name with its stderr tail (the others still work unless ``strict``); a call that hangs gets
a timeout result and the session stays usable; a server that crashes gives an error result and
is restarted on the next call, a bounded number of times; ``close()`` ends every child.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from astra_agent.environment import OPENAI_TOOL_NAME, Environment, ToolResult, ToolSpec
from astra_agent.errors import ServerError
from astra_agent.mcp_config import HttpServerConfig, MCPConfig, ServerConfig, StdioServerConfig
from astra_agent.mcp_stdio import TOO_LARGE, stdio_transport

log = logging.getLogger(__name__)

DEFAULT_TOOL_TIMEOUT_S = 120.0
MAX_RESTARTS = 3
CLOSE_TIMEOUT_S = 10.0
ABORT_TIMEOUT_S = 5.0  # a failed start's clean-up (the transport kills in < 1 s)
PING_TIMEOUT_S = 5.0
MAX_TOOL_PAGES = 100  # of tools/list: a server whose cursor never ends cannot hang start-up


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _describe(exc: BaseException) -> str:
    leaves = [e for e in _leaves(exc) if not isinstance(e, asyncio.CancelledError)] or [exc]
    return "; ".join(f"{type(e).__name__}: {e}" for e in leaves[:3])


def _resolve_command(command: str) -> str:
    """PATH first, then the bin directory of this Python (a virtualenv's console scripts)."""
    if os.sep in command or shutil.which(command):
        return command
    beside = Path(sys.executable).parent / command
    return str(beside) if beside.exists() else command


def result_text(result: Any) -> tuple[str, Any]:
    """Text for the model from an MCP CallToolResult, and its structured content."""
    from mcp.types import (
        AudioContent,
        EmbeddedResource,
        ImageContent,
        ResourceLink,
        TextContent,
    )

    parts: list[str] = []
    for block in result.content or []:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, ImageContent | AudioContent):
            kind = "image" if isinstance(block, ImageContent) else "audio"
            parts.append(f"[{kind} {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        elif isinstance(block, EmbeddedResource):
            res = block.resource
            text = getattr(res, "text", None)
            parts.append(text if text is not None else f"[resource {res.uri}]")
        elif isinstance(block, ResourceLink):
            parts.append(f"[resource link {block.uri}]")
        else:
            parts.append(f"[{getattr(block, 'type', 'content')} block]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts), structured


async def list_all_tools(client: Any, server: str) -> list[Any]:
    """Every page of the server's ``tools/list`` (at most ``MAX_TOOL_PAGES``). A page that the
    SDK rejects as a whole (one tool with an invalid schema or name) is read again raw and
    checked tool by tool: the invalid tools are skipped with a warning, the others kept."""
    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        try:
            page = await client.list_tools(cursor=cursor)
            got, cursor = list(page.tools), page.next_cursor
        except ValidationError:
            got, cursor = await _raw_tool_page(client, cursor, server)
        tools += got
        if not cursor:
            return tools
    log.warning("MCP server %r: tools past page %d not read", server, MAX_TOOL_PAGES)
    return tools


async def _raw_tool_page(client: Any, cursor: str | None, server: str) -> tuple[list[Any], Any]:
    from mcp.types import ListToolsResult, Tool

    session = client.session
    params = {"cursor": cursor} if cursor else None
    raw = await session._dispatcher.send_raw_request("tools/list", params, {})
    kept: list[Any] = []
    for i, item in enumerate(raw.get("tools") or [] if isinstance(raw, dict) else []):
        if isinstance(item, dict) and isinstance(item.get("inputSchema"), dict):
            item = {**item, "inputSchema": {"type": "object", **item["inputSchema"]}}
        try:
            kept.append(Tool.model_validate(item))
        except ValidationError as exc:
            name = item.get("name") if isinstance(item, dict) else None
            why = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:2])
            log.warning("MCP server %r: skipping tool %s (%r): %s", server, i, name, why)
    # The SDK checks call results against the tools it has seen listed: show it these.
    absorb = getattr(session, "_absorb_tool_listing", None)
    if absorb is not None:
        absorb(ListToolsResult(tools=kept), complete=False)
    next_cursor = raw.get("nextCursor") if isinstance(raw, dict) else None
    return kept, next_cursor if isinstance(next_cursor, str) else None


def invalid_result(exc: ValidationError) -> str:
    """What is wrong with a tool result the SDK rejected, in words (not pydantic's dump)."""
    err = exc.errors()[0]
    loc, value = err["loc"], err.get("input")
    if len(loc) >= 2 and loc[0] == "content" and isinstance(loc[1], int):
        kind = value.get("type") if isinstance(value, dict) else None
        if kind is not None and err["type"] in ("missing", "literal_error", "union_tag_invalid"):
            return f"content item {loc[1]} has the unknown type {str(kind)[:40]!r}"
        return f"content item {loc[1]}: {err['msg']}"
    return f"{'.'.join(map(str, loc)) or 'the result'}: {err['msg']}"


@dataclass(frozen=True)
class _Route:
    server: str
    tool: str


def assign_names(tools: dict[str, list[Any]]) -> dict[str, _Route]:
    """Public names: the tool's own where valid for OpenAI and unique, else made so."""
    seen: dict[str, int] = {}
    for server_tools in tools.values():
        for t in server_tools:
            seen[t.name] = seen.get(t.name, 0) + 1
    out: dict[str, _Route] = {}
    for server, server_tools in tools.items():
        for t in server_tools:
            name = t.name
            if seen[name] > 1 or not OPENAI_TOOL_NAME.match(name):
                base = f"{server}__{name}" if seen[name] > 1 else name
                name = re.sub(r"[^a-zA-Z0-9_-]", "_", base) or "tool"
            if len(name) > 64 or name in out:
                digest = hashlib.sha1(f"{server}/{t.name}".encode()).hexdigest()[:8]
                name = f"{name[:55]}_{digest}"
            out[name] = _Route(server, t.name)
    return out


class _Server:
    """One MCP server: a client session living in its own task, restartable."""

    def __init__(self, name: str, cfg: ServerConfig, default_timeout: float, logdir: Path) -> None:
        self.name = name
        self.cfg = cfg
        self.timeout = cfg.timeout or default_timeout
        self.stderr_path = logdir / f"{re.sub(r'[^a-zA-Z0-9_.-]', '_', name)}.stderr.log"
        self.tools: list[Any] = []
        self.restarts = 0
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._dead = False  # the connection broke: restart before the next call
        self._wire: dict[str, bool] = {}  # the stdio transport's state ("eof")
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def alive(self) -> bool:
        return (
            not self._dead
            and self._task is not None
            and not self._task.done()
            and self._client is not None
        )

    def stderr_tail(self, lines: int = 15) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace").strip()
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _transport(self, errlog: Any) -> Any:
        cfg = self.cfg
        if isinstance(cfg, StdioServerConfig):
            self._wire = {}
            return stdio_transport(
                [_resolve_command(cfg.command), *cfg.args],
                env=cfg.env or None,
                cwd=cfg.cwd,
                errlog=errlog,
                max_bytes=cfg.max_message_bytes,
                state=self._wire,
            )
        assert isinstance(cfg, HttpServerConfig)
        if cfg.transport == "sse":
            from mcp.client.sse import sse_client

            return sse_client(cfg.url, headers=cfg.headers or None)
        return _http_transport(cfg)

    async def _run(self, ready: asyncio.Future[None]) -> None:
        from mcp import Client

        with self.stderr_path.open("a") as errlog:
            try:
                async with Client(self._transport(errlog), mode="legacy") as client:
                    listed = await list_all_tools(client, self.name)
                    self.tools = [t for t in listed if self.cfg.tool_enabled(t.name)]
                    self._client = client
                    ready.set_result(None)
                    await self._stop.wait()
            except asyncio.CancelledError:
                if not ready.done():
                    ready.cancel()
                raise
            except Exception as exc:
                if not ready.done():
                    ready.set_exception(exc)
                else:
                    log.warning("MCP server %r stopped: %s", self.name, _describe(exc))
            finally:
                self._client = None

    async def start(self) -> None:
        self._stop = asyncio.Event()
        self._dead = False
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(ready), name=f"mcp:{self.name}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.cfg.startup_timeout)
        except TimeoutError:
            await self._abort()
            why = f"did not start within {self.cfg.startup_timeout:g} s"
            raise ServerError(self._failure(why)) from None
        except (Exception, asyncio.CancelledError) as exc:
            await self._abort()
            if isinstance(exc, asyncio.CancelledError) and not ready.cancelled():
                raise
            raise ServerError(self._failure(_describe(exc))) from None

    def _failure(self, why: str) -> str:
        tail = self.stderr_tail()
        return f"MCP server {self.name!r} failed to start: {why}" + (
            "\n  its stderr:\n    " + tail.replace("\n", "\n    ") if tail else ""
        )

    async def _ensure(self) -> None:
        async with self._lock:
            if self.alive:
                return
            if self.restarts >= MAX_RESTARTS:
                raise ServerError(
                    f"MCP server {self.name!r} crashed {self.restarts} times; "
                    "not restarting it again"
                )
            self.restarts += 1
            log.warning("restarting MCP server %r (restart %d)", self.name, self.restarts)
            await self.close()
            await self.start()

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        from mcp import MCPError

        try:
            await self._ensure()
        except ServerError as exc:
            return ToolResult(f"Error: {exc}", is_error=True)
        client = self._client
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout + 5):  # a guard above the SDK's own
                result = await client.call_tool(tool, arguments, read_timeout_seconds=self.timeout)
        except TimeoutError:
            return self._timed_out(tool)
        except MCPError as exc:
            return await self._rpc_error(tool, exc, time.monotonic() - t0)
        except ValidationError as exc:  # a result that is not MCP: say what, in one line
            return ToolResult(
                f"Error: the MCP server '{self.name}' returned a result for '{tool}' that is "
                f"not valid MCP ({invalid_result(exc)})",
                is_error=True,
            )
        except Exception as exc:  # transport failures
            if not self.alive:
                return self._crashed(tool)
            return ToolResult(f"Error: {_describe(exc)}", is_error=True)
        text, structured = result_text(result)
        return ToolResult(text, is_error=bool(result.is_error), structured=structured)

    def _timed_out(self, tool: str) -> ToolResult:
        return ToolResult(
            f"Error: tool '{tool}' timed out after {self.timeout:g} s.", is_error=True
        )

    async def _rpc_error(self, tool: str, exc: Any, elapsed: float) -> ToolResult:
        """An MCPError: the SDK's own (a timeout, a closed connection) or the server's reply.

        The codes overlap (a server may answer -32000 or -32001 itself), so the SDK's are told
        apart by what happened: the time elapsed, and whether the connection still answers.
        """
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        if exc.code == REQUEST_TIMEOUT and elapsed >= self.timeout * 0.9:
            return self._timed_out(tool)
        if exc.code == CONNECTION_CLOSED and not await self._responsive():
            return self._crashed(tool)
        if isinstance(exc.data, dict) and exc.data.get("reason") == TOO_LARGE:
            return ToolResult(f"Error: tool '{tool}': {exc.message}", is_error=True)
        return ToolResult(
            f"Error: the MCP server '{self.name}' answered the call of '{tool}' with JSON-RPC "
            f"error {exc.code}: {exc.message}",
            is_error=True,
        )

    async def _responsive(self) -> bool:
        client = self._client
        if self._wire.get("eof") or client is None or not self.alive:
            return False
        try:
            async with asyncio.timeout(min(PING_TIMEOUT_S, self.timeout)):
                with warnings.catch_warnings():  # ping is "legacy" in 2.x; so is our mode
                    warnings.simplefilter("ignore", UserWarning)
                    await client.send_ping()
        except Exception:
            return False
        return True

    def _crashed(self, tool: str) -> ToolResult:
        self._dead = True
        self._stop.set()
        tail = self.stderr_tail(5)
        msg = f"Error: the MCP server '{self.name}' crashed while running '{tool}'"
        msg += f" (stderr: {tail})" if tail else ""
        return ToolResult(msg + ". It will be restarted on the next call.", is_error=True)

    async def _abort(self) -> None:
        """End a start that failed: cancel its task now (no clean close to wait for)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=ABORT_TIMEOUT_S)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), CLOSE_TIMEOUT_S)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        except BaseException:  # the task's own failure was reported already
            pass


@contextlib.asynccontextmanager
async def _http_transport(cfg: HttpServerConfig) -> AsyncIterator[Any]:
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with (
        create_mcp_http_client(headers=cfg.headers or None) as http,
        streamable_http_client(cfg.url, http_client=http) as streams,
    ):
        yield streams


class MCPEnvironment(Environment):
    """Tools of several MCP servers, connected concurrently, names made unique and valid.

    ``reset()`` raises :class:`ResetUnsupportedError` (the servers' state is outside us)."""

    def __init__(
        self,
        config: MCPConfig,
        *,
        tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
        strict: bool = False,
    ) -> None:
        self.config = config
        self.strict = strict
        self._logdir = Path(tempfile.mkdtemp(prefix="astra-mcp-"))
        self._servers = {
            name: _Server(name, cfg, tool_timeout_s, self._logdir)
            for name, cfg in config.enabled().items()
        }
        self.failures: dict[str, str] = {}
        self._routes: dict[str, _Route] = {}
        self._specs: list[ToolSpec] = []
        self._started = False

    @property
    def max_timeout_s(self) -> float:
        return max((s.timeout for s in self._servers.values()), default=DEFAULT_TOOL_TIMEOUT_S)

    async def start(self) -> MCPEnvironment:
        """Connect every enabled server concurrently; report (or, if strict, raise) failures."""
        t0 = time.monotonic()
        names = list(self._servers)
        results = await asyncio.gather(
            *(self._servers[n].start() for n in names), return_exceptions=True
        )
        for name, res in zip(names, results, strict=True):
            if isinstance(res, BaseException):
                self.failures[name] = str(res)
                log.error("%s", res)
        live = {n: s for n, s in self._servers.items() if n not in self.failures}
        if self.failures and (self.strict or not live):
            await self.close()
            why = "\n".join(self.failures.values())
            raise ServerError(why if not live and not self.strict else f"strict mode: {why}")
        self._routes = assign_names({n: s.tools for n, s in live.items()})
        by_route = {(n, t.name): t for n, s in live.items() for t in s.tools}
        self._specs = [
            self._spec(public, by_route[(r.server, r.tool)], r.server)
            for public, r in self._routes.items()
        ]
        self._started = True
        log.info(
            "connected %d MCP server(s), %d tools in %.1f s",
            len(live),
            len(self._specs),
            time.monotonic() - t0,
        )
        return self

    @staticmethod
    def _spec(public: str, tool: Any, server: str) -> ToolSpec:
        params = dict(tool.input_schema or {})
        params.setdefault("type", "object")
        if params["type"] == "object":
            params.setdefault("properties", {})
        return ToolSpec(public, tool.description or "", params, origin=server)

    def routes(self) -> dict[str, tuple[str, str]]:
        """Public tool name → (server, the tool's own name)."""
        return {k: (v.server, v.tool) for k, v in self._routes.items()}

    async def list_tools(self) -> list[ToolSpec]:
        if not self._started:
            await self.start()
        return list(self._specs)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        route = self._routes.get(name)
        if route is None:
            return ToolResult(f"Error: unknown tool '{name}'", is_error=True)
        return await self._servers[route.server].call(route.tool, arguments)

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self._servers.values()), return_exceptions=True)
        shutil.rmtree(self._logdir, ignore_errors=True)

    async def __aenter__(self) -> MCPEnvironment:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
