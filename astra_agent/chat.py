"""The interactive ``astra-agent chat`` loop: streaming output, compact tool calls.

One conversation is one :class:`~astra_agent.trajectory.Trajectory` that each line typed
extends (:func:`~astra_agent.episode.run_episode` with ``trajectory=``); the servers and the
config come from :mod:`astra_agent.agent`, as for ``astra-agent run``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rich.markup import escape

from astra_agent.agent import AgentConfig, open_environment, task_messages
from astra_agent.console import console, err_console
from astra_agent.episode import run_episode
from astra_agent.mcp_config import MCPConfig
from astra_agent.mcp_env import MCPEnvironment
from astra_agent.model import ChatModel
from astra_agent.trajectory import Trajectory, append_jsonl

HELP = "commands: /reasoning (show/hide thinking), /reset (new conversation), /exit"


class _Printer:
    """Streams reasoning (dim, when shown) and content as they arrive."""

    def __init__(self, show_reasoning: bool) -> None:
        self.show_reasoning = show_reasoning
        self.kind: str | None = None

    def delta(self, kind: str, text: str) -> None:
        if kind == "reasoning" and not self.show_reasoning:
            return
        if kind != self.kind:
            console.print()
            self.kind = kind
        console.print(
            escape(text), end="", style="dim" if kind == "reasoning" else None, highlight=False
        )

    def turn(self, turn: Any) -> None:
        if self.kind:
            console.print()
            self.kind = None
        for c in turn.tool_calls:
            console.print(f"[cyan]→ {escape(c.name)}[/]({escape(c.arguments[:200])})")

    def result(self, call: Any, result: Any) -> None:
        style = "red" if result.is_error else "green"
        text = result.text.replace("\n", " ")
        console.print(f"[{style}]← {escape(text[:160])}{'…' if len(text) > 160 else ''}[/]")


async def chat_loop(
    cfg: AgentConfig,
    mcp: MCPConfig,
    save: Path | None,
    show_reasoning: bool,
) -> None:
    """Chat until /exit or end of input; with ``save``, each conversation is appended there
    when it ends (/reset, /exit, an error)."""
    async with ChatModel(cfg.model) as model:  # checks the endpoint; closes it in any case
        env = await open_environment(mcp, cfg)
        try:
            await _converse(model, env, cfg, save, _Printer(show_reasoning))
        finally:
            await env.close()


async def _converse(
    model: ChatModel,
    env: MCPEnvironment,
    cfg: AgentConfig,
    save: Path | None,
    printer: _Printer,
) -> None:
    n_tools = len(await env.list_tools())
    name = model.name
    err_console.print(f"chatting with {name} ({n_tools} tools). {HELP}")
    traj: Trajectory | None = None
    try:
        while True:
            try:
                line = await asyncio.to_thread(input, "\nyou> ")
            except EOFError:
                break
            text = line.strip()
            if not text:
                continue
            if text in ("/exit", "/quit"):
                break
            if text == "/reasoning":
                printer.show_reasoning = not printer.show_reasoning
                err_console.print(f"reasoning {'shown' if printer.show_reasoning else 'hidden'}")
                continue
            if text == "/reset":
                if traj and save:
                    append_jsonl(save, traj)
                traj = None
                err_console.print("new conversation")
                continue
            # A new conversation opens with the system prompt; a running one takes the line.
            msgs = task_messages(cfg, text) if traj is None else [{"role": "user", "content": text}]
            traj = await run_episode(
                model,
                env,
                msgs,
                limits=cfg.limits,
                trajectory=traj,
                on_turn=printer.turn,
                on_result=printer.result,
                on_delta=printer.delta,
            )
            traj.model = name
            if traj.termination not in ("stop",):
                err_console.print(f"[yellow]({traj.termination}: {traj.termination_detail})[/]")
    finally:
        if traj and save:
            append_jsonl(save, traj)
