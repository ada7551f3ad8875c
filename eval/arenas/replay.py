"""A scripted model that replays each task's reference chain (for tests and benchmarks).

Served by :class:`astra_agent.testing.scripted_server.ScriptedServer`: the task is found by its
prompt; the k-th tool message since that prompt means the reference's call k+1 is next; after
the last one the model answers. Reference calls that share a ``step`` (a parallel task's) are
made in one reply. A task whose reference is empty (no offered function serves it) is
answered without a call, saying so. A fake model, named as such.
"""

from __future__ import annotations

import json
from typing import Any

from astra_agent.arena import ArenaTask
from astra_agent.testing.scripted_server import Reply, Script


def replay_script(tasks: list[ArenaTask], *, reasoning: bool = True) -> Script:
    """The script; with ``reasoning`` off its replies carry no reasoning (a model that does
    not think is trained on them)."""
    by_prompt = {t.prompt[-1]["content"]: t for t in tasks if t.reference is not None}

    def script(req: dict[str, Any]) -> Reply:
        msgs = req["messages"]
        users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
        task = by_prompt.get(msgs[users[-1]]["content"]) if users else None
        if task is None:
            return Reply(content="I do not know this task.")
        done = sum(1 for m in msgs[users[-1] :] if m["role"] == "tool")
        ref = task.reference or []
        if not ref:
            return Reply(
                reasoning="No offered function serves this request." if reasoning else None,
                content=DECLINE,
            )
        if done >= len(ref):
            return Reply(
                reasoning="All sub-questions answered." if reasoning else None, content="Done."
            )
        calls = next_calls(ref, done)
        names = ", ".join(c["name"] for c in calls)
        why = f"Step {done + 1}: call {names}." if reasoning else None
        return Reply(
            reasoning=why,
            tool_calls=[(c["name"], json.dumps(c.get("arguments") or {})) for c in calls],
        )

    return script


DECLINE = "None of the functions I can use does this, so I cannot do it for you."


def next_calls(reference: list[dict[str, Any]], done: int) -> list[dict[str, Any]]:
    """The calls of the reply after ``done`` tool results: ``reference[done]`` and the calls
    after it that share its ``step`` (none: each call is a reply of its own)."""
    first = reference[done]
    step = first.get("step")
    calls = [first]
    for call in reference[done + 1 :]:
        if step is None or call.get("step") != step:
            break
        calls.append(call)
    return calls
