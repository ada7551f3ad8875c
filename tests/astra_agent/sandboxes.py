"""Helpers shared by the sandbox test suites (test_sandbox, test_sandbox_attacks)."""

from __future__ import annotations

from astra_agent.sandbox import Sandbox, SandboxReply


async def next_call_survives(sb: Sandbox, first: str) -> SandboxReply:
    """Call the tool ``first``, then the sandbox's ``slow`` tool (it sleeps, then returns
    'survived'): whatever ``first`` left behind must not break that next call. Returns
    ``first``'s reply."""
    left = await sb.call(first, {})
    r = await sb.call("slow", {})
    assert r.ok and r.value == "survived", r
    return left
