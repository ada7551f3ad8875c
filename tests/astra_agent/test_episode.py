"""The episode loop against the scripted OpenAI-compatible server (real HTTP)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from astra_agent.environment import Environment, ResetUnsupportedError, ToolResult, ToolSpec
from astra_agent.episode import CallPolicy, EpisodeLimits, run_episode, truncate_middle
from astra_agent.function_env import FunctionEnvironment
from astra_agent.model import ChatModel, ModelConfig, recover_tool_calls
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from astra_agent.trajectory import Trajectory, append_jsonl, read_jsonl

OBJ = {"type": "object"}


def spec(name: str, props: dict[str, Any] | None = None, required: list[str] | None = None):
    params = {"type": "object", "properties": props or {}, "required": required or []}
    return ToolSpec(name=name, description=f"tool {name}", parameters=params)


def make_env(peer: asyncio.Event | None = None) -> FunctionEnvironment:
    peer = peer or asyncio.Event()

    async def wait_peer() -> str:
        await peer.wait()
        return "peer seen"

    async def set_peer() -> str:
        peer.set()
        return "peer set"

    async def sleep(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "slept"

    def boom() -> str:
        raise RuntimeError("kaboom")

    return FunctionEnvironment(
        [
            (
                spec("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"]),
                lambda a, b: {"sum": a + b},
            ),
            (spec("wait_peer"), wait_peer),
            (spec("set_peer"), set_peer),
            (spec("sleep", {"seconds": {"type": "number"}}, ["seconds"]), sleep),
            (spec("boom"), boom),
            (
                spec("huge", {"n": {"type": "integer"}}),
                lambda n: "H" * (n // 2) + "T" * (n - n // 2),
            ),
        ]
    )


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer([Reply(content="hi")]) as srv:
        yield srv


def model_for(srv: ScriptedServer, **kw: Any) -> ChatModel:
    cfg = ModelConfig(base_url=srv.base_url, model="scripted", retry_backoff_s=0.01, **kw)
    return ChatModel(cfg)


async def episode(
    srv: ScriptedServer, replies: list[Reply], limits: EpisodeLimits | None = None, **model_kw: Any
) -> Trajectory:
    srv.set_script(replies)
    model = model_for(srv, **model_kw)
    try:
        return await run_episode(
            model, make_env(), [{"role": "user", "content": "go"}], limits=limits
        )
    finally:
        await model.close()


def tool_msgs(traj: Trajectory) -> list[str]:
    return [m["content"] for m in traj.messages if m["role"] == "tool"]


async def test_simple_call_then_answer(server: ScriptedServer) -> None:
    traj = await episode(
        server,
        [
            Reply(reasoning="think", tool_calls=[("add", '{"a": 2, "b": 3}')]),
            Reply(content="5"),
        ],
    )
    assert traj.termination == "stop" and traj.final_answer == "5"
    assert tool_msgs(traj) == ['{"sum": 5}']
    assert [e.status for e in traj.events] == ["ok"]
    assert traj.steps == 2 and traj.usage.prompt_tokens > 0
    assert traj.messages[1]["reasoning_content"] == "think"
    assert traj.tools[0]["function"]["name"] == "add"


async def test_parallel_calls_run_concurrently_and_return_in_order(server: ScriptedServer) -> None:
    # wait_peer only returns once set_peer has run: sequential execution would time out.
    calls = [("wait_peer", "{}"), ("set_peer", "{}"), ("add", '{"a": 1, "b": 1}')]
    traj = await episode(
        server, [Reply(tool_calls=calls), Reply(content="done")], EpisodeLimits(tool_timeout_s=5)
    )
    assert tool_msgs(traj) == ["peer seen", "peer set", '{"sum": 2}']
    ids = [c["id"] for c in traj.messages[1]["tool_calls"]]
    assert [m["tool_call_id"] for m in traj.messages if m["role"] == "tool"] == ids
    assert all(e.status == "ok" for e in traj.events)


async def test_sequential_mode_really_is_sequential(server: ScriptedServer) -> None:
    calls = [("wait_peer", "{}"), ("set_peer", "{}")]
    traj = await episode(
        server,
        [Reply(tool_calls=calls), Reply(content="done")],
        EpisodeLimits(tool_timeout_s=0.3, parallel_tool_calls=False),
    )
    assert [e.status for e in traj.events] == ["timeout", "ok"]


@pytest.mark.parametrize(
    "call,status,needle",
    [
        (("add", '{"a": 1,'), "invalid_json", "not valid JSON"),
        (("add", '{"a": ' + "9" * 5000 + "}"), "invalid_json", "cannot be decoded (ValueError"),
        (("add", "[" * 100_000 + "]" * 100_000), "invalid_json", "cannot be decoded"),
        (("nope", "{}"), "unknown_tool", "unknown tool 'nope'. Available tools: add, boom"),
        (("add", '{"a": "x", "b": 1}'), "schema_error", "'x' is not of type 'integer'"),
        (("add", '{"a": 1}'), "schema_error", "'b' is a required property"),
        (("add", "[1, 2]"), "schema_error", "must be a JSON object"),
        (("boom", "{}"), "tool_error", "RuntimeError: kaboom"),
        (("sleep", '{"seconds": 5}'), "timeout", "timed out after 0.2 s"),
    ],
)
async def test_bad_calls_become_results_and_the_loop_goes_on(
    server: ScriptedServer, call: tuple[str, str], status: str, needle: str
) -> None:
    # 0.2 s only where the time-out is the case: a sync tool's thread hop and the schema check
    # (whose budget the time-out caps) took over 0.2 s on a loaded CI machine once
    timeout = 0.2 if status == "timeout" else 30.0
    traj = await episode(
        server,
        [Reply(tool_calls=[call]), Reply(content="recovered")],
        EpisodeLimits(tool_timeout_s=timeout),
    )
    assert traj.termination == "stop" and traj.final_answer == "recovered"
    (event,) = traj.events
    assert event.status == status
    assert needle in tool_msgs(traj)[0]
    assert traj.counts() == {status: 1}


async def test_call_left_inside_reasoning_is_recovered(server: ScriptedServer) -> None:
    # vLLM's qwen3 parser keeps a call written inside an unclosed <think> as reasoning.
    leaked = 'let me add <tool_call>\n{"name": "add", "arguments": {"a": 4, "b": 4}}\n</tool_call>'
    traj = await episode(server, [Reply(reasoning=leaked), Reply(content="8")])
    assert tool_msgs(traj) == ['{"sum": 8}']
    assert traj.recovered_calls == 1 and traj.events[0].recovered
    assert traj.messages[1]["reasoning_content"] == "let me add"
    assert traj.counts() == {"ok": 1, "recovered": 1}


async def test_calls_left_in_content_are_recovered_malformed_one_reported(
    server: ScriptedServer,
) -> None:
    # vLLM's hermes parser returns everything as content if one call is malformed.
    content = (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, \n</tool_call>'
    )
    traj = await episode(server, [Reply(content=content), Reply(content="ok")])
    assert [e.status for e in traj.events] == ["ok", "invalid_json"]
    assert traj.recovered_calls == 2
    assert traj.messages[1]["content"] == ""
    assert len(traj.messages[1]["tool_calls"]) == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_only_in_reasoning_is_taken_and_counted(
    server: ScriptedServer, stream: bool
) -> None:
    """vLLM's qwen3 parser on a model that does not think: the answer as reasoning, content
    empty. It reaches the user as the answer, and the trajectory says where it was found."""
    replies = [Reply(reasoning="The capital of France is Paris.", content=None)]
    server.set_script(replies)
    model = model_for(server)
    seen: list[tuple[str, str]] = []
    on_delta = (lambda k, t: seen.append((k, t))) if stream else None
    try:
        task = [{"role": "user", "content": "capital?"}]
        traj = await run_episode(model, make_env(), task, on_delta=on_delta)
    finally:
        await model.close()
    assert traj.termination == "stop"
    assert traj.final_answer == "The capital of France is Paris."
    assert "reasoning_content" not in traj.messages[-1]
    assert traj.answers_in_reasoning == 1 and traj.counts() == {"answer_in_reasoning": 1}
    shown = "".join(t for k, t in seen if k == "reasoning")  # streamed as it came: reasoning
    assert shown == ("The capital of France is Paris." if stream else "")
    again = Trajectory.model_validate_json(traj.to_json_line())
    assert again.answers_in_reasoning == 1


@pytest.mark.parametrize(
    "reply",
    [
        Reply(reasoning="thinking", content="the answer"),  # a thinking model's normal reply
        Reply(reasoning="thinking …", content=None, finish_reason="length"),  # cut off
        Reply(reasoning="let me", tool_calls=[("add", '{"a": 1, "b": 1}')]),
    ],
)
async def test_reasoning_beside_an_answer_a_call_or_a_cut_is_left_as_it_is(
    server: ScriptedServer, reply: Reply
) -> None:
    traj = await episode(server, [reply, Reply(content="2")])
    assert traj.answers_in_reasoning == 0
    assert traj.messages[1]["reasoning_content"] == reply.reasoning


async def test_without_recovery_an_answer_in_reasoning_is_counted_not_moved(
    server: ScriptedServer,
) -> None:
    traj = await episode(server, [Reply(reasoning="Paris.", content=None)], recover_calls=False)
    assert traj.answers_in_reasoning == 1
    assert traj.messages[1]["content"] == "" and traj.messages[1]["reasoning_content"] == "Paris."


async def test_finish_reason_length_ends_the_episode(server: ScriptedServer) -> None:
    traj = await episode(server, [Reply(content="aaaa", finish_reason="length")])
    assert traj.termination == "length"


async def test_empty_reply_ends_the_episode(server: ScriptedServer) -> None:
    traj = await episode(server, [Reply(content="")])
    assert traj.termination == "empty_reply"


async def test_500_then_success_is_retried(server: ScriptedServer) -> None:
    traj = await episode(server, [Reply(status=500), Reply(status=429), Reply(content="fine")])
    assert traj.termination == "stop" and traj.final_answer == "fine"
    assert len(server.requests) == 3


async def test_request_timeout_ends_with_model_error(server: ScriptedServer) -> None:
    traj = await episode(
        server, [Reply(content="late", delay_s=2)], request_timeout_s=0.3, max_retries=1
    )
    assert traj.termination == "model_error"
    assert "timed out" in traj.termination_detail
    assert len(server.requests) == 2  # the first try and one retry


async def test_client_errors_are_not_retried(server: ScriptedServer) -> None:
    traj = await episode(server, [Reply(status=400)])
    assert traj.termination == "model_error" and "HTTP 400" in traj.termination_detail
    assert traj.model_failure == "status"
    assert len(server.requests) == 1


async def test_max_steps_and_max_tokens(server: ScriptedServer) -> None:
    loop = [Reply(tool_calls=[("add", '{"a": 1, "b": 1}')])]
    traj = await episode(server, loop, EpisodeLimits(max_steps=3))
    assert traj.termination == "max_steps" and traj.steps == 3 and len(traj.events) == 3
    loop = [Reply(tool_calls=[("add", '{"a": 1, "b": 1}')], prompt_tokens=60, completion_tokens=40)]
    traj = await episode(server, loop, EpisodeLimits(max_tokens=250))
    assert traj.termination == "max_tokens" and traj.steps == 3


async def test_max_time(server: ScriptedServer) -> None:
    loop = [Reply(tool_calls=[("sleep", '{"seconds": 0.2}')])]
    traj = await episode(server, loop, EpisodeLimits(max_time_s=0.5))
    assert traj.termination == "max_time"
    assert traj.timings.total_s < 2


async def test_long_outputs_are_cut_head_and_tail_kept(server: ScriptedServer) -> None:
    traj = await episode(
        server,
        [Reply(tool_calls=[("huge", '{"n": 100000}')]), Reply(content="k")],
        EpisodeLimits(max_tool_output_chars=1000),
    )
    (out,) = tool_msgs(traj)
    assert len(out) <= 1000 and out.startswith("HHH") and out.endswith("TTT")
    assert "characters truncated" in out
    assert traj.events[0].truncated and traj.events[0].output_chars == 100000


async def test_no_output_limit_keeps_results_whole(server: ScriptedServer) -> None:
    traj = await episode(
        server,
        [Reply(tool_calls=[("huge", '{"n": 100000}')]), Reply(content="k")],
        EpisodeLimits(max_tool_output_chars=None),
    )
    (out,) = tool_msgs(traj)
    assert len(out) == 100000 and not traj.events[0].truncated


class Recorder(Environment):
    """An environment that runs whatever reaches it, and remembers what did."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def list_tools(self) -> list[ToolSpec]:
        return [spec("add", {"a": {"type": "integer"}}, ["a"])]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self.calls.append((name, arguments))
        return ToolResult(f"ran {name}")

    async def close(self) -> None:
        return None


async def run_with(
    srv: ScriptedServer, replies: list[Reply], policy: CallPolicy | None
) -> tuple[Trajectory, Recorder]:
    srv.set_script(replies)
    model, env = model_for(srv), Recorder()
    try:
        msgs = [{"role": "user", "content": "go"}]
        return await run_episode(model, env, msgs, policy=policy), env
    finally:
        await model.close()


async def test_policy_can_hand_unchecked_calls_to_the_environment(server: ScriptedServer) -> None:
    calls = [("hidden", '{"x": 1}'), ("add", '{"a": "not an int"}')]
    replies = [Reply(tool_calls=calls), Reply(content="ok")]
    traj, env = await run_with(server, replies, None)  # default: the loop checks both
    assert env.calls == [] and [e.status for e in traj.events] == ["unknown_tool", "schema_error"]
    policy = CallPolicy(check_names=False, check_arguments=False)
    traj, env = await run_with(server, replies, policy)
    assert env.calls == [("hidden", {"x": 1}), ("add", {"a": "not an int"})]
    assert tool_msgs(traj) == ["ran hidden", "ran add"] and traj.termination == "stop"


@pytest.mark.parametrize("bad", ['{"a": 1,', "[1]", "5", "null"])
async def test_undecodable_step_can_end_the_episode_with_none_of_its_calls_run(
    server: ScriptedServer, bad: str
) -> None:
    replies = [Reply(tool_calls=[("add", '{"a": 1}'), ("add", bad)]), Reply(content="never")]
    traj, env = await run_with(server, replies, CallPolicy(end_on_undecodable=True))
    assert traj.termination == "undecodable" and traj.steps == 1 and env.calls == []
    assert traj.messages[-1]["role"] == "assistant" and len(traj.messages[-1]["tool_calls"]) == 2
    traj, env = await run_with(server, replies, None)  # default: an error result, and go on
    assert env.calls == [("add", {"a": 1})] and traj.final_answer == "never"


async def test_connection_failures_are_told_apart() -> None:
    """Refused, silent and dropped connections each get their own words (the SDK's aiohttp
    transport calls all three a timeout)."""
    from astra_agent.errors import ServerError

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        await asyncio.sleep(3)
        writer.close()

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.close()

    servers = [await asyncio.start_server(h, "127.0.0.1", 0) for h in (silent, drop)]
    ports = [srv.sockets[0].getsockname()[1] for srv in servers]
    cases = [
        (9, "cannot connect", "unreachable"),
        (ports[0], "request timed out", "timeout"),
        (ports[1], "connection failed", "dropped"),
    ]
    try:
        for port, words, kind in cases:
            cfg = ModelConfig(
                base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=0,
                request_timeout_s=0.5,
            )  # fmt: skip
            model = ChatModel(cfg)
            try:
                with pytest.raises(ServerError, match=words) as info:
                    await model.complete([{"role": "user", "content": "hi"}])
                assert getattr(info.value, "kind", None) == kind  # typed, for control flow
            finally:
                await model.close()
    finally:
        for srv in servers:
            srv.close()


def test_truncate_middle_edges() -> None:
    assert truncate_middle("abc", 10) == ("abc", False)
    text, cut = truncate_middle("x" * 500, 200)
    assert cut and len(text) <= 200


async def test_reasoning_of_the_current_loop_is_sent_back_earlier_dropped(
    server: ScriptedServer,
) -> None:
    server.set_script(
        [
            Reply(reasoning="R1", tool_calls=[("add", '{"a": 1, "b": 1}')]),
            Reply(reasoning="R2", content="two"),
            Reply(reasoning="R3", tool_calls=[("add", '{"a": 2, "b": 2}')]),
            Reply(content="four"),
        ]
    )
    model = model_for(server)
    env = make_env()
    traj = await run_episode(model, env, [{"role": "user", "content": "q1"}])
    await run_episode(model, env, [{"role": "user", "content": "q2"}], trajectory=traj)
    await model.close()
    sent = server.requests
    assert sent[1]["messages"][1]["reasoning_content"] == "R1"  # current loop: sent back
    assert sent[1]["messages"][1]["reasoning"] == "R1"  # the field vLLM 0.32 reads
    last = sent[3]["messages"]
    assert [m.get("reasoning_content") for m in last if m["role"] == "assistant"] == [
        None,
        None,
        "R3",
    ]  # earlier turns' reasoning dropped
    assert traj.final_answer == "four" and traj.steps == 4


async def test_reasoning_content_field_of_older_vllm_is_read(server: ScriptedServer) -> None:
    traj = await episode(
        server, [Reply(reasoning="old-style", content="x", reasoning_field="reasoning_content")]
    )
    assert traj.messages[1]["reasoning_content"] == "old-style"


async def test_wrong_model_name_is_a_clear_error(server: ScriptedServer) -> None:
    from astra_agent.errors import ConfigError

    model = ChatModel(ModelConfig(base_url=server.base_url, model="gpt-nope"))
    with pytest.raises(ConfigError, match="not served"):
        await model.check_model()
    await model.close()


def test_recover_tool_calls_unit() -> None:
    rest, calls = recover_tool_calls('a <tool_call>{"name": "f", "arguments": "{}"}</tool_call> b')
    assert rest == "a  b" and calls[0].name == "f" and calls[0].arguments == "{}"
    rest, calls = recover_tool_calls('<tool_call>{"name": "g", "arguments": {"x": 1}}')  # unclosed
    assert calls[0].name == "g" and json.loads(calls[0].arguments) == {"x": 1}
    _, calls = recover_tool_calls('<tool_call>{"name": "g", "arguments": {"x": 1}')  # malformed
    assert calls[0].name == "g" and calls[0].arguments == '{"name": "g", "arguments": {"x": 1}'
    assert recover_tool_calls("plain") == ("plain", [])


async def test_trajectory_jsonl_round_trip_and_renders_with_chat_template(
    server: ScriptedServer, tiny_fp32: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    traj = await episode(
        server,
        [
            Reply(reasoning="plan", tool_calls=[("add", '{"a": 2, "b": 3}'), ("boom", "{}")]),
            Reply(reasoning="final thoughts", content="5"),
        ],
    )
    path = tmp_path / "t.jsonl"
    append_jsonl(path, traj)
    append_jsonl(path, traj)
    back = list(read_jsonl(path))
    assert len(back) == 2 and back[0] == traj
    record = json.loads(path.read_text().splitlines()[0])
    tok = AutoTokenizer.from_pretrained(tiny_fp32)
    text = str(tok.apply_chat_template(record["messages"], tools=record["tools"], tokenize=False))
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in text
    assert '<tool_response>\n{"sum": 5}\n</tool_response>' in text
    assert "<think>\nplan\n</think>" in text and "final thoughts" in text
    assert text.count("<|im_start|>assistant") == 2


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    append_jsonl(path, Trajectory())
    with path.open("a") as f:
        f.write('{"id": "half')
    assert len(list(read_jsonl(path))) == 1


async def test_streaming_gives_the_same_trajectory(server: ScriptedServer) -> None:
    replies = [
        Reply(reasoning="let me think about it", tool_calls=[("add", '{"a": 20, "b": 22}')]),
        Reply(reasoning="done thinking", content="The answer is 42."),
    ]
    plain = await episode(server, replies)
    server.set_script(replies)
    pieces: list[tuple[str, str]] = []
    model = model_for(server)
    streamed = await run_episode(
        model,
        make_env(),
        [{"role": "user", "content": "go"}],
        on_delta=lambda k, t: pieces.append((k, t)),
    )
    await model.close()

    def strip(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in m.items() if k not in ("tool_call_id", "tool_calls")} for m in msgs
        ]

    assert strip(streamed.messages) == strip(plain.messages)
    assert streamed.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 20, "b": 22}'
    assert "".join(t for k, t in pieces if k == "content") == "The answer is 42."
    assert "".join(t for k, t in pieces if k == "reasoning").startswith("let me think")
    assert len(pieces) > 4  # really streamed, in pieces
    assert streamed.usage.prompt_tokens > 0


def test_drop_torn_tail_lets_the_next_append_start_clean(tmp_path: Path) -> None:
    from astra_agent.trajectory import drop_torn_tail

    path = tmp_path / "t.jsonl"
    append_jsonl(path, {"a": 1})
    with path.open("a") as f:
        f.write('{"b": ')
    assert drop_torn_tail(path) == len('{"b": ')
    append_jsonl(path, {"c": 3})
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"a": 1}, {"c": 3}]
    assert drop_torn_tail(path) == 0


class Minimal(Environment):
    """An environment that subclasses the protocol and implements only what it must."""

    closed = False

    async def list_tools(self) -> list[ToolSpec]:
        return [spec("add")]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult("ran")

    async def close(self) -> None:
        self.closed = True


async def test_environments_are_async_context_managers_that_close() -> None:
    async with Minimal() as env:
        assert isinstance(env, Environment) and not env.closed
    assert env.closed
    async with make_env() as fenv:
        assert isinstance(fenv, Environment)
        assert (await fenv.call_tool("add", {"a": 1, "b": 2})).structured == {"sum": 3}


async def test_reset_is_part_of_the_protocol_and_says_when_it_cannot() -> None:
    with pytest.raises(ResetUnsupportedError, match="Minimal cannot reset"):
        await Minimal().reset()
    with pytest.raises(ResetUnsupportedError, match="no reset function"):
        await make_env().reset()

    class Partial:  # the three methods the protocol had before reset and async with
        list_tools = Minimal.list_tools
        call_tool = Minimal.call_tool
        close = Minimal.close

    assert not isinstance(Partial(), Environment)


async def test_function_environment_reset_restores_the_tools_state() -> None:
    counter = {"n": 0}

    def bump() -> int:
        counter["n"] += 1
        return counter["n"]

    async def restore() -> None:
        counter["n"] = 0

    env = FunctionEnvironment([(spec("bump"), bump)], reset=restore)
    assert (await env.call_tool("bump", {})).text == "1"
    assert (await env.call_tool("bump", {})).text == "2"
    await env.reset()
    assert (await env.call_tool("bump", {})).text == "1"
    assert [t.name for t in await env.list_tools()] == ["bump"]  # tools unchanged
