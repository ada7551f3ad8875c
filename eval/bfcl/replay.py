"""A scripted model that answers each BFCL entry with its ground-truth calls (tests, benches).

Per turn: the turn's ground-truth calls as one step of parallel calls, then a short answer that
ends the turn. The entry and turn are found from the user messages so far. A fake model.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from astra_agent.testing.scripted_server import Reply, Script
from eval.bfcl.backend import method_table, new_instances, parse_call
from eval.bfcl.official import CATEGORIES, Entry, load_category


def json_calls(calls: list[str], table: dict[str, Any]) -> list[tuple[str, str]]:
    """Python call strings as function-calling calls: (name, JSON object of keyword arguments)."""
    out = []
    for call in calls:
        name, args, kwargs = parse_call(call)
        if args:  # positional arguments → keywords, by the backend method's signature
            kwargs = dict(inspect.signature(table[name]).bind(*args, **kwargs).arguments)
        out.append((name, json.dumps(kwargs)))
    return out


def replay_script(entries: list[Entry] | None = None) -> Script:
    from eval.bfcl.runner import HELD_OUT_MESSAGE

    plan: dict[tuple[str, ...], list[tuple[str, str]]] = {}
    for entry in entries or [e for c in CATEGORIES for e in load_category(c)]:
        table = method_table(new_instances(entry))
        users: list[str] = []
        for t, question in enumerate(entry.question):
            users += [m["content"] for m in question if m["role"] == "user"] or [HELD_OUT_MESSAGE]
            plan[tuple(users)] = json_calls(entry.ground_truth[t], table)

    def script(req: dict[str, Any]) -> Reply:
        msgs = req["messages"]
        users = tuple(m["content"] for m in msgs if m["role"] == "user")
        calls = plan.get(users)
        if calls is None:
            return Reply(content="Unknown conversation.")
        last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        if calls and not any(m["role"] == "assistant" for m in msgs[last_user:]):
            return Reply(tool_calls=calls)
        return Reply(content="Done.")

    return script


def main() -> None:
    """Serve the replay of one category from its own process (benchmarks)."""
    import argparse

    from astra_agent.testing.scripted_server import _HTTPServer

    ap = argparse.ArgumentParser(description="BFCL replay model (a fake model over HTTP).")
    ap.add_argument("--category", required=True, choices=CATEGORIES)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="scripted")
    args = ap.parse_args()
    httpd = _HTTPServer(
        ("127.0.0.1", args.port), replay_script(list(load_category(args.category))), args.model
    )
    print(f"replay server on http://127.0.0.1:{args.port}/v1", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
