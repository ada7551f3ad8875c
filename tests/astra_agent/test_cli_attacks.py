"""Attacks a new user or a hostile server would make on the agent's boundaries: an endpoint
that answers HTTP 200 with garbage or with a malformed chat completion, one that trickles a
reply forever, a base URL that is not one, YAML alias bombs, bad values from the environment,
an MCP server whose listing holds one invalid tool, pages tools, or returns content of an
unknown type."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from astra_agent.config import load_config, read_mapping
from astra_agent.errors import ConfigError, ServerError
from astra_agent.mcp_config import parse_mcp_config
from astra_agent.mcp_env import MCPEnvironment
from astra_agent.model import ChatModel, EndpointError, ModelConfig
from tests.conftest import send_json


def _completion(message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [choice], **extra}  # fmt: skip


def _calls(**function: Any) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


# What the hostile endpoint answers to a chat request (HTTP 200 each), by mode.
REPLIES: dict[str, Any] = {
    "garbage": b"{not json",
    "text": b"hello",
    "no_choices": {"id": "x", "object": "chat.completion"},
    "empty_choices": {"id": "x", "choices": []},
    "no_message": {"id": "x", "choices": [{"index": 0, "finish_reason": "stop"}]},
    "array": [1, 2, 3],
    "tool_calls_object": _completion({"role": "assistant", "tool_calls": {"a": 1}}),
    "content_object": _completion({"role": "assistant", "content": {"a": 1}}),
}
MODELS: dict[str, Any] = {
    "models_html": b"<html>hi</html>",
    "models_no_data": {"object": "list"},
    "models_no_id": {"object": "list", "data": [{"object": "model"}]},
}


class _Hostile(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = ""
    chat: Any = None

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, data: Any) -> None:
        send_json(self, 200, data if isinstance(data, bytes) else json.dumps(data).encode())

    def do_GET(self) -> None:
        self._send(MODELS.get(self.server.mode, {"object": "list", "data": [{"id": "m"}]}))  # type: ignore[attr-defined]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "trickle":  # a chunk every 50 ms, never the end of the body
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                return
        self._send(self.server.chat or REPLIES[mode])  # type: ignore[attr-defined]


@pytest.fixture
def hostile(request: pytest.FixtureRequest) -> Iterator[ThreadingHTTPServer]:
    """The hostile endpoint, in the mode a test parametrizes it with (``indirect``) or none."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    httpd.daemon_threads = True
    httpd.mode = getattr(request, "param", "")  # type: ignore[attr-defined]
    httpd.chat = None  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _model(httpd: ThreadingHTTPServer, **cfg: Any) -> ChatModel:
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    return ChatModel(ModelConfig(base_url=url, max_retries=0, **cfg))


@pytest.mark.integration
@pytest.mark.parametrize("hostile", sorted(REPLIES), indirect=True)
async def test_a_malformed_chat_completion_is_a_server_error(hostile: ThreadingHTTPServer) -> None:
    async with _model(hostile) as model:
        with pytest.raises(ServerError, match=r"not a valid response|malformed chat completion"):
            await model.complete([{"role": "user", "content": "hi"}])


@pytest.mark.integration
@pytest.mark.parametrize("hostile", sorted(MODELS), indirect=True)
async def test_a_malformed_model_list_is_a_server_error(hostile: ThreadingHTTPServer) -> None:
    model = _model(hostile)
    with pytest.raises(ServerError, match=r"model list|not a valid response"):
        await model.check_model()
    await model.close()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("function", "name", "arguments"),
    [
        ({"name": "f", "arguments": {"a": 1}}, "f", '{"a": 1}'),  # an object, not a string
        ({"name": "f", "arguments": 5}, "f", "5"),
        ({"name": None, "arguments": "{}"}, "", "{}"),
        ({"name": 7, "arguments": "{}"}, "7", "{}"),
    ],
)
async def test_tool_calls_of_the_wrong_types_become_text(
    hostile: ThreadingHTTPServer, function: dict[str, Any], name: str, arguments: str
) -> None:
    hostile.chat = _completion(_calls(**function), usage={"prompt_tokens": "many"})  # type: ignore[attr-defined]
    async with _model(hostile) as model:
        turn = await model.complete([{"role": "user", "content": "hi"}])
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [(name, arguments)]
    assert turn.prompt_tokens == 0


@pytest.mark.integration
async def test_a_reply_that_trickles_forever_times_out(hostile: ThreadingHTTPServer) -> None:
    hostile.mode = "trickle"  # type: ignore[attr-defined]
    async with _model(hostile, request_timeout_s=1.0) as model:
        t0 = time.monotonic()
        with pytest.raises(EndpointError) as err:
            async with asyncio.timeout(30):  # bound the test itself, whatever the client does
                await model.complete([{"role": "user", "content": "hi"}])
    assert err.value.kind == "timeout" and time.monotonic() - t0 < 10


@pytest.mark.parametrize(
    "url", ["not-a-url", "ftp://host/v1", "http://", "http://host:99999/v1", "127.0.0.1:8000"]
)
def test_a_base_url_that_is_not_one_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="is not an http"):
        load_config(ModelConfig, None, {"base_url": url}, environ={})


def test_a_bad_value_from_the_environment_names_its_variable() -> None:
    env = {"ASTRA_TEMPERATURE": "abc"}
    with pytest.raises(ConfigError, match=r"temperature: .*\(from \$ASTRA_TEMPERATURE\)"):
        load_config(ModelConfig, None, environ=env)


def _bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nmcpServers:\n  h:\n    command: python\n    args: *a{levels}\n"


@pytest.mark.parametrize(
    ("text", "why"),
    [(_bomb(), "expands to more than"), ("mcpServers: &a\n  h: *a\n", "contains it")],
)
def test_yaml_alias_bombs_and_cycles_are_refused_at_once(
    tmp_path: Path, text: str, why: str
) -> None:
    path = tmp_path / "mcp.yaml"
    path.write_text(text)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=why):
        read_mapping(path)
    assert time.monotonic() - t0 < 5


def test_yaml_anchors_within_bounds_still_load(tmp_path: Path) -> None:
    path = tmp_path / "mcp.yaml"
    path.write_text("env: &e {A: '1'}\nmcpServers:\n  h: {command: x, env: *e}\n")
    assert read_mapping(path)["mcpServers"]["h"]["env"] == {"A": "1"}


# ------------------------------------------------------------------ hostile MCP servers

MCP_SERVER = textwrap.dedent("""
    import json, sys
    MODE = sys.argv[1]
    def tool(name, schema):
        return {"name": name, "description": name, "inputSchema": schema}
    PAGES = {
        "bad-tools": [[tool("ok", {"type": "object"}), tool("s_true", True),
                       tool("s_ref", {"$ref": "#"}), {"name": 42, "inputSchema": {}},
                       {"name": "no_schema"}]],
        "pages": [[tool(f"p{p}_{i}", {"type": "object"}) for i in range(3)] for p in range(3)],
        "unknown-content": [[tool("echo", {"type": "object"})]],
    }[MODE]
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        msg = json.loads(line)
        rid, method = msg.get("id"), msg.get("method")
        if rid is None:
            continue
        if method == "initialize":
            body = {"protocolVersion": msg["params"]["protocolVersion"],
                    "capabilities": {"tools": {}}, "serverInfo": {"name": "h", "version": "0"}}
        elif method == "tools/list":
            page = int((msg.get("params") or {}).get("cursor") or 0)
            body = {"tools": PAGES[page]}
            if page + 1 < len(PAGES):
                body["nextCursor"] = str(page + 1)
        elif method == "tools/call":
            items = [{"type": "text", "text": "kept"}, {"type": "hologram", "x": 1}]
            body = {"content": items if MODE == "unknown-content" else items[:1]}
        else:
            body = {}
        out.write(json.dumps({"jsonrpc": "2.0", "id": rid, "result": body}).encode() + b"\\n")
        out.flush()
""")


def _mcp(tmp_path: Path, mode: str) -> MCPEnvironment:
    script = tmp_path / "server.py"
    script.write_text(MCP_SERVER)
    server = {"command": sys.executable, "args": [str(script), mode]}
    return MCPEnvironment(parse_mcp_config({"mcpServers": {"h": server}}), strict=True)


@pytest.mark.integration
async def test_one_invalid_tool_does_not_lose_the_servers_other_tools(tmp_path: Path) -> None:
    async with _mcp(tmp_path, "bad-tools") as env:
        names = sorted(t.name for t in await env.list_tools())
        result = await env.call_tool("s_ref", {})
    assert names == ["ok", "s_ref"]  # `true`, a number as name, no schema: skipped
    assert not result.is_error and result.text == "kept"


@pytest.mark.integration
async def test_every_page_of_tools_is_listed(tmp_path: Path) -> None:
    async with _mcp(tmp_path, "pages") as env:
        names = {t.name for t in await env.list_tools()}
    assert names == {f"p{p}_{i}" for p in range(3) for i in range(3)}


@pytest.mark.integration
async def test_content_of_an_unknown_type_is_a_readable_error(tmp_path: Path) -> None:
    async with _mcp(tmp_path, "unknown-content") as env:
        result = await env.call_tool("echo", {})
        again = await env.call_tool("echo", {})  # the session stays usable
    assert result.is_error and "content item 1 has the unknown type 'hologram'" in result.text
    assert "\n" not in result.text and again.is_error


@pytest.mark.integration
def test_the_cli_reports_a_garbage_endpoint_in_one_line(
    hostile: ThreadingHTTPServer, tmp_path: Path
) -> None:
    hostile.mode = "garbage"  # type: ignore[attr-defined]
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {}}))
    url = f"http://127.0.0.1:{hostile.server_address[1]}/v1"
    run = subprocess.run(
        [sys.executable, "-m", "astra_agent", "run", "hi", "-c", str(config), "-u", url],
        capture_output=True, text=True, timeout=120,
        env={"ASTRA_AGENT_MODEL__MAX_RETRIES": "0", "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )  # fmt: skip
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.returncode == 1 and "not a valid response" in run.stdout + run.stderr
