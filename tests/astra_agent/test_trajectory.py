"""Trajectory records: tool changes within an episode, and the termination vocabulary."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, get_args

from astra_agent.environment import ToolSpec
from astra_agent.episode import EpisodeLimits, run_episode
from astra_agent.function_env import FunctionEnvironment
from astra_agent.model import ChatModel, ModelConfig
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from astra_agent.trajectory import Termination, ToolChange, Trajectory, append_jsonl, read_jsonl

REPO = Path(__file__).resolve().parents[2]


def spec(name: str) -> ToolSpec:
    return ToolSpec(name, f"tool {name}", {"type": "object", "properties": {}})


ADD, HELD, OTHER = spec("add"), spec("held_out"), spec("other")
ENV = FunctionEnvironment([(s, lambda n=s.name: f"ran {n}") for s in (ADD, HELD, OTHER)])


def names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


async def bfcl_like(srv: ScriptedServer) -> Trajectory:
    """Three turns on one trajectory, as eval/bfcl/runner.py runs miss_func: a held-out
    function offered from the second turn on, the same offer again at the third."""
    srv.set_script(
        [
            Reply(tool_calls=[("add", "{}")]),
            Reply(content="one"),
            Reply(tool_calls=[("held_out", "{}")]),
            Reply(content="two"),
            Reply(content="three"),
        ]
    )
    model = ChatModel(ModelConfig(base_url=srv.base_url, model="scripted"))
    limits = EpisodeLimits(max_steps=5)
    traj = None
    try:
        for text, offer in (("q1", [ADD]), ("q2", [ADD, HELD]), ("q3", [ADD, HELD])):
            msgs = [{"role": "user", "content": text}]
            traj = await run_episode(model, ENV, msgs, tools=offer, trajectory=traj, limits=limits)
    finally:
        await model.close()
    assert traj is not None
    return traj


async def test_a_tool_offered_at_a_later_turn_is_recorded_where_the_model_first_saw_it(
    tmp_path: Path,
) -> None:
    with ScriptedServer([Reply(content="x")]) as srv:
        traj = await bfcl_like(srv)
        sent = [names(r.get("tools", [])) for r in srv.requests]
    at = [m.get("content") for m in traj.messages].index("q2")
    assert at == 4  # q1, the call, its result, "one", then q2
    assert traj.tool_changes == [
        ToolChange(at_message=at, added=["held_out"], removed=[], schemas=[HELD.to_openai()])
    ]  # one change: the third turn offered the same tools again
    assert names(traj.tools) == ["add"]  # the first offer
    assert names(traj.tools_at(at - 1)) == ["add"]
    both = ["add", "held_out"]
    assert names(traj.tools_at(at)) == names(traj.tools_at(len(traj.messages))) == both
    # What the model was sent agrees with the record, request by request.
    prompts = [i for i, m in enumerate(traj.messages) if m["role"] == "assistant"]
    assert sent == [names(traj.tools_at(i - 1)) for i in prompts]
    path = tmp_path / "t.jsonl"
    append_jsonl(path, traj)
    (back,) = read_jsonl(path)
    assert back.tool_changes == traj.tool_changes


def test_removed_and_changed_tools_are_recorded() -> None:
    traj = Trajectory()
    traj.offer_tools([ADD.to_openai(), OTHER.to_openai()])
    traj.messages.append({"role": "user", "content": "q"})
    changed = ToolSpec("add", "now with a description", {"type": "object", "properties": {}})
    traj.offer_tools([changed.to_openai()])
    (change,) = traj.tool_changes
    assert change.at_message == 1 and change.added == ["add"]
    assert sorted(change.removed) == ["add", "other"]
    assert traj.tools_at(1) == [changed.to_openai()]
    assert names(traj.tools_at(0)) == ["add", "other"]


def test_records_without_tool_changes_still_load() -> None:
    old = {"id": "x", "messages": [], "tools": [ADD.to_openai()], "termination": "stop"}
    traj = Trajectory.model_validate_json(json.dumps(old))
    assert traj.tool_changes == [] and names(traj.tools_at(10)) == ["add"]


async def test_a_record_with_tool_changes_renders_with_the_chat_template(tiny_fp32: Path) -> None:
    from transformers import AutoTokenizer

    with ScriptedServer([Reply(content="x")]) as srv:
        record = json.loads((await bfcl_like(srv)).to_json_line())
    tok = AutoTokenizer.from_pretrained(tiny_fp32)
    first = str(tok.apply_chat_template(record["messages"], tools=record["tools"], tokenize=False))
    last: list[Any] = Trajectory.model_validate(record).tools_at(len(record["messages"]))
    final = str(tok.apply_chat_template(record["messages"], tools=last, tokenize=False))
    assert '"name": "held_out"' not in first.split("<|im_end|>")[0]
    assert '"name": "held_out"' in final.split("<|im_end|>")[0]  # the tools block
    assert first.count("<|im_start|>assistant") == final.count("<|im_start|>assistant") == 5


TERMINATION_USE = re.compile(
    r"""termination["']?\s*(?:=|==|!=|:)\s*["']([A-Za-z_]+)["']"""
    r"""|_end\(\s*\w+\s*,\s*["']([A-Za-z_]+)["']"""
)


def test_every_termination_value_used_in_the_code_is_in_the_literal() -> None:
    used: dict[str, str] = {}
    for package in ("astra_agent", "eval", "training", "serving", "bench"):
        for path in (REPO / package).rglob("*.py"):
            for m in TERMINATION_USE.finditer(path.read_text(encoding="utf-8")):
                used.setdefault(m.group(1) or m.group(2), str(path.relative_to(REPO)))
    assert {"stop", "model_error", "error"} <= set(used)  # the scan finds what it should
    unknown = {v: where for v, where in used.items() if v not in get_args(Termination)}
    assert unknown == {}


def test_line_separators_inside_strings_do_not_tear_records(tmp_path: Path) -> None:
    """JSON writers leave U+2028, U+2029, U+0085 and \\x1c raw inside strings; a model output
    holding one must not split its record (``str.splitlines`` would)."""
    from eval.bfcl.runner import BFCLRecord
    from eval.results import read_results

    odd = "a\u2028b\u2029c\x85d\x1ce\x0bf\x0cg"
    path = tmp_path / "t.jsonl"
    for i in range(2):
        traj = Trajectory(id=f"t{i}")
        traj.messages.append({"role": "assistant", "content": odd})
        append_jsonl(path, traj)
    assert [t.messages[0]["content"] for t in read_jsonl(path)] == [odd, odd]
    results = tmp_path / "results.jsonl"
    for i in range(2):
        rec = BFCLRecord(id=f"e{i}", category="base", valid=False, error_type=odd)
        append_jsonl(results, rec)
    assert [r.error_type for r in read_results(results, BFCLRecord).values()] == [odd, odd]
