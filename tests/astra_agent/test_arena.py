"""Arena records, the loader's problem reports, the reward, and the ArenaEnvironment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from astra_agent.arena import (
    AnswerMatch,
    ArenaEnvironment,
    arena_reward,
    calls_of,
    load_arena_file,
    parse_record,
    run_reference,
    trajectory_reward,
)
from astra_agent.errors import ConfigError
from astra_agent.trajectory import CallEvent, Trajectory


def schema(name: str, **props: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": v} for k, v in props.items()},
                "required": list(props),
            },
        },
    }


FIND = (
    "ROOMS = {'paris': 'H-17'}\n"
    "def find_hotel(city):\n    return {'hotel_id': ROOMS[city.lower()]}\n"
)
PRICE = "def hotel_price(hotel_id):\n    return {'H-17': '412.50'}.get(hotel_id, 'unknown id')\n"
STOCK = "def stock(item):\n    return 3\n"


def record(**overrides: Any) -> dict[str, Any]:
    rec = {
        "prompt": [{"role": "user", "content": "What does a night at our Paris hotel cost?"}],
        "tool_schema": json.dumps(
            [
                schema("find_hotel", city="string"),
                schema("hotel_price", hotel_id="string"),
                schema("stock", item="string"),
            ]
        ),
        "tool_dict": json.dumps({"find_hotel": FIND, "hotel_price": PRICE, "stock": STOCK}),
        "sub_qa_dict": json.dumps({"find_hotel": ["H-17"], "hotel_price": ["412.50"]}),
        "reference": [
            {"name": "find_hotel", "arguments": {"city": "Paris"}},
            {"name": "hotel_price", "arguments": {"hotel_id": "H-17"}},
        ],
        "task_id": "t1",
    }
    rec.update(overrides)
    return rec


def test_good_record_parses() -> None:
    task, problems = parse_record(record(), 0)
    assert task is not None and problems == []
    assert [t.name for t in task.tools] == ["find_hotel", "hotel_price", "stock"]
    assert task.sub_qa == {"find_hotel": ["H-17"], "hotel_price": ["412.50"]}


@pytest.mark.parametrize(
    "overrides,field,needle,severity",
    [
        ({"tool_schema": "[{not json"}, "tool_schema", "invalid JSON", "error"),
        (
            {"sub_qa_dict": json.dumps({"ghost": ["x"], "find_hotel": ["H-17"]})},
            "sub_qa_dict",
            "'ghost' has no source",
            "error",
        ),
        (
            {
                "tool_dict": json.dumps(
                    {"find_hotel": "def find_hotel(:\n", "hotel_price": PRICE, "stock": STOCK}
                )
            },
            "tool_dict",
            "does not compile",
            "error",
        ),
        (
            {
                "tool_dict": json.dumps(
                    {"find_hotel": "def other():\n    pass\n", "hotel_price": PRICE, "stock": STOCK}
                )
            },
            "tool_dict",
            "does not define a function named 'find_hotel'",
            "error",
        ),
        (
            {"tool_dict": json.dumps({"find_hotel": FIND, "hotel_price": PRICE})},
            "tool_schema",
            "'stock' has no implementation",
            "error",
        ),
        (
            {
                "tool_schema": json.dumps(
                    [
                        schema("find_hotel", city="string"),
                        schema("find_hotel", city="string"),
                        schema("hotel_price", hotel_id="string"),
                        schema("stock", item="string"),
                    ]
                )
            },
            "tool_schema",
            "listed twice",
            "warning",
        ),
        ({"prompt": []}, "prompt", "non-empty list", "error"),
        ({"prompt": "hello"}, "prompt", "invalid JSON", "error"),
        ({"sub_qa_dict": None}, "sub_qa_dict", "missing", "error"),
    ],
)
def test_problems_name_the_record_and_field(
    overrides: dict[str, Any], field: str, needle: str, severity: str
) -> None:
    rec = record(**overrides)
    if overrides.get("sub_qa_dict", 0) is None:
        del rec["sub_qa_dict"]
    task, problems = parse_record(rec, 7)
    hits = [p for p in problems if p.field == field and needle in p.message]
    assert hits, problems
    assert hits[0].index == 7 and hits[0].severity == severity
    assert (task is None) == (severity == "error")


def test_loader_reads_jsonl_and_parquet_and_reports_every_problem(tmp_path: Path) -> None:
    good, bad = record(), record(tool_dict="{oops")
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in (good, bad, good)) + "\n")
    report = load_arena_file(jsonl)
    assert report.records == 3 and [t.index for t in report.tasks] == [0, 2]
    assert [str(p) for p in report.errors] == [
        "record 1, tool_dict: invalid JSON: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)"
    ]
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {k: (json.dumps(v) if k == "reference" else v) for k, v in r.items()} for r in (good, bad)
    ]
    for r in rows:
        r["prompt"] = json.dumps(r["prompt"])
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    report = load_arena_file(tmp_path / "t.parquet")
    assert len(report.tasks) == 1 and len(report.errors) == 1


def test_loader_errors() -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_arena_file("/nonexistent.jsonl")


# --------------------------------------------------------------------------- reward

SUB = {"find_hotel": ["H-17"], "hotel_price": ["412.50"]}


def test_reward_all_solved_in_minimal_calls() -> None:
    r = arena_reward(SUB, [("find_hotel", '{"hotel_id": "H-17"}'), ("hotel_price", "412.50")])
    assert r.recall == 1.0 and r.fully_solved
    assert r.reward == pytest.approx(1.0, abs=1e-5)


def test_reward_none_solved() -> None:
    r = arena_reward(SUB, [("find_hotel", "error"), ("stock", "3")])
    assert r.reward == 0.0 and r.recall == 0.0 and r.tool_calls == 2
    assert arena_reward(SUB, []).reward == 0.0


def test_reward_partial() -> None:
    r = arena_reward(SUB, [("find_hotel", "hotel H-17")])
    assert r.recall == 0.5 and r.precision == pytest.approx(1.0, abs=1e-5)
    assert r.reward == pytest.approx(2 * 0.5 * 1.0 / 1.5, abs=1e-5)


def test_reward_extra_calls_lower_precision() -> None:
    calls = [
        ("stock", "3"),
        ("find_hotel", "H-17"),
        ("find_hotel", "H-17"),
        ("hotel_price", "412.50"),
    ]
    r = arena_reward(SUB, calls)
    assert r.recall == 1.0 and r.precision == pytest.approx(0.5, abs=1e-5)
    assert r.reward == pytest.approx(2 / 3, abs=1e-5)


def test_reward_wrong_tool_does_not_count() -> None:
    # The right value from the wrong tool does not solve the sub-question.
    r = arena_reward(SUB, [("stock", "H-17 412.50")])
    assert r.solved == () and r.reward == 0.0


def test_answer_matching_is_documented_and_configurable() -> None:
    m = AnswerMatch()
    assert m.found('"Paris"', "the city is  PARIS today")
    assert m.found("new   york", "New York")
    strict = AnswerMatch(case_sensitive=True)
    assert not strict.found("paris", "Paris")
    assert arena_reward({"t": ["ABC"]}, [("t", "abc")], match=strict).reward == 0.0


def test_reward_from_a_trajectory() -> None:
    traj = Trajectory(
        messages=[
            {"role": "tool", "tool_call_id": "a", "content": '{"hotel_id": "H-17"}'},
            {"role": "tool", "tool_call_id": "b", "content": "Error: unknown"},
        ],
        events=[
            CallEvent(
                step=1, call_id="a", name="find_hotel", arguments="{}", status="ok", duration_s=0
            ),
            CallEvent(
                step=2,
                call_id="b",
                name="hotel_price",
                arguments="{",
                status="invalid_json",
                duration_s=0,
            ),
        ],
    )
    assert calls_of(traj) == [
        ("find_hotel", '{"hotel_id": "H-17"}'),
        ("hotel_price", ""),  # a failed call counts, but its error text solves nothing
    ]
    task, _ = parse_record(record(), 0)
    assert task is not None
    r = trajectory_reward(task, traj)
    assert r.solved == ("find_hotel",) and r.tool_calls == 2


@pytest.mark.parametrize("status", ["tool_error", "schema_error", "unknown_tool", "timeout"])
def test_a_gold_answer_echoed_in_an_error_solves_nothing(status: str) -> None:
    # The reward hack: guess the gold into an argument name; the TypeError repeats it.
    task, _ = parse_record(record(), 0)
    assert task is not None
    gold = task.sub_qa["find_hotel"][0]
    traj = Trajectory(
        messages=[
            {
                "role": "tool",
                "tool_call_id": "a",
                "content": f"Error: TypeError: find_hotel() got an unexpected keyword argument "
                f"'{gold}'",
            }
        ],
        events=[
            CallEvent(
                step=1, call_id="a", name="find_hotel", arguments="{}", status=status, duration_s=0
            )
        ],
    )
    r = trajectory_reward(task, traj)
    assert r.solved == () and r.reward == 0.0 and r.tool_calls == 1


# --------------------------------------------------------------------------- environment


async def test_environment_runs_the_reference_chain_in_the_sandbox() -> None:
    task, _ = parse_record(record(), 0)
    assert task is not None
    async with ArenaEnvironment(task) as env:
        assert [t.name for t in await env.list_tools()] == ["find_hotel", "hotel_price", "stock"]
        reward, outputs = await run_reference(task, env)
        assert reward.fully_solved and outputs == ['{"hotel_id": "H-17"}', "412.50"]
        bad = await env.call_tool("find_hotel", {"city": "Atlantis"})
        assert bad.is_error and "KeyError" in bad.text
        assert (await env.call_tool("stock", {"item": "x"})).text == "3"
