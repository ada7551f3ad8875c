"""`astra-agent` as a user runs it: a subprocess against the scripted server and real MCP."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from astra_agent.testing.scripted_server import Reply, ScriptedServer
from astra_agent.trajectory import read_jsonl

pytestmark = pytest.mark.integration
FIXTURE = {"command": sys.executable, "args": ["-m", "astra_agent.testing.mcp_fixture"]}


def echo_then_answer(req: dict[str, Any]) -> Reply:
    last = req["messages"][-1]
    if last["role"] == "tool":
        return Reply(reasoning="got it", content=f"final: {last['content']}")
    return Reply(reasoning="I should echo", tool_calls=[("echo", json.dumps({"text": "ping"}))])


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer(echo_then_answer) as srv:
        yield srv


@pytest.fixture
def config(tmp_path: Path) -> Path:
    p = tmp_path / "mcp.json"
    p.write_text(json.dumps({"mcpServers": {"fx": FIXTURE}, "system": "Be terse."}))
    return p


def agent(*args: str, stdin: str | None = None, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "astra_agent", *args],
        capture_output=True, text=True, timeout=120, input=stdin,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )  # fmt: skip


def test_help_shows_examples() -> None:
    out = agent("--help")
    assert out.returncode == 0 and "Example" in out.stdout
    for cmd in ("run", "chat", "tools"):
        sub = agent(cmd, "--help")
        assert sub.returncode == 0 and "Example" in sub.stdout, cmd


def test_run_prints_answer_summary_and_saves(server: ScriptedServer, config: Path,
                                             tmp_path: Path) -> None:  # fmt: skip
    save = tmp_path / "runs.jsonl"
    args = ["run", "say ping", "--config", str(config), "--base-url", server.base_url]
    out = agent(*args, "--save", str(save))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "final: ping"
    assert "termination  stop" in out.stderr and "1 (ok=1)" in out.stderr
    assert "→ echo" in out.stderr and "← ping" in out.stderr
    agent(*args, "--save", str(save))
    records = list(read_jsonl(save))
    assert len(records) == 2 and records[0].model == "scripted"
    assert records[0].messages[0] == {"role": "system", "content": "Be terse."}
    sent = server.requests[0]
    assert sent["temperature"] == 0.6 and sent["top_p"] == 0.95 and sent["top_k"] == 20


def test_run_json(server: ScriptedServer, config: Path) -> None:
    out = agent("run", "x", "-c", str(config), "--base-url", server.base_url, "--json")
    assert out.returncode == 0, out.stderr
    traj = json.loads(out.stdout)
    assert traj["termination"] == "stop" and traj["events"][0]["name"] == "echo"


def test_environment_variables_configure_the_endpoint(server: ScriptedServer, config: Path) -> None:
    out = agent("run", "x", "-c", str(config), env={"ASTRA_BASE_URL": server.base_url,
                                                     "ASTRA_MODEL": "scripted"})  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "final: ping"


def test_tools_lists_origins(config: Path) -> None:
    out = agent("tools", "--config", str(config))
    assert out.returncode == 0, out.stderr
    assert "echo" in out.stdout and "fx" in out.stdout and "dotted.name" in out.stdout


def test_chat_streams_and_keeps_the_conversation(server: ScriptedServer, config: Path,
                                                 tmp_path: Path) -> None:  # fmt: skip
    save = tmp_path / "chat.jsonl"
    out = agent("chat", "-c", str(config), "--base-url", server.base_url, "--save", str(save),
                "--show-reasoning", stdin="first\n/reasoning\nsecond\n/exit\n")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("final: ping") == 2
    assert "I should echo" in out.stdout and "→ echo" in out.stdout
    (traj,) = read_jsonl(save)
    assert [m["content"] for m in traj.messages if m["role"] == "user"] == ["first", "second"]
    assert server.requests[-1]["stream"] is True


@pytest.mark.parametrize(
    "args,code,needle",
    [
        (["--base-url", "http://127.0.0.1:9/v1"], 1, "cannot connect"),
        (["--model", "nope"], 2, "not served"),
    ],
)
def test_endpoint_errors(server: ScriptedServer, config: Path, args: list[str], code: int,
                         needle: str) -> None:  # fmt: skip
    base = [] if "--base-url" in args else ["--base-url", server.base_url]
    out = agent(
        "run", "x", "-c", str(config), *base, *args, env={"ASTRA_AGENT_MODEL__MAX_RETRIES": "0"}
    )
    assert out.returncode == code, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr


def test_bad_config_is_a_usage_error(tmp_path: Path, server: ScriptedServer) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"mcpServers": {"x": {"args": []}}}')
    out = agent("run", "x", "-c", str(bad), "--base-url", server.base_url)
    assert out.returncode == 2 and "needs either 'command'" in out.stderr
    out = agent("run", "x", "-c", str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "not found" in out.stderr


def flat(text: str) -> str:
    """Rich wraps at the terminal's width: compare words, not line breaks."""
    return " ".join(text.split())


def test_version() -> None:
    out = agent("--version")
    assert out.returncode == 0 and out.stdout.startswith("astra-agent ")


def test_astra_base_url_is_honoured(config: Path) -> None:
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    env = {"ASTRA_BASE_URL": url, "ASTRA_AGENT_MODEL__MAX_RETRIES": "0"}
    out = agent("run", "x", "-c", str(config), env=env)
    assert out.returncode == 1 and url in flat(out.stderr), out.stderr


def test_unknown_config_keys_are_warned_about_by_name(tmp_path: Path) -> None:
    cfg = tmp_path / "claude_desktop_config.json"
    cfg.write_text(
        json.dumps(
            {
                "mcpServers": {"fx": FIXTURE},
                "modle": {},
                "globalShortcut": "Ctrl+Space",
                "inputs": [],
                "toolTimout": 3,
            }
        )
    )
    out = agent("tools", "-c", str(cfg))
    assert out.returncode == 0, out.stderr
    err = flat(out.stderr)
    assert "unknown key 'modle' (did you mean 'model'?)" in err
    assert "unknown key 'toolTimout' (did you mean 'toolTimeout'?)" in err
    assert "globalShortcut" not in err and "inputs" not in err


@pytest.mark.parametrize(
    "data,needle",
    [
        (b'{"mcpServers": {"x": {"command": "caf\xe9"}}}', "is not UTF-8 text"),
        (bytes(range(256)), "is not UTF-8 text"),
    ],
)
def test_undecodable_config_is_one_line(tmp_path: Path, data: bytes, needle: str) -> None:
    bad = tmp_path / "mcp.json"
    bad.write_bytes(data)
    out = agent("run", "x", "-c", str(bad))
    assert out.returncode == 2 and needle in flat(out.stderr), out.stderr
    assert "Traceback" not in out.stderr


def _read_only(path: Path) -> list[str]:
    """A command prefix that mounts ``path`` read-only (bubblewrap: holds for root too)."""
    if shutil.which("bwrap") is None:
        pytest.skip("no bubblewrap")
    return ["bwrap", "--bind", "/", "/", "--ro-bind", str(path), str(path), "--dev", "/dev",
            "--proc", "/proc"]  # fmt: skip


def test_unwritable_save_fails_before_the_episode(
    server: ScriptedServer, config: Path, tmp_path: Path
) -> None:
    (tmp_path / "afile").write_text("x")
    ro = tmp_path / "ro"
    ro.mkdir()
    for save, needle in [
        (tmp_path / "afile" / "runs.jsonl", "afile is not a directory"),
        (ro / "runs.jsonl", "is not writable (Read-only file system)"),
    ]:
        prefix = _read_only(ro) if save.parent == ro else []
        out = subprocess.run(
            [*prefix, sys.executable, "-m", "astra_agent", "run", "x", "-c", str(config),
             "--base-url", server.base_url, "--save", str(save)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        assert out.returncode == 2 and needle in flat(out.stderr), out.stderr
        assert "Traceback" not in out.stderr
    assert server.requests == []  # checked before the model was asked anything
