"""``astra-serve up --engine hf``: the harness's transformers server keeps vLLM's contract (the
same assertions as tests/serving/test_vllm_integration.py, the same endpoint check), on the
scripted tiny checkpoint and on the real model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from serving.endpoint_check import CHECK_MESSAGES, check_endpoint
from serving.server import ModelServer, free_port, load_serve_config
from tests.conftest import REPO, from_a_terminal
from tests.serving.conftest import (
    assert_answer_after_tool_result,
    assert_endpoint_check_passes,
    assert_structured_tool_call,
)

pytestmark = pytest.mark.integration


def _client(server: ModelServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0)


def test_chat_returns_structured_tool_call_and_reasoning(hf_server: ModelServer) -> None:
    r = assert_structured_tool_call(_client(hf_server))
    assert r.usage.prompt_tokens > 50 and r.usage.completion_tokens > 5


def test_after_a_tool_response_the_model_answers(hf_server: ModelServer) -> None:
    assert_answer_after_tool_result(_client(hf_server))


def test_endpoint_check_passes_strict(hf_server: ModelServer) -> None:
    assert_endpoint_check_passes(hf_server.base_url)


def test_bad_requests_are_400s_and_the_server_lives_on(hf_server: ModelServer) -> None:
    client = _client(hf_server)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 1024"):
        client.chat.completions.create(
            model="astra-tiny", messages=[{"role": "user", "content": "word " * 2000}]
        )
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model="astra-tiny", messages=CHECK_MESSAGES, max_tokens=5000)
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.chat.completions.create(model="astra-tiny", messages=CHECK_MESSAGES, top_p=0)
    r = httpx.post(f"{hf_server.base_url}/chat/completions", json={"model": "astra-tiny"})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=CHECK_MESSAGES)
    assert check_endpoint(hf_server.base_url).passed(strict=True)


def _wait_healthy(proc: subprocess.Popen[bytes], base: str, log: Path) -> None:
    deadline = time.monotonic() + 180  # a bound on a hang, not a speed: machines get busy
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.5)


@pytest.mark.parametrize("trusted", [False, True], ids=["default", "trusted"])
def test_up_renders_a_request_template_only_with_the_trust_flag(
    tiny_bf16: Path, tmp_path: Path, trusted: bool
) -> None:
    """``astra-serve up --engine hf [--trust-request-chat-template]`` as a user runs it: a
    request's own ``chat_template`` is a 400 naming the flag by default, and is the prompt with
    the flag."""
    from transformers import AutoTokenizer

    port, log = free_port(), tmp_path / "up.log"
    args = ["up", "--model", str(tiny_bf16), "--engine", "hf", "--port", str(port)]
    args += ["--max-model-len", "1024"] + (["--trust-request-chat-template"] if trusted else [])
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "serving", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "ASTRA_HOME": str(tmp_path / "home")},
            preexec_fn=from_a_terminal,
        )
    body = {"model": "astra-tiny", "messages": [{"role": "user", "content": "hi"}]}
    body |= {"max_tokens": 2, "chat_template": "{{ 'hello there' }}"}
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}", log)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()
    if not trusted:
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "chat_template"
        assert "--trust-request-chat-template" in error["message"]
        return
    assert r.status_code == 200, r.text
    hello = AutoTokenizer.from_pretrained(str(tiny_bf16)).encode("hello there")
    assert r.json()["usage"]["prompt_tokens"] == len(hello)  # the request's template, rendered


def test_the_hf_engine_refuses_to_serve_beyond_loopback(tiny_bf16: Path) -> None:
    from astra_agent.errors import ConfigError

    for over in ({"api_key": "k"}, {"host": "0.0.0.0", "api_key": "k"}):
        server = ModelServer(load_serve_config("tiny-cpu", model=tiny_bf16, engine="hf", **over))
        with pytest.raises(ConfigError, match="loopback without authentication"):
            server.preflight()


def test_the_real_model_answers_in_content(smollm2_bf16: Path, tmp_path: Path) -> None:
    """SmolLM2 under its non-thinking profile: the answer is content, nothing in reasoning."""
    cfg = load_serve_config("instruct-cpu", model=smollm2_bf16, port=free_port(), engine="hf",
                            log_file=tmp_path / "hf.log")  # fmt: skip
    with ModelServer(cfg) as server:
        r = _client(server).chat.completions.create(
            model="smollm2-135m", temperature=0, max_tokens=30,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )  # fmt: skip
    msg = r.choices[0].message
    assert "Paris" in (msg.content or ""), msg
    assert not (msg.model_extra or {}).get("reasoning")
