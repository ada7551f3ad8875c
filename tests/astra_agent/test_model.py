"""The model client's lifecycle and failures (real sockets on loopback), and the Model protocol
the episode loop is typed to."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import socket
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from astra_agent.environment import ToolSpec
from astra_agent.episode import run_episode
from astra_agent.errors import ConfigError, ServerError
from astra_agent.function_env import FunctionEnvironment
from astra_agent.model import (
    ChatModel,
    DeltaHook,
    EndpointError,
    Model,
    ModelConfig,
    ModelTurn,
    ToolCall,
)
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from astra_agent.trajectory import Trajectory

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer([Reply(content="hello")]) as srv:
        yield srv


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def mute_port() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


def env() -> FunctionEnvironment:
    return FunctionEnvironment([(ToolSpec("add"), lambda: "2")])


# ------------------------------------------------------------------ connection failures


@pytest.mark.parametrize("configured", [False, True])
async def test_refused_connection_says_what_to_do_after_a_short_retry(configured: bool) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    model = ChatModel(ModelConfig(base_url=url, model="m" if configured else None))
    t0 = time.monotonic()
    try:
        with pytest.raises(EndpointError) as info:
            if configured:  # no start-up check: the first request finds out
                await model.complete(HI)
            else:
                await model.check_model()
    finally:
        await model.close()
    elapsed = time.monotonic() - t0
    assert 0.5 < elapsed < 3, elapsed  # retried for ≈1 s (was ≈8 s of backoff)
    assert info.value.kind == "unreachable"
    assert "cannot connect" in info.value.message
    assert info.value.hint == f"is a server running at {url}? start one with `astra-serve up`"


async def test_refused_connection_is_not_retried_without_retries() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    model = ChatModel(ModelConfig(base_url=url, max_retries=0))
    t0 = time.monotonic()
    with pytest.raises(EndpointError, match="cannot connect"):
        await model.check_model()
    await model.close()
    assert time.monotonic() - t0 < 0.5


async def test_mute_server_fails_the_start_up_check_in_seconds(mute_port: int) -> None:
    url = f"http://127.0.0.1:{mute_port}/v1"
    # request_timeout_s × retries would be 50 minutes: the check has its own short timeout.
    cfg = ModelConfig(base_url=url, request_timeout_s=600, max_retries=4, probe_timeout_s=1)
    model = ChatModel(cfg)
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(30):  # bound the test itself, whatever the client does
            with pytest.raises(EndpointError) as info:
                await model.check_model()
    finally:
        await model.close()
    assert time.monotonic() - t0 < 15
    assert info.value.kind == "timeout"
    assert "no answer within 1 s" in info.value.message
    assert f"accepts connections at {url} but does not answer" in (info.value.hint or "")


async def test_mute_server_fails_async_with_too(mute_port: int) -> None:
    cfg = ModelConfig(base_url=f"http://127.0.0.1:{mute_port}/v1", probe_timeout_s=0.5)
    model = ChatModel(cfg)
    t0 = time.monotonic()
    async with asyncio.timeout(30):
        with pytest.raises(EndpointError, match="request timed out"):
            async with model:
                pytest.fail("entered")
    assert time.monotonic() - t0 < 15
    assert model.closed  # a failed enter releases the session


async def test_http_errors_carry_their_status_code(server: ScriptedServer) -> None:
    server.set_script([Reply(status=400)])
    model = ChatModel(ModelConfig(base_url=server.base_url, model="scripted"))
    with pytest.raises(EndpointError) as info:
        await model.complete(HI)
    await model.close()
    assert (info.value.kind, info.value.status_code) == ("status", 400)
    assert isinstance(info.value, ServerError)  # what the loop and the CLIs catch


# ------------------------------------------------------------------ async with


async def test_async_with_checks_the_endpoint_and_closes_the_session(
    server: ScriptedServer,
) -> None:
    async with ChatModel(ModelConfig(base_url=server.base_url)) as model:
        assert model.name == "scripted"  # resolved on entry
        traj = await run_episode(model, env(), HI)
        assert not model.closed
    assert model.closed and traj.final_answer == "hello"


async def test_async_with_a_model_not_served_fails_and_closes(server: ScriptedServer) -> None:
    model = ChatModel(ModelConfig(base_url=server.base_url, model="gpt-nope"))
    with pytest.raises(ConfigError, match="not served"):
        async with model:
            pytest.fail("entered")
    assert model.closed


def _resource_warnings(run: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(run())
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def test_the_old_library_snippet_leaks_the_session_async_with_does_not(
    server: ScriptedServer,
) -> None:
    cfg = ModelConfig(base_url=server.base_url, model="scripted")

    async def old_form() -> None:  # the README's snippet before: nothing closes the model
        await run_episode(ChatModel(cfg), env(), HI)

    async def new_form() -> None:
        async with ChatModel(cfg) as model:
            await run_episode(model, env(), HI)

    assert any("Unclosed client session" in w for w in _resource_warnings(old_form))
    assert not any("Unclosed client session" in w for w in _resource_warnings(new_form))


# ------------------------------------------------------------------ the Model protocol


class ListPolicy(Model):
    """A model that is not an HTTP client (as a token-level RL policy is not): turns from a
    list. It subclasses the protocol for ``async with``."""

    def __init__(self, turns: list[ModelTurn | Exception]) -> None:
        self.turns = turns
        self.seen: list[tuple[int, list[str]]] = []
        self.closed = False

    @property
    def name(self) -> str:
        return "list-policy"

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        on_delta: DeltaHook | None = None,
    ) -> ModelTurn:
        self.seen.append((len(messages), [t["function"]["name"] for t in tools or []]))
        turn = self.turns.pop(0)
        if isinstance(turn, Exception):
            raise turn
        return turn

    async def close(self) -> None:
        self.closed = True


def _turn(content: str = "", calls: list[ToolCall] | None = None) -> ModelTurn:
    return ModelTurn(content, "", calls or [], "tool_calls" if calls else "stop", 3, 2)


async def test_the_loop_runs_any_model_of_the_protocol() -> None:
    policy = ListPolicy([_turn(calls=[ToolCall("c1", "add", "{}")]), _turn("two")])
    assert isinstance(policy, Model) and isinstance(ChatModel(ModelConfig()), Model)
    async with policy:
        traj = await run_episode(policy, env(), HI)
    assert policy.closed
    assert traj.model == "list-policy" and traj.final_answer == "two"
    assert policy.seen == [(1, ["add"]), (3, ["add"])]
    assert [m["role"] for m in traj.messages] == ["user", "assistant", "tool", "assistant"]
    assert traj.usage.prompt_tokens == 6 and traj.usage.completion_tokens == 4


@pytest.mark.parametrize(
    "exc,kind",
    [
        (ServerError("policy died"), "other"),
        (EndpointError("gone", kind="unreachable", url="u"), "unreachable"),
    ],
)
async def test_a_model_failure_ends_the_episode_with_its_kind(exc: ServerError, kind: str) -> None:
    traj = await run_episode(ListPolicy([exc]), env(), HI)
    assert traj.termination == "model_error" and traj.model_failure == kind
    assert str(exc) in traj.termination_detail


# ------------------------------------------------------------------ the wire


async def _raw_server(response: bytes) -> tuple[asyncio.Server, str]:
    """A server that reads a request and answers ``response`` (bytes, as is), then closes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(h.split(b":")[1])
                for h in head.split(b"\r\n")
                if h.lower().startswith(b"content-length")
            ),
            0,
        )
        await reader.readexactly(length)
        writer.write(response)
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/v1"


def _sse(*events: bytes, length: int | None = None) -> bytes:
    body = b"".join(b"data: " + e + b"\n\n" for e in events)
    size = f"Content-Length: {length if length is not None else len(body)}\r\n".encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + size + b"\r\n" + body


def _chunk(**delta: Any) -> bytes:
    import json

    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}).encode()


async def _complete_raw(response: bytes, **cfg: Any) -> EndpointError:
    """The EndpointError of one ``complete`` against a server that answers ``response``."""
    srv, url = await _raw_server(response)
    model = ChatModel(ModelConfig(base_url=url, model="m", **cfg))
    try:
        with pytest.raises(EndpointError) as err:
            await model.complete(HI)
    finally:
        await model.close()
        srv.close()
    return err.value


async def _stream_from(response: bytes) -> tuple[ModelTurn | None, Exception | None, list[str]]:
    srv, url = await _raw_server(response)
    seen: list[str] = []
    model = ChatModel(ModelConfig(base_url=url, model="m", max_retries=0, request_timeout_s=5))
    try:
        return await model.complete(HI, on_delta=lambda k, t: seen.append(t)), None, seen
    except Exception as exc:  # returned for the test to look at
        return None, exc, seen
    finally:
        await model.close()
        srv.close()


async def test_a_stream_cut_part_way_is_an_endpoint_error_with_what_was_shown() -> None:
    first = _chunk(content="Hel")
    turn, exc, seen = await _stream_from(_sse(first, length=len(first) + 500))  # never completed
    assert turn is None and isinstance(exc, EndpointError), exc
    assert exc.kind == "dropped" and "connection failed" in exc.message
    assert seen == ["Hel"]


async def test_an_error_event_in_a_stream_is_an_endpoint_error() -> None:
    error = b'{"error": {"message": "EngineCore died", "code": 500}}'
    _, exc, _ = await _stream_from(_sse(_chunk(content="a"), error))
    assert isinstance(exc, EndpointError) and exc.kind == "other"
    assert "EngineCore died" in exc.message


async def test_a_stream_with_a_long_line_and_no_done_is_read_whole() -> None:
    long = "x" * 300_000  # one event over aiohttp's line limit (64 KiB)
    turn, exc, seen = await _stream_from(_sse(_chunk(reasoning=long), _chunk(content="ok")))
    assert exc is None and turn is not None
    assert (turn.reasoning, turn.content, seen) == (long, "ok", [long, "ok"])


_COMPLETION = (
    b'{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": '
    b'{"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}'
)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"\xff\xfe not text", "not UTF-8"),
        # a chat completion whose text is not UTF-8: bytes that are not UTF-8 at all, JSON in
        # UTF-16 (which json.loads of bytes would take), a surrogate encoded as if in UTF-8
        (_COMPLETION.replace(b"ok", b"ok \xff"), "not UTF-8"),
        (_COMPLETION.decode().encode("utf-16"), "not UTF-8"),
        (_COMPLETION.replace(b"ok", b"ok \xed\xa0\x80"), "not UTF-8"),
        (b"", "the body is empty"),
        (b"<html>proxy</html>", "not JSON"),
    ],
)
async def test_a_body_that_is_not_json_is_not_a_valid_response(body: bytes, words: str) -> None:
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    err = await _complete_raw(head + body, max_retries=0)
    assert re.search(f"not a valid response.*{words}", str(err))
    assert err.kind == "other"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"error": {"message": "prompt is too long"}}', "HTTP 400: prompt is too long"),
        (b'{"error": "bad model"}', "HTTP 400: bad model"),
        (b'{"detail": "nope"}', 'HTTP 400: {"detail": "nope"}'),
        (b"plain words", "HTTP 400: plain words"),
    ],
)
async def test_an_http_error_says_the_servers_message(body: bytes, said: str) -> None:
    head = f"HTTP/1.1 400 Bad Request\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    err = await _complete_raw(head + body)
    assert err.status_code == 400 and said in err.message


async def test_a_closed_model_refuses_to_send() -> None:
    model = ChatModel(ModelConfig(base_url="http://127.0.0.1:9/v1", model="m"))
    await model.close()
    with pytest.raises(EndpointError, match="closed"):
        await model.complete(HI)


async def test_a_reply_claiming_to_be_huge_is_refused_before_it_is_read() -> None:
    err = await _complete_raw(
        b"HTTP/1.1 200 OK\r\nContent-Length: 300000000\r\n\r\n{", max_retries=0
    )
    assert re.search("300,000,000 bytes", str(err))
    assert err.kind == "other"


async def test_a_streamed_event_over_the_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from astra_agent import http_client

    monkeypatch.setattr(http_client, "MAX_BODY_BYTES", 100_000)
    turn, exc, _ = await _stream_from(_sse(_chunk(content="x" * 200_000)))
    assert turn is None and isinstance(exc, EndpointError) and exc.kind == "other", exc
    assert "an event over" in exc.message


async def test_a_lone_surrogate_from_the_server_becomes_u_fffd_and_a_pair_stays() -> None:
    """JSON may escape a lone surrogate (``"\\ud800"``): not Unicode, so no record holding it
    could be written (a τ² or arena run would die at its next append). Plain and streamed."""
    msg = (
        b'{"role": "assistant", "content": "a\\ud800b \\ud83d\\ude00", "reasoning": "r\\uDFFF",'
        b' "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f\\udc00",'
        b' "arguments": "{\\"x\\": \\"\\\\ud800\\"}"}}]}'
    )
    body = b'{"choices": [{"index": 0, "message": ' + msg + b', "finish_reason": "stop"}]}'
    srv, url = await _raw_server(
        f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    )
    model = ChatModel(ModelConfig(base_url=url, model="m", max_retries=0))
    try:
        turn = await model.complete(HI)
    finally:
        await model.close()
        srv.close()
    assert (turn.content, turn.reasoning) == ("a\ufffdb \U0001f600", "r\ufffd")
    assert turn.tool_calls[0].name == "f\ufffd"
    # arguments are the model's JSON text: its escape is text, kept as written
    assert turn.tool_calls[0].arguments == '{"x": "\\ud800"}'
    Trajectory(messages=[turn.to_message()]).to_json_line().encode()  # writable
    streamed, exc, _ = await _stream_from(_sse(_chunk(content="s\\ud800"), _chunk(content="t")))
    assert exc is None and streamed is not None and streamed.content == "s\\ud800t"
    streamed, exc, _ = await _stream_from(_sse(b'{"choices": [{"index": 0, "delta": '
                                               b'{"content": "s\\ud800"}}]}'))  # fmt: skip
    assert exc is None and streamed is not None and streamed.content == "s\ufffd"


def test_a_body_encodes_as_json_dumps_writes_it_with_its_tools_kept() -> None:
    """The tools' text is kept between the steps of an episode (the same list), and encoded
    again when the list changed in place; every body is json.dumps's, byte for byte."""
    from astra_agent.http_client import BodyEncoder

    encoder = BodyEncoder("tools", keep=2)
    tools: list[dict[str, Any]] = [
        ToolSpec(
            "f", "naïve ☃", {"type": "object", "properties": {"x": {"type": "number"}}}
        ).to_openai()
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi \ud800"}]

    def same(body: dict[str, Any]) -> None:
        assert encoder.encode(body) == json.dumps(body).encode()

    for step in range(3):
        messages.append({"role": "assistant", "content": f"step {step}"})
        same({"model": "m", "messages": messages, "temperature": 0.6, "tools": tools})
    tools[0]["function"]["description"] = "changed"
    same({"model": "m", "messages": messages, "tools": tools})
    tools.append(ToolSpec("g").to_openai())
    same({"tools": tools, "model": "m"})
    for other in ([ToolSpec(f"t{i}").to_openai()] for i in range(3)):  # over ``keep``
        same({"model": "m", "tools": other})
    same({"model": "m", "tools": tools, "extra": {"nan": float("nan")}})
    same({"model": "m", "messages": messages})  # no tools
    same({"model": "m", "tools": tools, 1: "a key json.dumps turns into a string"})  # type: ignore[dict-item]


def test_a_client_that_hangs_up_before_its_answer_prints_nothing_on_the_server(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A client that times out closes its socket; the scripted server's late answer then meets
    a broken pipe: not the server's error, so no traceback on the test run's output."""
    body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "x"}]})
    with ScriptedServer([Reply(content="late", delay_s=0.5)] * 2) as srv:
        port = int(srv.base_url.split(":")[2].split("/")[0])
        for _ in range(2):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
                )
                sock.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
            time.sleep(0.8)  # the answer is written to a connection reset by its client
        assert len(srv.requests) == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Broken pipe" not in err, err
