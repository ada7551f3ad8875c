"""The gold replay model of τ² (tests, benches): one scripted endpoint that plays both the agent
and the user simulator of every task from the task's own evaluation criteria. A fake model.

The conversation is found by the request's ``user`` field (``tau2:domain/task_id/trial``, sent
by :mod:`eval.tau2.adapter`); the side by the system prompt (τ²'s agent is told it is a
customer service agent). The task's gold actions are performed in their order, one call per
reply, each by its side: the agent with its tools, the user (telecom's phone settings) with its
own, each side handing the turn over when the next action is the other's. Then the agent says
every string the task expects it to communicate, and the user ends the conversation
(``###STOP###``).

Run through ``astra-eval tau2`` it must score 1.0 on every task whose checks these moves can
satisfy: the harness's self-test (``tests/eval/test_tau2.py``, ``bench/tau2_gold.py``).
"""

from __future__ import annotations

import argparse
import json
import threading
from typing import Any

from astra_agent.testing.scripted_server import Reply, Script

AGENT_MARK = "You are a customer service agent"
DONE = "All done."


def _tasks(domains: list[str]) -> dict[str, Any]:
    from inspect_evals.tau2.common.metadata import Tau2MetaData

    from eval.tau2.runner import load_task

    out = {}
    for domain in domains:
        for sample in load_task(domain).dataset:  # type: ignore[arg-type]
            out[f"{domain}/{sample.id}"] = Tau2MetaData.model_validate(sample.metadata).task
    return out


def _tool(name: str, tools: list[dict[str, Any]]) -> str:
    """The offered tool that is the action ``name`` (τ² matches a prefixed name too)."""
    names = [t["function"]["name"] for t in tools]
    if name in names:
        return name
    return next((n for n in names if n.endswith(f"_{name}")), name)


def replay_script(domains: list[str]) -> Script:
    tasks = _tasks(domains)
    lock = threading.Lock()
    done: dict[str, int] = {}  # conversation → gold actions performed (both sides)

    def script(req: dict[str, Any]) -> Reply:
        tag = str(req.get("user") or "")
        task = tasks.get(tag.removeprefix("tau2:").rpartition("/")[0])
        if task is None:
            return Reply(content=f"I do not know the conversation {tag!r}. ###STOP###")
        msgs = req["messages"]
        criteria = task.evaluation_criteria
        actions = list(criteria.actions or []) if criteria else []
        agent = AGENT_MARK in (msgs[0].get("content") or "")
        side = "assistant" if agent else "user"
        with lock:
            if not agent and not any(m["role"] == "assistant" for m in msgs):
                done[tag] = 0  # the conversation's first message: (re)start it
            n = done.get(tag, 0)
            if n < len(actions) and actions[n].requestor == side:
                done[tag] = n + 1
                a = actions[n]
                name = _tool(a.name, req.get("tools") or [])
                return Reply(
                    reasoning=f"{'Gold' if agent else 'User'} action {a.action_id}.",
                    tool_calls=[(name, json.dumps(a.arguments))],
                )
        if agent:
            if n < len(actions):  # the user's move is next
                return Reply(reasoning="Gold: the user acts.", content="Please do that now.")
            info = (criteria.communicate_info or []) if criteria else []
            return Reply(reasoning="Gold actions done.", content=" ".join([DONE, *info]))
        said = [m.get("content") or "" for m in msgs if m["role"] == "user"]
        if n >= len(actions) and said and DONE in said[-1]:
            return Reply(content="Thank you. ###STOP###")
        if len(said) <= 1:
            return Reply(content="Hello, I need help with my request.")
        return Reply(content="I did that. What next?")

    return script


def main() -> None:
    """Serve the gold replay from its own process (benchmarks, a manual check)."""
    from astra_agent.testing.scripted_server import _HTTPServer

    ap = argparse.ArgumentParser(description="τ²'s gold replay model (a fake model over HTTP).")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--domains", default="retail,telecom")
    ap.add_argument("--model", default="tau2-gold-replay")
    args = ap.parse_args()
    httpd = _HTTPServer(
        ("127.0.0.1", args.port), replay_script(args.domains.split(",")), args.model
    )
    print(f"τ² gold replay on http://127.0.0.1:{args.port}/v1", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
