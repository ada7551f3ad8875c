"""The agent as a library (`astra_agent.agent`): what `astra-agent run` does, called from Python,
and the import direction (the CLI imports the library; the library never imports the CLI)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import astra_agent
from astra_agent.agent import (
    AgentConfig,
    load_agent_config,
    open_environment,
    run_task,
    task_messages,
    warn_on_stderr,
)
from astra_agent.errors import ConfigError
from astra_agent.testing.scripted_server import ScriptedServer
from tests.astra_agent.test_cli import FIXTURE, echo_then_answer

PACKAGE = Path(astra_agent.__file__).parent


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer(echo_then_answer) as srv:
        yield srv


def write_config(tmp_path: Path, **extra: Any) -> Path:
    p = tmp_path / "mcp.json"
    p.write_text(json.dumps({"mcpServers": {"fx": FIXTURE}, **extra}), encoding="utf-8")
    return p


@pytest.mark.integration
async def test_run_task_from_python(server: ScriptedServer, tmp_path: Path) -> None:
    warnings: list[str] = []
    cfg, mcp = load_agent_config(
        write_config(tmp_path, system="Be terse."),
        model={"base_url": server.base_url},
        max_steps=3,
        warn=warnings.append,
    )
    turns: list[Any] = []
    results: list[tuple[str, str]] = []
    traj = await run_task(
        cfg,
        mcp,
        "say ping — 東京 ✓",
        on_turn=turns.append,
        on_result=lambda call, result: results.append((call.name, result.text)),
        warn=warnings.append,
    )
    assert traj.termination == "stop" and traj.final_answer == "final: ping"
    assert traj.model == "scripted" and traj.steps == 2
    assert traj.messages[:2] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "say ping — 東京 ✓"},
    ]
    assert [t.tool_calls[0].name for t in turns if t.tool_calls] == ["echo"]
    assert results == [("echo", "ping")] and warnings == []


def test_config_file_then_arguments(tmp_path: Path) -> None:
    path = write_config(tmp_path, model={"temperature": 0.1, "top_k": 5}, toolTimeout=7)
    cfg, mcp = load_agent_config(path, model={"temperature": 0.3}, max_steps=4, system="S")
    assert isinstance(cfg, AgentConfig) and list(mcp.servers) == ["fx"]
    assert (cfg.model.temperature, cfg.model.top_k) == (0.3, 5)  # the argument wins, per field
    assert cfg.limits.max_steps == 4 and cfg.system == "S" and cfg.tool_timeout_s == 7
    # The episode's guard sits above the servers' own timeout.
    assert cfg.limits.tool_timeout_s == 12
    assert task_messages(cfg, "q") == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "q"},
    ]


def test_no_file_is_no_servers_and_defaults() -> None:
    cfg, mcp = load_agent_config(None)
    assert mcp.servers == {} and cfg.limits.max_steps == 20 and cfg.system is None
    assert task_messages(cfg, "q") == [{"role": "user", "content": "q"}]


def test_unknown_keys_go_to_warn_other_clients_keys_do_not(tmp_path: Path) -> None:
    path = write_config(tmp_path, sytem="typo", theme="dark", servers={}, **{"$schema": "x"})
    warnings: list[str] = []
    load_agent_config(path, warn=warnings.append)
    assert len(warnings) == 1 and "sytem" in warnings[0] and str(path) in warnings[0]


def test_bad_values_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_agent_config(write_config(tmp_path, toolTimeout=-1))
    with pytest.raises(ConfigError):
        load_agent_config(None, model={"base_url": "ftp://nowhere"})


@pytest.mark.integration
async def test_a_server_that_fails_is_passed_to_warn(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    raw = json.loads(path.read_text())
    raw["mcpServers"]["broken"] = {"command": str(tmp_path / "no-such-program")}
    path.write_text(json.dumps(raw))
    cfg, mcp = load_agent_config(path)
    warnings: list[str] = []
    env = await open_environment(mcp, cfg, warn=warnings.append)
    try:
        assert {t.name for t in await env.list_tools()} >= {"echo"}
    finally:
        await env.close()
    assert len(warnings) == 1 and warnings[0].startswith("MCP server 'broken' is unavailable: ")


def test_warnings_on_stderr_are_literal_text(capsys: pytest.CaptureFixture[str]) -> None:
    """A server's name or words may hold brackets: printed as they are, not as rich markup."""
    warn_on_stderr("MCP server '[bold]x[/]' is unavailable: café [red]boom")
    err = capsys.readouterr().err
    assert err.strip() == "warning: MCP server '[bold]x[/]' is unavailable: café [red]boom"


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_nothing_in_the_library_imports_the_cli() -> None:
    importers = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name not in ("cli.py", "__main__.py") and "astra_agent.cli" in _imported_modules(p)
    )
    assert importers == []


def test_the_library_loads_without_the_cli_stack() -> None:
    """`import astra_agent` (every sandbox worker, eval and training process) loads neither
    typer nor rich: they come with the CLI."""
    code = "import sys, astra_agent; print(sorted({'typer', 'rich'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"
