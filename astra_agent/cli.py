"""The ``astra-agent`` CLI (the agent runtime lands with the agent-runtime issue)."""

from astra_agent.console import placeholder_app

app = placeholder_app(
    "astra-agent",
    "run tasks with ASTRA against live MCP servers (run, chat, tools).",
)
