"""How a BFCL multi-turn entry runs, beyond its verdict: backend calls on an entry's worker
(threads reused from entry to entry, calls in order), the tools object sent once per offer,
the live categories' sizes counted without parsing them."""

from __future__ import annotations

import asyncio
import threading
import types
from typing import Any

import pytest

from astra_agent.model import ModelTurn, ToolCall
from eval.bfcl import CATEGORIES, Entry, load_category, openai_tools
from eval.bfcl.backend import _THREADS, BFCLEnvironment
from eval.bfcl.categories import SINGLE_TURN
from eval.bfcl.official import held_out_tools
from eval.bfcl.runner import category_sizes, run_entry
from eval.bfcl.single import count_single, load_single

FS = "multi_turn_base_0"  # TwitterAPI + GorillaFileSystem


def _entry(entry_id: str) -> Entry:
    return next(e for c in CATEGORIES for e in load_category(c) if e.id == entry_id)


@pytest.mark.parametrize("category", SINGLE_TURN)
def test_a_single_turn_category_is_counted_as_loaded(category: str) -> None:
    assert count_single(category) == len(load_single(category))


def test_the_live_sizes_are_the_counts() -> None:
    assert category_sizes() == {c: len(load_single(c)) for c in category_sizes()}


async def test_an_entrys_calls_run_in_order_on_one_thread_given_back_at_close() -> None:
    env = BFCLEnvironment(_entry(FS))
    fs = env.instances["GorillaFileSystem"]
    seen: list[tuple[str, int]] = []
    for name in ("pwd", "ls"):
        real = getattr(fs, name)

        def spy(_: Any, *a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            seen.append((_name, threading.get_ident()))
            return _real(*a, **k)

        setattr(fs, name, types.MethodType(spy, fs))  # a method of the instance, as called
    results = await asyncio.gather(*(env.call_tool(n, {}) for n in ("pwd", "ls", "pwd")))
    assert [n for n, _ in seen] == ["pwd", "ls", "pwd"]  # call order, one at a time
    assert len({t for _, t in seen}) == 1 and threading.get_ident() not in {t for _, t in seen}
    assert [r.text for r in results] == env.executed
    await env.close()
    # the thread is given back: the next entry's calls run on it, no thread is started
    for _ in range(100):
        if _THREADS._idle:
            break
        await asyncio.sleep(0.01)
    before = threading.active_count()
    existing = {t.ident for t in threading.enumerate()}  # other tests may leave idle workers
    other = BFCLEnvironment(_entry(FS))
    other_fs = other.instances["GorillaFileSystem"]
    ident: list[int] = []
    real_pwd = other_fs.pwd

    def pwd(_: Any) -> Any:
        ident.append(threading.get_ident())
        return real_pwd()

    other_fs.pwd = types.MethodType(pwd, other_fs)
    await other.call_tool("pwd", {})
    await other.close()
    assert len(ident) == 1 and ident[0] in existing and threading.active_count() == before


async def test_a_call_given_before_a_reset_runs_on_the_old_backends_unseen() -> None:
    env = BFCLEnvironment(_entry(FS))
    release = threading.Event()
    fs = env.instances["GorillaFileSystem"]
    fs.ls = types.MethodType(lambda _, **__: release.wait(5) and "old ls", fs)
    pending = asyncio.ensure_future(env.call_tool("ls", {}))
    await asyncio.sleep(0.05)
    await env.reset()
    release.set()
    assert (await pending).text == "old ls"
    assert env.executed == []  # the new backends' results only
    fresh = await env.call_tool("pwd", {})
    assert env.executed == [fresh.text]
    await env.close()


class _Recorder:
    """A model that calls ``pwd`` once per turn, then answers; keeps the tools objects."""

    name = "recorder"

    def __init__(self) -> None:
        self.tools: list[list[dict[str, Any]] | None] = []

    async def complete(
        self, messages: list[dict[str, Any]], tools: Any = None, *_: Any, **__: Any
    ) -> ModelTurn:
        self.tools.append(tools)
        if messages[-1]["role"] == "tool":
            return ModelTurn("done", "", [], "stop")
        return ModelTurn("", "", [ToolCall(f"c{len(self.tools)}", "pwd", "{}")], "tool_calls")


async def test_every_request_sends_the_same_schema_objects_encoded_once() -> None:
    """The tools' schemas are built once a run: every request (of every entry) offering a
    function sends the same object, so that the client encodes an offer once."""
    from astra_agent.http_client import BodyEncoder

    entry = _entry(FS)
    model = _Recorder()
    record = await run_entry(entry, model, 10.0)  # type: ignore[arg-type]
    assert len(record.responses) == len(entry.question) > 1
    first = model.tools[0]
    assert first and all(a is b for t in model.tools for a, b in zip(t or [], first, strict=True))
    again = _Recorder()
    await run_entry(entry, again, 10.0)  # type: ignore[arg-type]
    assert all(a is b for a, b in zip(again.tools[0] or [], first, strict=True))
    encoder = BodyEncoder("tools")
    encoder.encode({"tools": first})
    kept = dict(encoder._kept)
    encoder.encode({"tools": again.tools[-1]})  # another list of the same schemas: kept
    assert encoder._kept == kept

    held = next(e for e in load_category("miss_func") if e.missed_function)
    model = _Recorder()
    await run_entry(held, model, 10.0)  # type: ignore[arg-type]
    turn = int(next(iter(held.missed_function)))
    assert len(model.tools) == 2 * len(held.question)  # a call and an answer a turn
    offers = [[t["function"]["name"] for t in tools or []] for tools in model.tools]
    assert offers[2 * turn - 1] == [t["function"]["name"] for t in openai_tools(held)]
    assert offers[2 * turn] == offers[2 * turn - 1] + [
        t["function"]["name"] for t in held_out_tools(held, turn)
    ]
