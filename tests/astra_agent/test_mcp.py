"""The MCP environment against real MCP servers started offline, and the fault fixture."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from astra_agent.errors import ConfigError, ServerError
from astra_agent.mcp_config import load_mcp_config, parse_mcp_config
from astra_agent.mcp_env import MCPEnvironment, assign_names
from astra_agent.procs import descendants
from tests.conftest import from_a_terminal, signal_state

REPO = Path(__file__).resolve().parents[2]
NODE_BIN = REPO / ".mcp-servers" / "node_modules" / ".bin"
FIXTURE = [sys.executable, "-m", "astra_agent.testing.mcp_fixture"]


def node_server(name: str) -> str:
    path = NODE_BIN / name
    assert path.exists(), f"{path} missing: run `make setup-mcp`"
    return str(path)


def fixture(**extra: Any) -> dict[str, Any]:
    return {"command": FIXTURE[0], "args": FIXTURE[1:], **extra}


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _ours(pid: int) -> bool:
    """Whether ``pid`` descends from this test process (other runs on the machine don't count)."""
    me = os.getpid()
    for _ in range(64):
        pid = _parent(pid)
        if pid in (0, 1):
            return False
        if pid == me:
            return True
    return False


def fixture_pids() -> set[int]:
    """Our fixture servers still alive (zombies and other processes' servers left out)."""
    pids = set()
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"astra_agent.testing.mcp_fixture" not in cmd.read_bytes():
                continue
            state = (cmd.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        pid = int(cmd.parent.name)
        if state != "Z" and _ours(pid):
            pids.add(pid)
    return pids


async def no_fixture_left(before: set[int], within_s: float = 5.0) -> set[int]:
    """Wait (bounded) until no fixture server started since ``before`` is alive; the rest."""
    deadline = time.monotonic() + within_s
    while (left := fixture_pids() - before) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return left


@pytest.fixture
async def env() -> AsyncIterator[MCPEnvironment]:
    cfg = parse_mcp_config({"mcpServers": {"fx": fixture(timeout=1.5)}})
    async with MCPEnvironment(cfg) as e:
        yield e


# --------------------------------------------------------------------------- config


def test_config_claude_desktop_format_and_vars(tmp_path: Path) -> None:
    f = tmp_path / "mcp.json"
    f.write_text(json.dumps({"mcpServers": {
        "a": {"command": "x", "args": ["--tz", "${TZX:-UTC}"], "env": {"K": "${SECRET}"}},
        "b": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer ${SECRET}"},
              "timeout": 300, "allowedTools": ["t1"], "disabled": True},
        "c": {"url": "http://h/sse"},
    }}))  # fmt: skip
    cfg = load_mcp_config(f, environ={"SECRET": "s3"})
    a, b, c = cfg.servers["a"], cfg.servers["b"], cfg.servers["c"]
    assert a.args == ["--tz", "UTC"] and a.env == {"K": "s3"}
    assert b.headers == {"Authorization": "Bearer s3"} and b.timeout == 300
    assert b.tool_enabled("t1") and not b.tool_enabled("t2")
    assert list(cfg.enabled()) == ["a", "c"]
    assert b.transport == "streamable-http" and c.transport == "sse"


def test_config_yaml(tmp_path: Path) -> None:
    f = tmp_path / "mcp.yaml"
    f.write_text("mcpServers:\n  t:\n    command: mcp-server-time\n    disabledTools: [x]\n")
    cfg = load_mcp_config(f, environ={})
    assert not cfg.servers["t"].tool_enabled("x")


@pytest.mark.parametrize(
    "data,needle",
    [
        (
            {"mcpServers": {"a": {"command": "x", "env": {"K": "${NOPE}"}}}},
            r"\$\{NOPE\} is not set",
        ),
        ({"mcpServers": {"a": {"args": []}}}, "needs either 'command'"),
        ({"mcpServers": {"a": {"command": "x", "timeout": -1}}}, "timeout"),
        ({"servers2": {}}, "no 'mcpServers'"),
        ({"mcpServers": {"a": {"command": "x", "bogus": 1}}}, "bogus"),
    ],
)
def test_config_errors(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_mcp_config(data, environ={})


class _T:
    def __init__(self, name: str) -> None:
        self.name = name


def test_names_unique_and_valid_only_where_needed() -> None:
    routes = assign_names({
        "s1": [_T("echo"), _T("only_here"), _T("has.dot"), _T("x" * 70)],
        "s2": [_T("echo"), _T("has space")],
    })  # fmt: skip
    names = set(routes)
    assert "only_here" in names  # untouched where valid and unique
    assert {"s1__echo", "s2__echo", "has_dot", "has_space"} <= names
    long = next(n for n in names if n.startswith("xxx"))
    assert len(long) <= 64
    assert routes["s2__echo"].server == "s2" and routes["has_dot"].tool == "has.dot"
    import re

    assert all(re.match(r"^[a-zA-Z0-9_-]{1,64}$", n) for n in names)


# --------------------------------------------------------------------------- real servers


@pytest.mark.integration
async def test_mcp_server_time_from_pypi() -> None:
    cfg = parse_mcp_config({"mcpServers": {"time": {"command": "mcp-server-time"}}})
    async with MCPEnvironment(cfg) as e:
        names = [t.name for t in await e.list_tools()]
        assert "get_current_time" in names
        r = await e.call_tool("get_current_time", {"timezone": "UTC"})
        assert not r.is_error and json.loads(r.text)["timezone"] == "UTC"
        assert r.structured["timezone"] == "UTC"
        bad = await e.call_tool("get_current_time", {"timezone": "Mars/Olympus"})
        assert bad.is_error


@pytest.mark.integration
async def test_npm_everything_and_filesystem_together(tmp_path: Path) -> None:
    (tmp_path / "note.txt").write_text("hello from a file")
    cfg = parse_mcp_config({"mcpServers": {
        "every": {"command": node_server("mcp-server-everything"), "args": ["stdio"]},
        "fs": {"command": node_server("mcp-server-filesystem"), "args": [str(tmp_path)]},
    }})  # fmt: skip
    async with MCPEnvironment(cfg) as e:
        tools = {t.name: t for t in await e.list_tools()}
        assert tools["echo"].origin == "every" and tools["read_text_file"].origin == "fs"
        assert (await e.call_tool("echo", {"message": "hi"})).text == "Echo: hi"
        got = await e.call_tool("read_text_file", {"path": str(tmp_path / "note.txt")})
        assert got.text == "hello from a file" and not got.is_error
        denied = await e.call_tool("read_text_file", {"path": "/etc/hostname"})
        assert denied.is_error and "outside allowed" in denied.text
        img = await e.call_tool("get-tiny-image", {})
        assert "[image image/png" in img.text


@pytest.mark.integration
async def test_results_text_structured_errors_and_images(env: MCPEnvironment) -> None:
    assert (await env.call_tool("echo", {"text": "hi"})).text == "hi"
    added = await env.call_tool("add", {"a": 2, "b": 40})
    assert added.text == "42" and added.structured == {"result": 42}
    failed = await env.call_tool("fail", {"message": "nope"})
    assert failed.is_error and "nope" in failed.text
    assert (await env.call_tool("image", {})).text.startswith("[image image/png")
    assert (await env.call_tool("dotted_name", {})).text == "dotted ok"  # sanitized name routed


@pytest.mark.integration
async def test_hanging_call_times_out_and_session_stays_usable(env: MCPEnvironment) -> None:
    t0 = time.monotonic()
    r = await env.call_tool("sleep", {"seconds": 60})
    assert r.is_error and "timed out after 1.5 s" in r.text
    assert time.monotonic() - t0 < 10
    assert (await env.call_tool("count", {})).text == "1"  # same process, still serving


@pytest.mark.integration
async def test_crash_gives_error_then_restart(env: MCPEnvironment) -> None:
    assert (await env.call_tool("count", {})).text == "1"
    crashed = await env.call_tool("crash", {})
    assert crashed.is_error and "crashed" in crashed.text and "restarted" in crashed.text
    again = await env.call_tool("count", {})
    assert again.text == "1" and not again.is_error  # a fresh process: its counter restarted


@pytest.mark.integration
async def test_restarts_are_bounded() -> None:
    cfg = parse_mcp_config({"mcpServers": {"fx": fixture()}})
    async with MCPEnvironment(cfg) as e:
        texts = [(await e.call_tool("crash", {})).text for _ in range(6)]
    assert "not restarting it again" in texts[-1]


@pytest.mark.integration
async def test_failed_server_reported_with_stderr_others_work() -> None:
    cfg = parse_mcp_config({"mcpServers": {
        "good": fixture(),
        "bad": fixture(env={"FIXTURE_EXIT_AT_START": "4"}),
        "missing": {"command": "/nonexistent/mcp-server"},
    }})  # fmt: skip
    async with MCPEnvironment(cfg) as e:
        assert set(e.failures) == {"bad", "missing"}
        assert "'bad' failed to start" in e.failures["bad"]
        assert "refusing to start (exit 4)" in e.failures["bad"]  # the stderr tail
        assert "No such file" in e.failures["missing"]
        assert (await e.call_tool("echo", {"text": "x"})).text == "x"


@pytest.mark.integration
async def test_strict_mode_raises_and_leaves_nothing_running() -> None:
    before = fixture_pids()
    cfg = parse_mcp_config({"mcpServers": {
        "good": fixture(), "bad": fixture(env={"FIXTURE_EXIT_AT_START": "4"})}})  # fmt: skip
    with pytest.raises(ServerError, match="strict mode"):
        await MCPEnvironment(cfg, strict=True).start()
    assert await no_fixture_left(before) == set()


@pytest.mark.integration
async def test_slow_start_waits_and_too_slow_fails() -> None:
    cfg = parse_mcp_config({"mcpServers": {
        "slow": fixture(env={"FIXTURE_STARTUP_DELAY": "2"}, startupTimeout=20),
        "tooslow": fixture(env={"FIXTURE_STARTUP_DELAY": "30"}, startupTimeout=3),
    }})  # fmt: skip
    t0 = time.monotonic()
    async with MCPEnvironment(cfg) as e:
        assert list(e.failures) == ["tooslow"] and "within 3 s" in e.failures["tooslow"]
        assert (await e.call_tool("echo", {"text": "late"})).text == "late"
    assert time.monotonic() - t0 < 20


@pytest.mark.integration
async def test_streamable_http_transport() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*FIXTURE, "--http", str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "HTTP fixture did not start"
                await asyncio.sleep(0.1)
        cfg = parse_mcp_config({"mcpServers": {"web": {"url": f"http://127.0.0.1:{port}/mcp",
                                                       "headers": {"X-Test": "1"}}}})  # fmt: skip
        async with MCPEnvironment(cfg) as e:
            assert (await e.call_tool("echo", {"text": "over http"})).text == "over http"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.integration
async def test_close_ends_every_child() -> None:
    cfg = parse_mcp_config({"mcpServers": {"a": fixture(), "b": fixture()}})
    e = await MCPEnvironment(cfg).start()
    assert len(descendants(os.getpid())) >= 2
    await e.close()
    await asyncio.sleep(0.3)
    assert descendants(os.getpid()) == []


@pytest.mark.integration
def test_ctrl_c_during_a_hanging_call_cleans_up(tmp_path: Path) -> None:
    """astra-agent tools/run under SIGINT: exits, and no MCP server outlives it."""
    cfg = tmp_path / "mcp.json"
    cfg.write_text(json.dumps({"mcpServers": {"fx": fixture(timeout=120)}}))
    code = (
        "import asyncio, json\n"
        "from astra_agent.mcp_config import load_mcp_config\n"
        "from astra_agent.mcp_env import MCPEnvironment\n"
        "async def main():\n"
        f"    async with MCPEnvironment(load_mcp_config({str(cfg)!r})) as e:\n"
        "        print('ready', flush=True)\n"
        "        await e.call_tool('sleep', {'seconds': 600})\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=from_a_terminal)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    kids = descendants(proc.pid)
    assert kids
    os.kill(proc.pid, signal.SIGINT)  # only the parent: our code must end the children
    try:
        proc.wait(timeout=120)  # a bound on a hang, not a speed: machines get busy
    except subprocess.TimeoutExpired:
        state = signal_state(proc.pid)
        proc.kill()
        raise AssertionError(f"no exit on SIGINT: {state}") from None
    time.sleep(0.5)
    assert not [k for k in kids if alive(k)]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False
