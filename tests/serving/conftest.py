"""Shared helpers for the serving tests: the OpenAI-chat contract every ``astra-serve up``
engine keeps on the scripted tiny checkpoint (a structured tool call, then an answer after the
tool's result; ``astra-serve check --strict`` passes), written once so that vLLM
(test_vllm_integration.py) and the transformers engine (test_hf_server.py) are held to the
same assertions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from serving.endpoint_check import CHECK_MESSAGES, CHECK_TOOL, check_endpoint
from serving.server import ModelServer, free_port, load_serve_config

CALL_ARGS = {"timezone": "UTC"}  # what the scripted checkpoint passes to the check tool


@pytest.fixture(scope="module")
def hf_server(tiny_bf16: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    """``astra-serve up --engine hf``'s server on the scripted tiny checkpoint, per module."""
    log = tmp_path_factory.mktemp("hf") / "hf.log"
    cfg = load_serve_config(
        "tiny-cpu", model=tiny_bf16, port=free_port(), engine="hf", log_file=log,
        max_model_len=1024,
    )  # fmt: skip
    with ModelServer(cfg) as server:
        yield server


def _ask(client: openai.OpenAI, messages: list[Any]) -> Any:
    tools: list[Any] = [CHECK_TOOL]  # plain dicts, as they go on the wire (not the SDK's types)
    return client.chat.completions.create(model="astra-tiny", messages=messages, tools=tools)


def assert_structured_tool_call(client: openai.OpenAI) -> Any:
    """The check request is answered by the scripted reasoning and one structured call of the
    check tool, with no content; returns the completion, for an engine's own checks."""
    r = _ask(client, CHECK_MESSAGES)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    assert choice.message.model_extra["reasoning"] == "Calling the time tool now"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_current_time"
    assert json.loads(call.function.arguments) == CALL_ARGS
    return r


def assert_answer_after_tool_result(client: openai.OpenAI) -> None:
    """After the check tool's result, sent back with the model's call, the model answers (stop,
    the scripted text, no further call)."""
    call = _ask(client, CHECK_MESSAGES).choices[0].message.tool_calls[0]
    msgs = [
        *CHECK_MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "2026-11-30T12:00:00Z"},
    ]
    second = _ask(client, msgs)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "Finished: result above"
    assert not second.choices[0].message.tool_calls


def assert_endpoint_check_passes(base_url: str) -> None:
    """``astra-serve check``'s probes all pass, strict, reasoning in the ``reasoning`` field."""
    report = check_endpoint(base_url)
    assert report.passed(strict=True), report.checks
    assert report.replies["stream"].reasoning_field == "reasoning"
