"""MCP servers that misbehave at the protocol level (astra_agent.testing.mcp_faults), over stdio:
schemas that try to fetch or to backtrack forever, a server that never initializes, JSON-RPC
error replies, invalid tool names, results over the size cap."""

from __future__ import annotations

import asyncio
import http.server
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from astra_agent import schema
from astra_agent.environment import OPENAI_TOOL_NAME
from astra_agent.episode import EpisodeLimits, run_episode
from astra_agent.mcp_config import parse_mcp_config
from astra_agent.mcp_env import MCPEnvironment
from astra_agent.mcp_stdio import LineReader, stdio_transport
from astra_agent.model import ChatModel, ModelConfig
from astra_agent.schema import _registry, compile_schema, schema_error
from astra_agent.testing.mcp_faults import BAD_NAMES, RPC_ERRORS
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from tests.conftest import cancel_inside_pipe_connection, sleep_marker

FAULTS = [sys.executable, "-m", "astra_agent.testing.mcp_faults"]


def faults(mode: str, *args: str, **extra: Any) -> dict[str, Any]:
    return {"command": FAULTS[0], "args": [*FAULTS[1:], mode, *args], **extra}


def fault_pids() -> set[int]:
    pids = set()
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"astra_agent.testing.mcp_faults" in cmd.read_bytes():
                pids.add(int(cmd.parent.name))
        except OSError:
            continue
    return pids


@pytest.fixture
def counting_http() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server that records every request it receives."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            body = b'{"type": "integer"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """A file, and the list of times this process opened it (an audit hook)."""
    target = tmp_path / "secret.json"
    target.write_text('{"type": "integer"}')
    seen: list[str] = []
    active = [True]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if active[0] and event == "open" and args and str(args[0]) == str(target):
            seen.append(event)

    sys.addaudithook(hook)  # hooks cannot be removed: this one switches itself off
    try:
        yield target, seen
    finally:
        active[0] = False


async def _env(cfg: dict[str, Any]) -> MCPEnvironment:
    return await MCPEnvironment(parse_mcp_config({"mcpServers": cfg})).start()


@pytest.fixture
async def redos_env() -> AsyncIterator[MCPEnvironment]:
    env = await _env({"re": faults("redos")})
    try:
        yield env
    finally:
        await env.close()


# --------------------------------------------------------------------------- $ref: no fetching


def test_registry_retrieves_nothing(counting_http: tuple[str, list[str]]) -> None:
    from referencing.exceptions import NoSuchResource

    url, seen = counting_http
    with pytest.raises(NoSuchResource):
        _registry().get_or_retrieve(f"{url}/x.json")
    assert seen == []


@pytest.mark.integration
async def test_remote_refs_are_never_fetched(
    counting_http: tuple[str, list[str]], opened: tuple[Path, list[str]]
) -> None:
    """Each schema is skipped (the call goes to the tool, which decides); nothing is fetched
    or opened; a local ref is still checked."""
    url, requests = counting_http
    target, opens = opened
    env = await _env({"refs": faults("ref", url, str(target))})
    try:
        specs = {t.name: t for t in await env.list_tools()}
        for name in ("ref_http", "ref_id", "ref_schema", "ref_file"):
            assert await schema_error(specs[name], {"q": "not an integer"}) is None, name
        assert await schema_error(specs["ref_local"], {"q": 1}) == (
            "1 is not of type 'string' (at 'q')"
        )
        assert requests == [] and opens == []
        assert "refers to" in compile_schema(specs["ref_http"].parameters).why
    finally:
        await env.close()


@pytest.mark.integration
async def test_episode_with_remote_ref_calls_the_tool_and_fetches_nothing(
    counting_http: tuple[str, list[str]],
) -> None:
    url, requests = counting_http
    env = await _env({"refs": faults("ref", url)})
    replies = [Reply(tool_calls=[("ref_http", '{"q": "x"}')]), Reply(content="done")]
    with ScriptedServer(replies) as srv:
        model = ChatModel(ModelConfig(base_url=srv.base_url, model="scripted"))
        try:
            traj = await run_episode(model, env, [{"role": "user", "content": "go"}])
        finally:
            await model.close()
            await env.close()
    assert [e.status for e in traj.events] == ["ok"]
    assert "called 'ref_http'" in traj.messages[2]["content"]
    assert requests == []


# --------------------------------------------------------------------------- ReDoS: bounded


async def _ticking(check: Any) -> tuple[Any, float, int, float]:
    """Run ``check`` while another coroutine ticks every 10 ms; (result, seconds, ticks, the
    longest gap between two ticks in seconds)."""
    ticks, gap = 0, 0.0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks, gap
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            ticks, gap, last = ticks + 1, max(gap, now - last), now

    task = asyncio.create_task(ticker())
    t0 = time.monotonic()
    try:
        result = await check
    finally:
        stop.set()
        await task
    return result, time.monotonic() - t0, ticks, gap


@pytest.mark.integration
@pytest.mark.parametrize(
    "tool,args",
    [
        ("alternation", {"s": "a" * 40 + "!"}),
        ("keys", {"a" * 40 + "!": 1}),
        ("closed", {"a" * 40 + "!": 1}),
    ],
)
async def test_catastrophic_pattern_is_skipped_within_budget_and_loop_ticks(
    redos_env: MCPEnvironment, tool: str, args: dict[str, Any]
) -> None:
    spec = next(t for t in await redos_env.list_tools() if t.name == tool)
    result, took, ticks, gap = await _ticking(schema_error(spec, args, timeout_s=1.0))
    assert result is None  # out of budget: not checked, the call goes to the tool
    assert took < 2.5
    # The loop kept running: Python's re would freeze it for the whole 1 s budget, so that it
    # could tick only before the match began and after it ended (≤ 2 ticks). Neither a tick
    # rate nor the longest gap: they measure the machine's load (on machines loaded by
    # training the loop ticked 19 times in 1.85 s, and 13 times with one 0.88 s gap).
    assert ticks >= 5, (ticks, gap, took)


@pytest.mark.integration
async def test_patterns_still_check_ordinary_arguments(redos_env: MCPEnvironment) -> None:
    specs = {t.name: t for t in await redos_env.list_tools()}
    assert await schema_error(specs["alternation"], {"s": "aaaa"}) is None
    assert "does not match" in (await schema_error(specs["alternation"], {"s": "b"}) or "")
    # re takes ~2^40 steps here; the regex engine answers at once
    assert "does not match" in (
        await schema_error(specs["nested_plus"], {"s": "a" * 40 + "!"}) or ""
    )
    assert "do not match any of the regexes" in (
        await schema_error(specs["closed"], {"x": 1, "y": 2}) or ""
    )


async def test_a_schema_compiled_once_is_checked_inline_for_every_spec_that_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An episode's specs are new objects: the first compiles off the loop, the next with the
    same schema (or the same spec again) are checked inline; a schema with a pattern never is."""
    from astra_agent.environment import ToolSpec

    plain = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    pattern = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a+$"}}}
    threads: list[str] = []
    to_thread = asyncio.to_thread

    async def counted(fn: Any, *args: Any) -> Any:
        threads.append(args[0].name)
        return await to_thread(fn, *args)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    first, again = ToolSpec("first", parameters=dict(plain)), ToolSpec("again", parameters=plain)
    assert "is not of type 'integer'" in (await schema_error(first, {"n": "x"}) or "")
    assert "'n' is a required property" in (await schema_error(again, {}) or "")
    assert await schema_error(first, {"n": 1}) is None
    for name in ("p1", "p2"):
        assert "does not match" in (
            await schema_error(ToolSpec(name, parameters=pattern), {"s": "b"}) or ""
        )
    assert threads == ["first", "p1", "p2"]


@pytest.mark.integration
async def test_episode_with_catastrophic_pattern_runs_the_call(
    redos_env: MCPEnvironment, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The episode checks through the bounded, off-loop path and then runs the call.

    How responsive the loop stays during the check is measured on ``schema_error`` itself
    (above). Here the wall clock only bounds a hang: a whole-suite run in CI once saw one
    8.7 s stall of this loop on a loaded machine, longer than the check's whole budget, so a
    gap says nothing about the check at this level; the log line says which path it took."""
    monkeypatch.setattr(schema, "_WARNED", set())  # an earlier test may have warned already
    args = '{"s": "' + "a" * 40 + '!"}'
    replies = [Reply(tool_calls=[("alternation", args)]), Reply(content="done")]
    with ScriptedServer(replies) as srv, caplog.at_level(logging.WARNING, "astra_agent.schema"):
        model = ChatModel(ModelConfig(base_url=srv.base_url, model="scripted"))
        try:
            run = run_episode(
                model, redos_env, [{"role": "user", "content": "go"}],
                limits=EpisodeLimits(tool_timeout_s=1.0),
            )  # fmt: skip
            traj, took, ticks, _ = await _ticking(run)
        finally:
            await model.close()
    assert [e.status for e in traj.events] == ["ok"] and traj.termination == "stop"
    assert "the check ran out of its 1 s budget" in caplog.text, caplog.text
    # Python's re would take ~2^40 steps, holding the loop: a bound on that hang, not a speed
    assert took < 60 and ticks >= 5, (ticks, took)


# --------------------------------------------------------------------------- start-up


@pytest.mark.integration
async def test_server_that_never_initializes_fails_within_startup_timeout() -> None:
    """It ignores SIGTERM and stdin EOF too: the clean-up must kill it, and fast."""
    before = fault_pids()
    cfg = parse_mcp_config({"mcpServers": {
        "hang": faults("hang-init", startupTimeout=2), "ok": faults("rpc-error")}})  # fmt: skip
    t0 = time.monotonic()
    env = await MCPEnvironment(cfg).start()
    took = time.monotonic() - t0
    try:
        assert list(env.failures) == ["hang"] and "within 2 s" in env.failures["hang"]
        assert "serving mode hang-init" in env.failures["hang"]  # its stderr tail
        assert took < 2 + 1.5, f"start-up took {took:.1f} s"
        assert not (await env.call_tool("pid", {})).is_error
    finally:
        await env.close()
    assert fault_pids() - before == set()


# --------------------------------------------------------------------------- errors and names


@pytest.mark.integration
async def test_jsonrpc_error_reply_is_an_error_result_not_a_restart() -> None:
    env = await _env({"err": faults("rpc-error", timeout=5)})
    try:
        pid = (await env.call_tool("pid", {})).text
        for name, (code, message) in RPC_ERRORS.items():
            t0 = time.monotonic()
            r = await env.call_tool(name, {})
            assert r.is_error and f"JSON-RPC error {code}: {message}" in r.text, r.text
            assert time.monotonic() - t0 < 2  # -32001 is the server's, not a timeout
        assert (await env.call_tool("pid", {})).text == pid  # the same process: no restart
    finally:
        await env.close()


@pytest.mark.integration
async def test_invalid_tool_names_are_sanitized_and_routed_back() -> None:
    env = await _env({"names": faults("bad-names")})
    try:
        routes = env.routes()
        assert sorted(tool for _, tool in routes.values()) == sorted(BAD_NAMES)
        assert all(OPENAI_TOOL_NAME.match(public) for public in routes)
        for public, (_, original) in routes.items():
            r = await env.call_tool(public, {})
            assert r.text == f"called {original!r} with {{}}" and not r.is_error
    finally:
        await env.close()


# --------------------------------------------------------------------------- large results


@pytest.mark.integration
async def test_result_over_the_cap_is_an_error_result_and_the_session_survives() -> None:
    env = await _env({"big": faults("large", maxMessageBytes=2**20)})
    try:
        over = await env.call_tool("blob", {"size": 3 * 2**20})
        assert over.is_error and "exceeds maxMessageBytes = 1,048,576" in over.text
        under = await env.call_tool("blob", {"size": 2**19})
        assert not under.is_error and len(under.text) == 2**19
    finally:
        await env.close()


def _feed_in_chunks(megabytes: int) -> tuple[float, list[Any]]:
    """CPU seconds to feed one message of ``megabytes`` MiB in 64 KiB chunks, and the output."""
    line = b'{"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "'
    payload = line + b"x" * (megabytes * 2**20) + b'"}]}}\n'
    reader = LineReader(32 * 2**20)
    t0 = time.process_time()
    got = [m for i in range(0, len(payload), 65536) for m in reader.feed(payload[i : i + 65536])]
    return time.process_time() - t0, got


def test_line_reader_is_linear_and_splits_across_chunks() -> None:
    # 4× the bytes must cost about 4× the CPU (joining the chunks at every feed was quadratic:
    # 16×, ≈9 s for 24 MB); a ratio from one run, whatever the machine's speed or load.
    _feed_in_chunks(1)  # warm-up: the first message's validators are built then
    small = min(_feed_in_chunks(6)[0] for _ in range(3))  # the least of 3: noise only adds
    big, got = min((_feed_in_chunks(24) for _ in range(3)), key=lambda r: r[0])
    assert big < 8 * max(small, 0.01), (small, big)
    assert len(got) == 1 and got[0].message.id == 7
    split = LineReader(1000)
    msg = b'{"jsonrpc": "2.0", "id": "a", "result": {}}'
    assert split.feed(b"\n" + msg[:10]) == []  # a blank line is skipped; a half line waits
    assert [m.message.id for m in split.feed(msg[10:] + b"\n")] == ["a"]


def test_oversized_message_answers_its_request_with_an_error() -> None:
    reader = LineReader(1024)
    head = b'{"jsonrpc":"2.0","id":42,"result":{"content":[{"type":"text","text":"'
    out = reader.feed(head + b"y" * 5000 + b'"}]}}\n{"jsonrpc":"2.0","id":43,"result":{}}\n')
    assert [m.message.id for m in out] == [42, 43]
    assert out[0].message.error.data["reason"] == "message_too_large"
    tail_id = LineReader(1024).feed(b'{"result":{"x":"' + b"z" * 5000 + b'"},"id":9}\n')
    assert tail_id[0].message.id == 9


async def test_a_server_start_cancelled_while_its_pipes_connect_ends_and_stops_its_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cancelled while asyncio connects the new process's pipes, Python 3.11 kills only that pid
    and waits for pipes its children hold: a server launcher (npx, uvx, a shell) with a child
    hung the caller for good. The start runs to its end; then the whole group stops."""
    marker = sleep_marker()

    async def serve() -> None:
        argv = ["sh", "-c", f"sleep {marker} & exec cat"]
        async with stdio_transport(argv, env=None, cwd=None, errlog=sys.stderr):
            await asyncio.sleep(60)

    await cancel_inside_pipe_connection(serve, marker, monkeypatch)
