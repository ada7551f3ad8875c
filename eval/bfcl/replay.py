"""A scripted model that answers each BFCL entry with its ground-truth calls (tests, benches).

Multi-turn, per turn: the turn's ground-truth calls as one step of parallel calls, then a short
answer that ends the turn. The entry and turn are found from the user messages so far.
Memory: each prerequisite conversation's user messages stored in the memory backend, each
question answered with its gold answer after a search (:func:`memory_replay_script`).
Single-turn: the gold answer as calls (irrelevance: a text; relevance: a call of the first
function), or, ``mixed``, one case of the mutation corpus per entry, picked by the entry id's
hash among those a chat reply can carry (so that scores are not all 100). The entry is found
from its messages and the tools' names. A fake model.
"""

from __future__ import annotations

import inspect
import json
import zlib
from typing import Any

from astra_agent.testing.scripted_server import Reply, Script
from eval.bfcl.backend import method_table, new_instances, parse_call
from eval.bfcl.categories import MEMORY, MULTI_TURN, RELEVANCE, SINGLE_TURN
from eval.bfcl.memory import MemoryEntry, load_memory
from eval.bfcl.official import CATEGORIES, Entry, load_category
from eval.bfcl.single import SingleEntry, fc_tools, load_single, messages


def json_calls(calls: list[str], table: dict[str, Any]) -> list[tuple[str, str]]:
    """Python call strings as function-calling calls: (name, JSON object of keyword arguments)."""
    out = []
    for call in calls:
        name, args, kwargs = parse_call(call)
        if args:  # positional arguments → keywords, by the backend method's signature
            kwargs = dict(inspect.signature(table[name]).bind(*args, **kwargs).arguments)
        out.append((name, json.dumps(kwargs)))
    return out


def _key(msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    names = [t["function"]["name"] for t in tools or []]
    return json.dumps([[m.get("role"), m.get("content")] for m in msgs] + names)


def _servable(result: Any) -> bool:
    """A stored result a chat reply can carry: a text, or calls with text arguments."""
    if isinstance(result, str):
        return True
    return (
        isinstance(result, list)
        and bool(result)
        and all(
            isinstance(c, dict) and len(c) == 1 and isinstance(next(iter(c.values())), str)
            for c in result
        )
    )


def _as_reply(result: Any) -> Reply:
    if isinstance(result, str):
        return Reply(content=result)
    return Reply(tool_calls=[next(iter(c.items())) for c in result])


def single_replay_script(entries: list[SingleEntry], mixed: bool = False) -> Script:
    from eval.bfcl.mutations import corpus, gold_result

    cases: dict[str, list[Any]] = {}
    if mixed:
        for case in corpus():
            if _servable(case["result"]):
                cases.setdefault(case["id"], []).append(case["result"])
    plan: dict[str, Reply] = {}
    for e in entries:
        tools = fc_tools(e)
        if mixed and cases.get(e.id):
            options = cases[e.id]
            reply = _as_reply(options[zlib.crc32(e.id.encode()) % len(options)])
        elif e.category in RELEVANCE:
            first = tools[0]["function"]["name"] if tools else "none"
            reply = (
                Reply(tool_calls=[(first, "{}")])
                if e.category == "live_relevance"
                else Reply(content="None of the functions fits this request.")
            )
        else:
            reply = _as_reply(gold_result(e))
        plan[_key(messages(e), tools)] = reply

    def script(req: dict[str, Any]) -> Reply:
        return plan.get(_key(req["messages"], req.get("tools")), Reply(content="Unknown entry."))

    return script


def replay_script(entries: list[Entry] | None = None, single: Script | None = None) -> Script:
    """Multi-turn entries' ground truth replayed (all four categories by default); a request
    of no multi-turn entry goes to ``single`` (a single-turn replay) when given."""
    from eval.bfcl.runner import HELD_OUT_MESSAGE

    plan: dict[tuple[str, ...], list[tuple[str, str]]] = {}
    for entry in (
        entries if entries is not None else [e for c in CATEGORIES for e in load_category(c)]
    ):
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
            return single(req) if single else Reply(content="Unknown conversation.")
        last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        if calls and not any(m["role"] == "assistant" for m in msgs[last_user:]):
            return Reply(tool_calls=calls)
        return Reply(content="Done.")

    return script


def memory_replay_script(entries: list[MemoryEntry]) -> Script:
    """A scripted model for the memory categories that depends on the request alone. In a
    prerequisite conversation it stores each user message (key-value: the first of a
    conversation in core memory, the others in archival memory; recursive summary: appended)
    and then says "Noted."; asked a question (the official answer-format prompt is in its
    first message), it searches its memory, then answers with the question's first gold
    answer in the official answer format."""

    return memory_model({e.question[0][0]["content"]: e.ground_truth[0] for e in entries})


def memory_model(answers: dict[str, str]) -> Script:
    """:func:`memory_replay_script`'s model, answering each question (its first user message)
    with ``answers[question]`` ("unknown" where it has none)."""
    from bfcl_eval.constants.default_prompts import (
        ADDITIONAL_SYSTEM_PROMPT_FOR_AGENTIC_RESPONSE_FORMAT as ANSWER_FORMAT,
    )

    def script(req: dict[str, Any]) -> Reply:
        msgs = req["messages"]
        names = {t["function"]["name"] for t in req.get("tools") or []}
        kv = "core_memory_add" in names
        question = ANSWER_FORMAT in str(msgs[0]["content"])
        users = [m["content"] for m in msgs if m["role"] == "user"]
        if msgs[-1]["role"] == "tool":
            if question:
                answer = answers.get(users[0], "unknown")
                return Reply(content=f"{{'answer': '{answer}', 'context': 'memory'}}")
            return Reply(content="Noted.")
        text = users[-1]
        if question:
            search = ("archival_memory_key_search", json.dumps({"query": text}))
            return Reply(tool_calls=[search if kv else ("memory_retrieve", "{}")])
        if not kv:
            return Reply(tool_calls=[("memory_append", json.dumps({"text": text[:150] + "\n"}))])
        name = "core_memory_add" if len(users) == 1 else "archival_memory_add"
        args = {"key": f"note_{zlib.crc32(text.encode())}", "value": text[:200]}
        return Reply(tool_calls=[(name, json.dumps(args))])

    return script


def main() -> None:
    """Serve the replay of one category from its own process (benchmarks)."""
    import argparse

    from astra_agent.testing.scripted_server import http_server

    ap = argparse.ArgumentParser(description="BFCL replay model (a fake model over HTTP).")
    ap.add_argument("--category", required=True, choices=SINGLE_TURN + MULTI_TURN + MEMORY)
    ap.add_argument("--mixed", action="store_true", help="single-turn: gold and mutated answers")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="scripted")
    args = ap.parse_args()
    if args.category in MULTI_TURN:
        script = replay_script(list(load_category(args.category)))
    elif args.category in MEMORY:
        script = memory_replay_script(list(load_memory(args.category)))
    else:
        script = single_replay_script(list(load_single(args.category)), args.mixed)
    # It keeps no request bodies: a bench sends it thousands (over 1 GB for a category's runs)
    httpd = http_server("127.0.0.1", args.port, script, args.model)
    print(f"replay server on http://127.0.0.1:{args.port}/v1", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
