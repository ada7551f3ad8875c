"""`astra-train data sft`: every input format, every rejection reason, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from astra_agent.errors import ConfigError
from astra_agent.trajectory import Trajectory
from eval.bfcl.runner import BFCLRecord
from training.data import DataError, DataOptions, build_sft_data, read_sft_parquet
from training.data_cli import data_app
from training.template import load_tokenizer, tokenize

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
        },
    },
]
OTHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Find a thing.",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["q"],
            },
        },
    },
]


def convo(
    q: str = "Time in Paris?",
    args: Any = '{"tz": "Europe/Paris"}',
    name: str = "get_time",
    answer: str = "It is 12:00.",
) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": q},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "call it",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
        {"role": "assistant", "content": answer, "reasoning_content": "answer"},
    ]


def traj(**kw: Any) -> Trajectory:
    return Trajectory(**{"messages": convo(), "tools": TOOLS, **kw})


def bfcl_record(entry_id: str, valid: bool) -> BFCLRecord:
    """A BFCL multi-turn entry of two turns whose second offers ``OTHER_TOOLS`` too (as a
    miss_func entry adds its held-back function) and calls one of them."""
    t = Trajectory(messages=[], tools=[])
    t.offer_tools(TOOLS)
    t.messages += convo("one")
    t.offer_tools(TOOLS + OTHER_TOOLS)
    t.messages += convo("two", name="lookup", args='{"q": "x"}')
    return BFCLRecord(id=entry_id, category="multi_turn_miss_func", valid=valid, trajectory=t)


def jsonl(path: Path, records: list[Any]) -> Path:
    lines = [
        r.to_json_line() if isinstance(r, Trajectory) else json.dumps(r) + "\n" for r in records
    ]
    path.write_text("".join(lines))
    return path


def opts(tok_dir: Path, **kw: Any) -> DataOptions:
    return DataOptions(tokenizer=tok_dir, **kw)


def rejections(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "rejections.jsonl").read_text().splitlines()]


def astra_record(query: str = "Find cats.", **extra: Any) -> dict[str, Any]:
    """An ASTRA-SFT-1k-shaped record: the call is an assistant message of its own."""
    trajectory = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": query},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "search"},
        {
            "role": "assistant",
            "content": "",
            "function_call": {"name": "lookup", "arguments": '{"q": "cats"}'},
        },
        {"role": "function", "name": "lookup", "content": "3 cats"},
        {"role": "assistant", "content": "Found 3 cats.", "reasoning_content": "report"},
    ]
    mcp = {"base_info": {"tool_list": [OTHER_TOOLS[0]["function"]], "server": "cats"}}
    return {
        "query_id": "q-1",
        "trajectory": json.dumps(trajectory),
        "mcp_info": json.dumps(mcp),
        **extra,
    }


def test_each_input_format(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    ours = jsonl(tmp_path / "traj.jsonl", [traj(id="t1")])
    arena = jsonl(
        tmp_path / "arenas.jsonl",
        [
            {
                "id": "task-1",
                "index": 0,
                "reward": 1.0,
                "trajectory": traj(id="a1", messages=convo("q2")).model_dump(mode="json"),
            }
        ],
    )
    bfcl = BFCLRecord(
        id="multi_turn_base_0",
        category="multi_turn_base",
        valid=True,
        trajectory=traj(messages=convo("q3")),
    )
    bfcl_file = tmp_path / "bfcl.jsonl"
    bfcl_file.write_text(bfcl.model_dump_json() + "\n")
    astra_jsonl = jsonl(tmp_path / "astra.jsonl", [astra_record(score_detail={"x": 1})])
    astra_pq = tmp_path / "astra.parquet"
    pq.write_table(pa.Table.from_pylist([astra_record("Find dogs.", id="p1")]), astra_pq)
    plain = jsonl(tmp_path / "plain.jsonl", [{"messages": convo("q4"), "tools": TOOLS}])
    out = tmp_path / "out"
    stats = build_sft_data(
        [ours, arena, bfcl_file, astra_jsonl, astra_pq, plain], out, opts(tiny_tokenizer_dir)
    )
    assert stats.by_source == {
        "trajectory": 1,
        "arenas": 1,
        "bfcl": 1,
        "astra-sft-1k": 2,
        "openai": 1,
    }
    assert stats.rejections == {} and stats.conversations == 6
    # the ASTRA-SFT-1k extras the reader cannot use are reported, not silently dropped
    assert stats.unused_fields["astra-sft-1k"] == {"query_id": 2, "score_detail": 1}
    rows = {r.id: r for r in read_sft_parquet([out / "sft.parquet"])}
    assert set(rows) == {
        "t1",
        "task-1",
        "multi_turn_base_0",
        "astra.jsonl:1",
        "p1",
        "plain.jsonl:1",
    }
    astra = rows["p1"]
    assert astra.tools == OTHER_TOOLS  # from mcp_info.base_info.tool_list
    assert [m["role"] for m in astra.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert (
        astra.messages[2]["content"] == "Let me look."
        and astra.messages[2]["reasoning_content"] == "search"
    )
    assert astra.messages[2]["tool_calls"][0]["function"] == {
        "name": "lookup",
        "arguments": '{"q": "cats"}',
    }
    assert (
        rows["task-1"].provenance["reward"] == 1.0
        and rows["multi_turn_base_0"].provenance["reward"] == 1.0
    )
    assert rows["t1"].provenance["file"] == str(ours) and rows["t1"].provenance["line"] == 1
    table = pq.read_table(out / "sft.parquet")
    assert table.schema.field("tools").type == pa.string()  # JSON text, never a struct
    tok = load_tokenizer(tiny_tokenizer_dir)
    for row, n, k in zip(
        table.column("id").to_pylist(),
        table.column("num_tokens").to_pylist(),
        table.column("num_trained_tokens").to_pylist(),
        strict=True,
    ):
        t = tokenize(tok, rows[row].messages, rows[row].tools)
        assert (t.num_tokens, t.num_trained) == (n, k)
    assert stats.trained_tokens == sum(table.column("num_trained_tokens").to_pylist())
    assert stats.turns == 12 and stats.tool_calls == 6


def test_tool_schemas_that_differ_between_rows_survive_exactly(
    tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    a = {"messages": convo(), "tools": TOOLS}
    b = {"messages": convo(name="lookup", args='{"q": "x"}'), "tools": OTHER_TOOLS}
    out = tmp_path / "out"
    build_sft_data([jsonl(tmp_path / "in.jsonl", [a, b])], out, opts(tiny_tokenizer_dir))
    rows = read_sft_parquet([out / "sft.parquet"])
    assert [r.tools for r in rows] == [TOOLS, OTHER_TOOLS]  # no null-filled keys


def test_every_rejection_reason_is_named_and_counted(
    tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    long_answer = " ".join(["word"] * 400)
    records: list[Any] = [
        traj(id="ok"),
        traj(id="err", termination="model_error"),
        traj(id="len", termination="length"),
        traj(id="empty", termination="empty_reply"),
        traj(id="badjson", messages=convo(args='{"tz": ')),
        traj(id="notobj", messages=convo(args="[1, 2]")),
        traj(id="unknown", messages=convo(name="rm_rf")),
        {
            "id": "low",
            "index": 1,
            "reward": 0.2,
            "trajectory": traj(messages=convo("q-low")).model_dump(mode="json"),
        },
        traj(id="dup"),
        traj(id="nothing", messages=[{"role": "user", "content": "hi"}]),
        traj(id="long", messages=convo("q-long", answer=long_answer)),
        traj(id="role", messages=[*convo("q-role"), {"role": "critic", "content": "x"}]),
    ]
    src = jsonl(tmp_path / "in.jsonl", records)
    with src.open("a") as f:
        f.write('{"messages": [{"role": "us')  # a writer killed mid-line
    out = tmp_path / "out"
    stats = build_sft_data([src], out, opts(tiny_tokenizer_dir, max_length=400, min_reward=0.5))
    assert stats.conversations == 1
    assert stats.rejections == {
        "duplicate": 1,
        "invalid_messages": 1,
        "low_reward": 1,
        "malformed_tool_call": 2,
        "no_trained_tokens": 1,
        "termination:empty_reply": 1,
        "termination:length": 1,
        "termination:model_error": 1,
        "too_long": 1,
        "torn_line": 1,
        "unknown_tool": 1,
    }
    rej = {r["id"]: r for r in rejections(out)}
    assert (
        rej["unknown"]["reason"] == "unknown_tool"
        and "'rm_rf' is not offered" in rej["unknown"]["detail"]
    )
    assert rej["badjson"] == {
        **rej["badjson"],
        "file": str(src),
        "line": 5,
        "reason": "malformed_tool_call",
    }
    assert rej["long"]["reason"] == "too_long" and "> max_length 400" in rej["long"]["detail"]
    assert json.loads((out / "stats.json").read_text())["rejections"] == stats.rejections


def test_overlong_truncates_at_a_turn_boundary(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    msgs = convo(answer=" ".join(["word"] * 400))
    src = jsonl(tmp_path / "in.jsonl", [traj(id="long", messages=msgs)])
    out = tmp_path / "out"
    stats = build_sft_data(
        [src], out, opts(tiny_tokenizer_dir, max_length=400, overlong="truncate")
    )
    (row,) = read_sft_parquet([out / "sft.parquet"])
    assert row.messages == msgs[:2]  # the longest prefix that ends with an assistant message
    assert stats.truncations == 1 and row.provenance["truncated"] is True
    assert pq.read_table(out / "sft.parquet").column("num_tokens").to_pylist()[0] <= 400


def test_split_turns_trains_every_reply_once(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    msgs = [
        *convo("first?"),
        {"role": "user", "content": "second?"},
        {"role": "assistant", "content": "Again 12:00.", "reasoning_content": "again"},
    ]
    src = jsonl(tmp_path / "in.jsonl", [traj(id="mt", messages=msgs)])
    stats = build_sft_data([src], tmp_path / "a", opts(tiny_tokenizer_dir))
    rows = read_sft_parquet([tmp_path / "a" / "sft.parquet"])
    assert [r.id for r in rows] == ["mt#turn1", "mt#turn2"] and stats.splits == 1
    assert rows[0].messages == msgs[:4] and rows[1].messages == msgs
    assert stats.turns == 3  # each of the three replies once
    unsplit = build_sft_data([src], tmp_path / "b", opts(tiny_tokenizer_dir, split_turns=False))
    assert unsplit.conversations == 1 and unsplit.turns == 1


def test_bfcl_tools_added_at_a_later_turn_are_offered_there(
    tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    rec = bfcl_record("miss_func_0", valid=False)
    src = tmp_path / "bfcl.jsonl"
    src.write_text(rec.model_dump_json() + "\n")
    build_sft_data([src], tmp_path / "out", opts(tiny_tokenizer_dir))
    rows = read_sft_parquet([tmp_path / "out" / "sft.parquet"])
    assert [r.tools for r in rows] == [TOOLS, TOOLS + OTHER_TOOLS]
    with pytest.raises(DataError, match="low_reward: 1"):  # invalid BFCL entry: reward 0
        build_sft_data([src], tmp_path / "out2", opts(tiny_tokenizer_dir, min_reward=0.5))


def test_bad_input_is_a_clear_error_and_writes_nothing(
    tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    neither = tmp_path / "notes.jsonl"
    neither.write_text('{"prompt": "a", "completion": "b"}\n')
    with pytest.raises(ConfigError, match=r"unknown_format: 1\); first: \S*notes.jsonl:1 ") as e:
        build_sft_data([neither], out, opts(tiny_tokenizer_dir))
    assert "keys: completion, prompt" in e.value.message and "OpenAI" in str(e.value.hint)
    not_pq = tmp_path / "x.parquet"
    not_pq.write_text("nope")
    with pytest.raises(ConfigError, match="not a readable parquet"):
        build_sft_data([not_pq], out, opts(tiny_tokenizer_dir))
    empty = jsonl(
        tmp_path / "bad.jsonl", [traj(termination="model_error"), traj(messages=convo(name="nope"))]
    )
    with pytest.raises(DataError, match=r"termination:model_error: 1, unknown_tool: 1"):
        build_sft_data([empty], out, opts(tiny_tokenizer_dir))
    with pytest.raises(ConfigError, match="not a directory"):
        build_sft_data([empty], out, opts(tmp_path / "no-such-model"))
    assert not out.exists()


def test_a_line_that_is_not_json_is_one_rejection(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text(traj(id="a").to_json_line() + "not json\n" + traj(id="b").to_json_line())
    out = tmp_path / "out"
    stats = build_sft_data([garbage], out, opts(tiny_tokenizer_dir, dedupe=False))
    assert stats.rejections == {"invalid_json": 1} and stats.conversations == 2
    (rej,) = rejections(out)
    assert (rej["line"], rej["id"], rej["reason"]) == (2, "garbage.jsonl:2", "invalid_json")


def test_out_dir_of_a_different_build_is_refused(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    src = jsonl(tmp_path / "in.jsonl", [traj(id="a")])
    out = tmp_path / "out"
    build_sft_data([src], out, opts(tiny_tokenizer_dir))
    before = (out / "sft.parquet").read_bytes()
    build_sft_data([src], out, opts(tiny_tokenizer_dir))  # the same build again: fine
    with pytest.raises(ConfigError, match="different SFT data build"):
        build_sft_data([src], out, opts(tiny_tokenizer_dir, max_length=1000))
    assert (out / "sft.parquet").read_bytes() == before
    build_sft_data([src], out, opts(tiny_tokenizer_dir, max_length=1000), overwrite=True)
    assert json.loads((out / "stats.json").read_text())["options"]["max_length"] == 1000
    assert sorted(p.name for p in out.iterdir()) == [
        "rejections.jsonl",
        "sft.parquet",
        "stats.json",
    ]
    other = tmp_path / "other"
    other.mkdir()
    (other / "mine.txt").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        build_sft_data([src], other, opts(tiny_tokenizer_dir))


def test_cli_summary_and_errors(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    src = jsonl(tmp_path / "in.jsonl", [traj(id="a"), traj(id="b", termination="length")])
    out = tmp_path / "out"
    res = runner.invoke(
        data_app,
        ["sft", str(src), "--out", str(out), "--tokenizer", str(tiny_tokenizer_dir)],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0, res.output
    assert "conversations" in res.output and "rejected: termination:length" in res.output
    assert read_sft_parquet([out / "sft.parquet"])[0].id == "a"
    bad = tmp_path / "bad.txt"
    bad.write_text("hello\n")
    res = runner.invoke(
        data_app,
        ["sft", str(bad), "--out", str(tmp_path / "o2"), "--tokenizer", str(tiny_tokenizer_dir)],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 2 and "bad.txt:1" in res.output
    res = runner.invoke(
        data_app,
        [
            "sft",
            str(src),
            "--out",
            str(tmp_path / "o3"),
            "--tokenizer",
            str(tiny_tokenizer_dir),
            "--overlong",
            "cut",
        ],
    )
    assert res.exit_code == 2
    res = runner.invoke(data_app, ["sft", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "Example: astra-train data sft" in res.output


@pytest.mark.integration
def test_arena_corpus_builds_with_every_task(
    tiny_tokenizer_dir: Path, arena_corpus: Path, tmp_path: Path
) -> None:
    stats = build_sft_data(
        [arena_corpus], tmp_path / "out", opts(tiny_tokenizer_dir, min_reward=1.0)
    )
    assert stats.conversations == 36 and stats.rejections == {}
    assert stats.by_source == {"arenas": 36} and 0 < stats.trained_tokens < stats.tokens
