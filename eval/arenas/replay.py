"""A scripted model that replays each task's reference chain (for tests and benchmarks).

Served by :class:`astra_agent.testing.scripted_server.ScriptedServer`: the task is found by its
prompt; the k-th tool message since that prompt means the reference's call k+1 is next; after
the last one the model answers. A fake model, named as such.
"""

from __future__ import annotations

import json
from typing import Any

from astra_agent.arena import ArenaTask
from astra_agent.testing.scripted_server import Reply, Script


def replay_script(tasks: list[ArenaTask], *, reasoning: bool = True) -> Script:
    """The script; with ``reasoning`` off its replies carry no reasoning (a model that does
    not think is trained on them)."""
    by_prompt = {t.prompt[-1]["content"]: t for t in tasks if t.reference}

    def script(req: dict[str, Any]) -> Reply:
        msgs = req["messages"]
        users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
        task = by_prompt.get(msgs[users[-1]]["content"]) if users else None
        if task is None:
            return Reply(content="I do not know this task.")
        done = sum(1 for m in msgs[users[-1] :] if m["role"] == "tool")
        ref = task.reference or []
        if done >= len(ref):
            return Reply(
                reasoning="All sub-questions answered." if reasoning else None, content="Done."
            )
        call = ref[done]
        args = json.dumps(call.get("arguments") or {})
        why = f"Step {done + 1}: call {call['name']}." if reasoning else None
        return Reply(reasoning=why, tool_calls=[(call["name"], args)])

    return script
