"""``serving.hf_server`` in this process (the scripted tiny checkpoint behind aiohttp's test
server): the request's template variables, a request's own template, a server fault, and the
bodies and routes the contract table (test_chat_contract.py) does not cover."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from serving.chat_request import RequestError, parse_chat_request
from serving.hf_server import ChatResponder, make_app

MODEL = "astra-tiny"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def responder(tiny_bf16: Path) -> ChatResponder:
    return ChatResponder(tiny_bf16, device="cpu", max_model_len=1024)


@pytest.fixture
async def client(responder: ChatResponder) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(make_app(responder, MODEL))) as c:
        yield c


def _ids(responder: ChatResponder, **fields: Any) -> list[int]:
    return responder.render(parse_chat_request({"messages": HI, **fields}))


def test_only_the_templates_own_variables_are_passed(responder: ChatResponder) -> None:
    plain = _ids(responder)
    foreign = {"truncation": True, "max_length": 2, "tokenize": False, "padding": "max_length"}
    assert _ids(responder, chat_template_kwargs=foreign) == plain  # ignored, as vLLM does
    no_thinking = _ids(responder, chat_template_kwargs={"enable_thinking": False})
    assert len(no_thinking) > len(plain)  # the template's own variable: an empty think block


def test_a_request_template_is_refused_unless_the_server_trusts_it(
    responder: ChatResponder, tiny_bf16: Path
) -> None:
    template = "{{ 'hello' }}"
    for fields, param in (
        ({"chat_template": template}, "chat_template"),
        (
            {"chat_template_kwargs": {"chat_template": template}},
            "chat_template_kwargs.chat_template",
        ),
    ):
        with pytest.raises(RequestError, match="--trust-request-chat-template") as err:
            _ids(responder, **fields)
        assert err.value.param == param and err.value.status == 400
    trusting = ChatResponder(tiny_bf16, device="cpu", trust_request_template=True)
    hello = trusting.tokenizer.encode("hello", add_special_tokens=False)
    assert _ids(trusting, chat_template=template) == hello


async def test_a_server_fault_is_a_500_logged_once_and_the_server_serves_on(
    client: TestClient[Any, Any],
    responder: ChatResponder,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(*_: Any) -> Any:
        raise RuntimeError("the device fell over")

    body = {"model": MODEL, "messages": HI, "max_tokens": 2}
    with monkeypatch.context() as m, caplog.at_level(logging.ERROR, "serving.hf_server"):
        m.setattr(responder.generator, "generate", broken)
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status == 500
        error = (await r.json())["error"]
        assert error["type"] == "InternalServerError" and "fell over" in error["message"]
    assert [rec.message for rec in caplog.records].count(
        "server error answering POST /v1/chat/completions"
    ) == 1
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(
    ("method", "path", "data", "status", "names"),
    [
        ("POST", "/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000, 400, "nested"),
        ("POST", "/v1/chat/completions", b"", 400, "not valid JSON"),
        ("POST", "/v1/chat/completions", b'"a string"', 400, "JSON object"),
        ("GET", "/v1/chat/completions", None, 405, "Method Not Allowed"),
        ("GET", "/v2/nothing", None, 404, "Not Found"),
    ],
)
async def test_bodies_and_routes_beyond_the_table(
    client: TestClient[Any, Any], method: str, path: str, data: bytes, status: int, names: str
) -> None:
    r = await client.request(method, path, data=data)
    assert r.status == status
    error = (await r.json())["error"]
    assert error["code"] == status and names in error["message"], error


async def test_a_stream_carries_the_reply_and_ends_with_done(
    client: TestClient[Any, Any],
) -> None:
    body = {"model": MODEL, "messages": HI, "max_tokens": 3, "stream": True}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in (await r.text()).split("\n\n") if line]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 3


def test_dtype_auto_follows_the_cpu(tiny_bf16: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 checkpoint on a CPU that would emulate bf16 loads in float32 (as `astra-serve
    up`'s dtype auto serves it); where the CPU computes bf16, the checkpoint's own dtype."""
    import torch

    import serving.hf_server as hf_server

    monkeypatch.setattr(hf_server, "bf16_missing", lambda: "no avx512_bf16 (a test's CPU)")
    emulated = ChatResponder(tiny_bf16, device="cpu", max_model_len=256)
    assert next(emulated.model.parameters()).dtype == torch.float32
    monkeypatch.setattr(hf_server, "bf16_missing", lambda: None)
    computed = ChatResponder(tiny_bf16, device="cpu", max_model_len=256)
    assert next(computed.model.parameters()).dtype == torch.bfloat16
    pinned = ChatResponder(tiny_bf16, device="cpu", dtype="bfloat16", max_model_len=256)
    assert next(pinned.model.parameters()).dtype == torch.bfloat16
