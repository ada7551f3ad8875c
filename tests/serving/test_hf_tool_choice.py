"""``tool_choice`` on the hf engine (``serving.hf_server``), enforced as vLLM enforces it: ``none``
parses no call, ``required`` and a named tool make the reply hold a call (of that tool), and a
reply that still holds none is a 500 naming ``tool_choice``, never a text reply.

The scripted tiny checkpoint, which thinks and then calls its tool, drives the real path (its
reasoning generated up to ``</think>``, then the call opened for it). What a real model may
write after the opening (a call of the named tool, a malformed one, one of a tool not offered,
a reply cut short) is played by a generator double answering scripted text, so that each case
is exact; the rendering, prompts and parsing around it are the server's own. The same cases
against vLLM are in test_chat_contract.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from serving.chat_request import RequestError, parse_chat_request
from serving.endpoint_check import CHECK_MESSAGES, CHECK_TOOL
from serving.hf_server import ChatResponder, make_app
from serving.sampling import Sample, Sampling

MODEL = "astra-tiny"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TOOLS = [CHECK_TOOL, WEATHER]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
SCRIPTED_ARGS = {"timezone": "UTC"}  # what the scripted checkpoint passes to its tool


@pytest.fixture(scope="module")
def responder(tiny_bf16: Path) -> ChatResponder:
    return ChatResponder(tiny_bf16, device="cpu", max_model_len=1024)


@pytest.fixture
async def client(responder: ChatResponder) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(make_app(responder, MODEL))) as c:
        yield c


def _request(**fields: Any) -> Any:
    return parse_chat_request(
        {"messages": CHECK_MESSAGES, "tools": TOOLS, "temperature": 0, **fields}
    )


class Scripted:
    """A generator double: each call answers the next of ``texts`` (its tokens, cut at the
    call's ``max_tokens``; "stop" where it ends in one of the call's stop tokens), and records
    the prompt and sampling it was given."""

    def __init__(self, tokenizer: Any, *texts: str) -> None:
        self.tokenizer, self.texts = tokenizer, list(texts)
        self.calls: list[tuple[list[int], Sampling]] = []

    async def generate(self, ids: list[int], sampling: Sampling) -> Sample:
        self.calls.append((list(ids), sampling))
        tokens = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)
        tokens = tokens[: sampling.max_tokens]
        stopped = bool(tokens) and tokens[-1] in sampling.stop_token_ids
        return Sample(tokens, [0.0] * len(tokens), "stop" if stopped else "length")

    def prompt_text(self, call: int) -> str:
        return str(self.tokenizer.decode(self.calls[call][0], skip_special_tokens=False))


@pytest.fixture
def scripted(responder: ChatResponder, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``scripted("text", …)``: the responder's model answers these texts, one a generation."""

    def install(*texts: str) -> Scripted:
        double = Scripted(responder.tokenizer, *texts)
        monkeypatch.setattr(responder, "generator", double)
        return double

    return install


# ------------------------------------------------------------------ the scripted checkpoint


async def test_none_parses_no_call_and_leaves_the_text_in_the_content(
    responder: ChatResponder,
) -> None:
    """The tools stay in the prompt (vLLM's default); the call the model writes is content."""
    reply = await responder.answer(_request(tool_choice="none"))
    assert reply.tool_calls == [] and reply.finish_reason is None
    assert reply.reasoning == "Calling the time tool now"
    assert reply.content is not None and reply.content.startswith("<tool_call>")
    assert json.loads(reply.content.removeprefix("<tool_call>").removesuffix("</tool_call>")) == {
        "name": "get_current_time",
        "arguments": SCRIPTED_ARGS,
    }
    auto = await responder.answer(_request())
    assert auto.tool_calls == [("get_current_time", json.dumps(SCRIPTED_ARGS))]


async def test_required_opens_a_call_after_the_reasoning(
    responder: ChatResponder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model thinks first (its generation stops at ``</think>``), then the reply is made to
    open a call, which the model completes: one call of the tool, the reasoning kept."""
    seen: list[tuple[list[int], Sampling, Sample]] = []
    generate = responder.generator.generate

    async def spy(ids: list[int], sampling: Sampling) -> Sample:
        sample = await generate(ids, sampling)
        seen.append((list(ids), sampling, sample))
        return sample

    monkeypatch.setattr(responder.generator, "generate", spy)
    reply = await responder.answer(_request(tool_choice="required", max_tokens=200))
    assert reply.tool_calls == [("get_current_time", json.dumps(SCRIPTED_ARGS))]
    assert reply.reasoning == "Calling the time tool now" and reply.content is None
    assert reply.finish_reason is None  # "tool_calls" on the wire, as vLLM says for required
    (first, thinking, _), (second, calling, rest) = seen
    assert responder.think_end in thinking.stop_token_ids
    assert responder.tokenizer.decode(second[len(first) :]).endswith("</think><tool_call>")
    opened = len(second) - len(first)  # the reasoning and the opening: the reply's, counted
    assert calling.max_tokens == 200 - opened
    assert reply.completion_tokens == opened + len(rest.token_ids)


async def test_required_over_http_is_a_call_with_finish_reason_tool_calls(
    client: TestClient[Any, Any],
) -> None:
    body = {"model": MODEL, "messages": CHECK_MESSAGES, "tools": TOOLS, "tool_choice": "required"}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status == 200, await r.text()
    choice = (await r.json())["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_current_time"
    assert json.loads(call["function"]["arguments"]) == SCRIPTED_ARGS


# ------------------------------------------------------------------ a model's possible replies


async def test_a_named_tool_is_called_with_what_the_model_writes_after_the_opening(
    responder: ChatResponder, scripted: Any
) -> None:
    """The opening names the tool, in the template's call format; the model writes the
    arguments. A second call after it is dropped (vLLM's named choice returns one); the
    finish reason is vLLM's for a named tool, "stop"."""
    double = scripted(
        "<think>\nThe weather, then.\n</think>",
        '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_current_time", '
        '"arguments": {}}\n</tool_call><|im_end|>',
    )
    reply = await responder.answer(_request(tool_choice=NAMED))
    assert reply.tool_calls == [("get_weather", '{"city": "Paris"}')]
    assert reply.reasoning == "The weather, then." and reply.finish_reason == "stop"
    assert double.prompt_text(1).endswith(
        '</think><tool_call>\n{"name": "get_weather", "arguments": '
    )


async def test_where_thinking_is_off_the_call_is_opened_at_once(
    responder: ChatResponder, scripted: Any
) -> None:
    """``enable_thinking: false`` closes an empty think block in the prompt: one generation,
    from the opening."""
    double = scripted('{"city": "Oslo"}}\n</tool_call><|im_end|>')
    reply = await responder.answer(
        _request(tool_choice=NAMED, chat_template_kwargs={"enable_thinking": False})
    )
    assert reply.tool_calls == [("get_weather", '{"city": "Oslo"}')] and not reply.reasoning
    assert len(double.calls) == 1
    assert double.prompt_text(0).endswith(
        '<think>\n\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
    )


HM = "<think>\nHm.\n</think>"
END = "</tool_call><|im_end|>"
UNMET = [
    pytest.param(
        "required", ["<think>\nNo tool for this.<|im_end|>"], "no tool call", id="ends-in-reasoning"
    ),
    pytest.param("required", [HM, "I would rather not.<|im_end|>"], "a malformed call", id="prose"),
    pytest.param(
        "required",
        [HM, '\n{"name": "get_weather", "arguments": {"city": ' + END],
        "a malformed call",
        id="malformed",
    ),
    pytest.param(
        "required",
        [HM, '\n{"name": "send_money", "arguments": {}}' + END],
        "a call of 'send_money', a tool not offered",
        id="not-offered",
    ),
    pytest.param(
        "required",
        [HM, '\n{"name": "get_weather", "arguments": [1]}' + END],
        "a call of 'get_weather' whose arguments are not a JSON object",
        id="arguments-a-list",
    ),
    pytest.param(NAMED, [HM, "Paris}" + END], "a malformed call", id="named-malformed"),
]


@pytest.mark.parametrize(("choice", "written", "why"), UNMET)
async def test_a_reply_without_a_proper_call_is_a_500_naming_tool_choice(
    client: TestClient[Any, Any],
    scripted: Any,
    caplog: pytest.LogCaptureFixture,
    choice: Any,
    written: list[str],
    why: str,
) -> None:
    """Never a silent text reply: the server says it could not honour ``tool_choice`` (the
    server's fault, not the client's), logs it once, and serves on."""
    scripted(*written)
    body = {"model": MODEL, "messages": CHECK_MESSAGES, "tools": TOOLS, "tool_choice": choice}
    with caplog.at_level(logging.WARNING, "serving.hf_server"):
        r = await client.post("/v1/chat/completions", json=body)
    assert r.status == 500
    error = (await r.json())["error"]
    assert error["type"] == "InternalServerError" and error["param"] == "tool_choice"
    shown = "required" if choice == "required" else "the function 'get_weather'"
    assert error["message"].startswith(
        f"tool_choice {shown} asks for a tool call, but the model's reply holds {why} "
    )
    assert [rec.levelno for rec in caplog.records] == [logging.WARNING]
    scripted(HM, '\n{"name": "get_weather", "arguments": {}}' + END)
    r = await client.post("/v1/chat/completions", json={**body, "tool_choice": "required"})
    assert r.status == 200
    (call,) = (await r.json())["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"


async def test_a_reply_cut_by_max_tokens_comes_back_as_it_is(
    responder: ChatResponder, scripted: Any
) -> None:
    """As vLLM returns it: ``finish_reason: length``, no error (the client sees why)."""
    scripted("<think>\nLet me think about the weather in every city of")
    reply = await responder.answer(_request(tool_choice="required", max_tokens=8))
    assert reply.finish_reason == "length" and reply.tool_calls == []
    assert reply.completion_tokens == 8
    double = scripted("<think>\nOk.\n</think>", '{"city": "Rome", "unit": "celsius", "more": 1}')
    cut = await responder.answer(_request(tool_choice=NAMED, max_tokens=30))
    assert cut.finish_reason == "length" and cut.completion_tokens == 30
    # the call it cut short is no call (a client would fail on its arguments): it is text
    assert cut.tool_calls == [] and cut.content and cut.content.startswith("<tool_call>"), cut
    assert double.calls[1][1].max_tokens == 30 - (len(double.calls[1][0]) - len(double.calls[0][0]))


def test_a_named_tool_not_offered_is_still_refused_before_generating() -> None:
    with pytest.raises(RequestError, match="does not match any of the specified `tools`"):
        _request(tool_choice={"type": "function", "function": {"name": "nope"}})
