"""`astra-train synth interact` and `synth judge` against the scripted teacher over real HTTP:
simulated and live MCP tools, injected failures, rejections, kill and resume, judging, and the
judged output read by `astra-train data sft`."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from astra_agent.errors import ConfigError
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from tests.training.conftest import kill_stage_midway, resume_killed_stage
from training.cli import app as train_app
from training.synth.stage import JOURNAL, UnitsFailed
from training.synth.tools.environments import injected
from training.synth.tools.interact import InteractConfig, synth_interact
from training.synth.tools.judge import DIMENSIONS, JudgeConfig, synth_judge
from training.synth.tools.pool import PoolConfig, ToolRecord, build_pool
from training.synth.tools.tasks import TaskRecord, TasksConfig, synth_tasks
from training.testing import ScriptedTeacher, scripted_teacher_server

MODEL = "scripted-teacher"
S = {"type": "string"}


def obj(props: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required)}


SHOP = [
    ToolRecord(id="shop/find_order", server="shop", name="find_order",
               description="Fetch an online order with its items and status.",
               input_schema=obj({"order_id": S}, ["order_id"])),
    ToolRecord(id="shop/refund_order", server="shop", name="refund_order",
               description="Issue a refund for part or all of a card payment.",
               input_schema=obj({"order_id": S, "amount": {"type": "number"}},
                                ["order_id", "amount"])),
    ToolRecord(id="shop/send_receipt", server="shop", name="send_receipt",
               description="Email the receipt of an order to its customer.",
               input_schema=obj({"order_id": S}, ["order_id"])),
    ToolRecord(id="shop/list_stores", server="shop", name="list_stores",
               description="List the stores open in a city.",
               input_schema=obj({"city": S}, ["city"])),
]  # fmt: skip
FIND, REFUND, RECEIPT = "shop/find_order", "shop/refund_order", "shop/send_receipt"


def task(tid: str, question: str, tools: Sequence[str]) -> TaskRecord:
    return TaskRecord(id=tid, chain=tid.split(":")[0], mode="diverse", question=question,
                      tools=list(tools))  # fmt: skip


def refund_question(order: str, receipt: bool = False) -> str:
    tail = ", then email the receipt of an order to its customer" if receipt else ""
    return (f'Fetch an online order with its items and status for order "{order}", then '
            f"issue a refund for part or all of a card payment{tail}.")  # fmt: skip


def write_world(
    root: Path, tasks: Sequence[TaskRecord], tools: Sequence[ToolRecord] = SHOP
) -> tuple[Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    tasks_file, pool_file = root / "tasks.jsonl", root / "pool.jsonl"
    tasks_file.write_text("".join(t.model_dump_json() + "\n" for t in tasks))
    pool_file.write_text("".join(t.model_dump_json() + "\n" for t in tools))
    return tasks_file, pool_file


def config(tasks: Path, pools: Sequence[Path], out: Path, url: str, **kw: Any) -> InteractConfig:
    model = {"base_url": url, "model": MODEL, **kw.pop("model", {})}
    base = {"simulate": True, "failure_rate": 0.0, "concurrency": 4}
    return InteractConfig(tasks=[tasks], pool=list(pools), out=out, model=model, **base | kw)


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x]


def calls(record: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["name"], e["status"]) for e in record["events"]]


def question_of(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return str(users[0].get("content") or "") if users else ""


def with_plants(plants: Callable[[dict[str, Any]], Reply | None]) -> Callable[..., Reply]:
    """The scripted teacher, except where ``plants`` answers a request itself."""
    teacher = ScriptedTeacher()
    return lambda body: plants(body) or teacher(body)


# ------------------------------------------------------------------ simulated tools


async def test_simulated_episodes_follow_the_chain(tmp_path: Path) -> None:
    tasks = [
        task("two:diverse", refund_question("A-5521"), [FIND, REFUND]),
        task("three:diverse", refund_question("B-77", receipt=True), [FIND, REFUND, RECEIPT]),
        task("none:diverse", "What is the capital of Norway, and how old is it?", [FIND, REFUND]),
        task("wrong:diverse", 'List the stores open in a city: "Oslo".', [FIND, REFUND]),
        task("unknown:diverse", refund_question("C-1"), [FIND, "shop/no_such_tool"]),
        task("cut:diverse", refund_question("D-2") + " (cut off)", [FIND, REFUND]),
        task("refused:diverse", refund_question("E-3") + " (refused)", [FIND, REFUND]),
    ]
    tasks_file, pool = write_world(tmp_path, tasks)

    def plants(body: dict[str, Any]) -> Reply | None:
        if body.get("tools") and "(cut off)" in question_of(body):
            return Reply(content="I was about to", finish_reason="length")
        if body.get("tools") and "(refused)" in question_of(body):
            return Reply(status=400)
        return None

    with ScriptedServer(with_plants(plants), model=MODEL) as srv:
        cfg = config(tasks_file, [pool], tmp_path / "out", srv.base_url)
        stats = await synth_interact(cfg)
        sent = list(srv.requests)
    kept = {r["id"]: r for r in read(cfg.out / "interactions.jsonl")}
    rejected = {r["id"]: r for r in read(cfg.out / "rejections.jsonl")}
    assert set(kept) == {"two:diverse", "three:diverse"}
    assert calls(kept["two:diverse"]) == [("find_order", "ok"), ("refund_order", "ok")]
    assert [n for n, _ in calls(kept["three:diverse"])] == [
        "find_order", "refund_order", "send_receipt"]  # fmt: skip
    assert {k: v["reason"] for k, v in rejected.items()} == {
        "none:diverse": "no_tool_call", "wrong:diverse": "off_chain",
        "unknown:diverse": "unknown_tool", "cut:diverse": "episode_limit",
        "refused:diverse": "episode_error",
    }  # fmt: skip
    assert rejected["none:diverse"]["raw"].startswith("I cannot help")
    assert "list_stores" in rejected["wrong:diverse"]["detail"]
    assert rejected["cut:diverse"]["detail"].startswith("length")
    assert "model_error" in rejected["refused:diverse"]["detail"]
    assert stats.rejections == dict(sorted(Counter(r["reason"] for r in rejected.values()).items()))

    two = kept["two:diverse"]
    messages = two["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool",
                                             "assistant"]  # fmt: skip
    args = [json.loads(m["tool_calls"][0]["function"]["arguments"]) for m in messages
            if m.get("tool_calls")]  # fmt: skip
    assert args == [{"order_id": "A-5521"}, {"order_id": "A-5521", "amount": 1}]
    found = json.loads(messages[2]["content"])  # the teacher playing find_order
    assert found["order_id"] == "A-5521" and found["id"].startswith("find_order-")
    assert messages[-1]["content"].startswith("Here is what I found")
    assert [t["function"]["name"] for t in two["tools"]] == [t.name for t in SHOP]  # the server's
    meta = two["metadata"]
    assert meta["chain_names"] == ["find_order", "refund_order"] and meta["tools"] == [FIND, REFUND]
    assert meta["environment"] == "simulated" and meta["injected_failures"] == []
    prov = meta["provenance"]
    assert prov["stage"] == "interact" and prov["inputs"] == ["two:diverse"]
    assert prov["prompts"] == {"simulate_tool": "simulate_tool.v1"}
    assert prov["teacher"]["model"] == MODEL and prov["detail"]["simulated_calls"] == 2

    simulated = [question_of(b) for b in sent if not b.get("tools")]
    assert len(simulated) == 2 + 3 + 1 == stats.tokens["simulate_tool.v1"].calls  # wrong: 1
    history = next(p for p in simulated if 'Arguments (JSON): {"order_id": "A-5521", "am' in p)
    assert 'find_order({"order_id": "A-5521"}) returned:' in history  # earlier calls shown
    agent_requests = [b for b in sent if b.get("tools")]
    assert len(agent_requests) == 3 + 4 + 1 + 2 + 1 + 1
    assert stats.tokens["agent"].calls == len(agent_requests) - 1  # the refused one: no reply
    assert stats.by_environment == {"simulated": 2} and stats.by_status == {"ok": 5}
    assert stats.prompt_tokens > 0 and stats.calls == 5


async def test_offering_only_the_chain(tmp_path: Path) -> None:
    tasks = [task("wrong:diverse", 'List the stores open in a city: "Oslo".', [FIND, REFUND])]
    tasks_file, pool = write_world(tmp_path, tasks)
    with scripted_teacher_server(ScriptedTeacher(), MODEL) as srv:
        cfg = config(tasks_file, [pool], tmp_path / "out", srv.base_url, offer="chain")
        await synth_interact(cfg)
        offered = [t["function"]["name"] for t in srv.requests[0]["tools"]]
    assert offered == ["find_order", "refund_order"]
    assert [r["reason"] for r in read(cfg.out / "rejections.jsonl")] == ["no_tool_call"]


async def test_simulated_replies_are_validated(tmp_path: Path) -> None:
    returns = obj({"status": S, "total": {"type": "number"}}, ["status", "total"])
    tools = [SHOP[0].model_copy(update={"output_schema": returns}), *SHOP[1:]]
    tasks = [task(f"{name}:diverse", refund_question(order), [FIND, REFUND])
             for name, order in (("bad", "Z-1"), ("fixed", "Z-2"), ("text", "Z-3"))]  # fmt: skip
    tasks_file, pool = write_world(tmp_path, tasks, tools)

    def plants(body: dict[str, Any]) -> Reply | None:
        text = question_of(body)
        if not text.startswith("[astra-synth:simulate_tool"):
            return None
        attempt = sum(m.get("role") == "user" for m in body["messages"])
        call = text[text.rindex("Tool (JSON):") :]
        if '"Z-1"' in call:
            return Reply(content="The order is fine.")
        if '"Z-2"' in call and '"name": "find_order"' in call and attempt == 1:
            return Reply(content='{"error": false, "output": {"status": "shipped"}}')
        if '"Z-3"' in call and '"name": "refund_order"' in call:
            return Reply(content='{"error": true, "output": "Error: the refund window closed"}')
        return None

    with ScriptedServer(with_plants(plants), model=MODEL) as srv:
        cfg = config(tasks_file, [pool], tmp_path / "out", srv.base_url)
        stats = await synth_interact(cfg)
        retry = next(b for b in srv.requests if len(b["messages"]) == 3 and '"Z-2"' in str(b))
    kept = {r["id"]: r for r in read(cfg.out / "interactions.jsonl")}
    (bad,) = read(cfg.out / "rejections.jsonl")
    assert (bad["id"], bad["reason"]) == ("bad:diverse", "simulate_tool:not_json")
    assert bad["raw"] == "The order is fine."
    assert "total" in retry["messages"][-1]["content"]  # told what the output schema lacks
    found = json.loads(kept["fixed:diverse"]["messages"][2]["content"])
    assert set(found) == {"status", "total"}  # built from the output schema
    text = kept["text:diverse"]
    assert calls(text) == [("find_order", "ok")] + [("refund_order", "tool_error")] * 2
    assert text["messages"][4]["content"] == "Error: the refund window closed"
    assert text["metadata"]["injected_failures"] == []  # the tool's own error, not injected
    # bad: 3 tries, then no more asking (the episode is lost); fixed: 2 + 1; text: 1 + 2
    assert stats.tokens["simulate_tool.v1"].calls == 3 + (2 + 1) + (1 + 2)


# ------------------------------------------------------------------ injected failures


def injected_calls(record: dict[str, Any]) -> list[int]:
    return [f["call"] for f in record["metadata"]["injected_failures"]]


async def test_failure_injection_is_seeded_and_shows_recovery(tmp_path: Path) -> None:
    tasks = [task(f"t{i}:diverse", refund_question(f"Q-{i}"), [FIND, REFUND]) for i in range(10)]
    tasks_file, pool = write_world(tmp_path, tasks)
    with scripted_teacher_server(ScriptedTeacher(), MODEL) as srv:
        run = lambda out, **kw: asyncio.run(synth_interact(  # noqa: E731
            config(tasks_file, [pool], tmp_path / out, srv.base_url, **kw)))  # fmt: skip
        await asyncio.to_thread(run, "all", failure_rate=1.0)
        await asyncio.to_thread(run, "none", failure_rate=0.0)
        stats = await asyncio.to_thread(run, "some", failure_rate=0.2, seed=3)
        await asyncio.to_thread(run, "again", failure_rate=0.2, seed=3)
        await asyncio.to_thread(run, "other", failure_rate=0.2, seed=4)
    every = read(tmp_path / "all" / "interactions.jsonl")
    assert len(every) == 10
    for r in every:  # each call fails, is retried once, then the plan moves on
        assert calls(r) == [("find_order", "tool_error")] * 2 + [("refund_order", "tool_error")] * 2
        assert injected_calls(r) == [0, 1, 2, 3]
        assert [f["event"] for f in r["metadata"]["injected_failures"]] == [0, 1, 2, 3]
        assert r["messages"][2]["content"].startswith("Error:")
        assert r["messages"][-1]["content"].startswith("I could not finish")
    for r in read(tmp_path / "none" / "interactions.jsonl"):
        assert calls(r) == [("find_order", "ok"), ("refund_order", "ok")]
        assert injected_calls(r) == []

    some = {r["id"]: r for r in read(tmp_path / "some" / "interactions.jsonl")}
    again = {r["id"]: r for r in read(tmp_path / "again" / "interactions.jsonl")}
    other = {r["id"]: r for r in read(tmp_path / "other" / "interactions.jsonl")}
    for tid, r in some.items():  # exactly the calls the seeded draw picks, in every run
        expected = [i for i in range(len(r["events"])) if injected(0.2, 3, tid, i)]
        assert injected_calls(r) == expected == injected_calls(again[tid])
        assert calls(r) == calls(again[tid])
    assert sum(map(len, map(injected_calls, some.values()))) == stats.injected > 0
    assert {k: injected_calls(v) for k, v in some.items()} != {
        k: injected_calls(v) for k, v in other.items()}  # fmt: skip
    recovered = [f for r in some.values() for f in r["metadata"]["injected_failures"]
                 if f["recovered"]]  # fmt: skip
    assert recovered and len(recovered) == stats.recovered
    f = recovered[0]
    r = next(r for r in some.values() if f in r["metadata"]["injected_failures"])
    assert r["events"][f["event"]]["status"] == "tool_error"
    retry = r["events"][f["event"] + 1]
    assert (retry["name"], retry["status"]) == (f["tool"], "ok")  # the retry worked


# ------------------------------------------------------------------ live MCP servers


@pytest.mark.integration
def test_live_mcp_server_and_mixed_episodes(tmp_path: Path) -> None:
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {"time": {"command": "mcp-server-time",
                                                        "env": {"TZ": "UTC"}}}}))  # fmt: skip
    build_pool(PoolConfig(out=tmp_path / "pool", mcp_config=mcp))
    calendar = ToolRecord(id="calendar/add_event", server="calendar", name="add_event",
                          description="Add an event to the team calendar.",
                          input_schema=obj({"title": S}, ["title"]))  # fmt: skip
    tasks = [
        task("live:diverse", 'Please get current time in a specific timezone for "Europe/Oslo", '
             'then convert time between timezones: "14:30" there into "Asia/Tokyo".',
             ["time/get_current_time", "time/convert_time"]),
        task("mixed:diverse", 'Get current time in a specific timezone for "Asia/Tokyo", then '
             'add an event to the team calendar called "Standup".',
             ["time/get_current_time", "calendar/add_event"]),
    ]  # fmt: skip
    tasks_file, extra = write_world(tmp_path / "w", tasks, [calendar])
    pools = [tmp_path / "pool", extra]
    with scripted_teacher_server(ScriptedTeacher(), MODEL) as srv:
        cfg = config(tasks_file, pools, tmp_path / "out", srv.base_url, mcp_config=mcp)
        stats = asyncio.run(synth_interact(cfg))
        simulated = [question_of(b) for b in srv.requests if not b.get("tools")]
        live_only = config(tasks_file, pools, tmp_path / "live", srv.base_url, mcp_config=mcp,
                           simulate=False)  # fmt: skip
        asyncio.run(synth_interact(live_only))
    kept = {r["id"]: r for r in read(cfg.out / "interactions.jsonl")}
    live = kept["live:diverse"]
    assert calls(live) == [("get_current_time", "ok"), ("convert_time", "ok")]
    args = [json.loads(e["arguments"]) for e in live["events"]]
    assert args == [{"timezone": "Europe/Oslo"},
                    {"source_timezone": "Europe/Oslo", "time": "14:30",
                     "target_timezone": "Asia/Tokyo"}]  # fmt: skip
    results = [m["content"] for m in live["messages"] if m["role"] == "tool"]
    assert '"timezone": "Europe/Oslo"' in results[0] or "Europe/Oslo" in results[0]
    assert "Asia/Tokyo" in results[1] and "time_difference" in results[1]  # the real server
    assert live["metadata"]["environment"] == "live" and live["metadata"]["simulated"] == []
    mixed = kept["mixed:diverse"]
    assert calls(mixed) == [("get_current_time", "ok"), ("add_event", "ok")]
    assert mixed["metadata"]["environment"] == "mixed"
    assert mixed["metadata"]["simulated"] == ["add_event"]
    assert len(simulated) == 1 and 'Tool (JSON): {"name": "add_event"' in simulated[0]
    assert stats.servers_live == ["time"] and stats.by_environment == {"live": 1, "mixed": 1}
    assert [r["id"] for r in read(tmp_path / "live" / "interactions.jsonl")] == ["live:diverse"]
    (refused,) = read(tmp_path / "live" / "rejections.jsonl")
    assert refused["reason"] == "server_unavailable" and "calendar/add_event" in refused["detail"]


# ------------------------------------------------------------------ endpoint failures, resume


async def test_endpoint_failures_leave_the_task_undone(tmp_path: Path) -> None:
    tasks = [task(f"t{i}:diverse", refund_question(f"Q-{i}"), [FIND, REFUND]) for i in range(4)]
    tasks_file, pool = write_world(tmp_path, tasks)

    def plants(body: dict[str, Any]) -> Reply | None:  # the agent's, the simulator's endpoint
        if body.get("tools") and '"Q-0"' in question_of(body) and len(body["messages"]) > 1:
            return Reply(status=503)
        return Reply(status=503) if not body.get("tools") and '"Q-2"' in str(body) else None

    with ScriptedServer(with_plants(plants), model=MODEL) as srv:
        cfg = config(tasks_file, [pool], tmp_path / "out", srv.base_url,
                     model={"max_retries": 0})  # fmt: skip
        with pytest.raises(UnitsFailed, match="2 unit"):
            await synth_interact(cfg)
        assert len((cfg.out / JOURNAL).read_text().splitlines()) == 2
        srv.set_script(ScriptedTeacher())
        stats = await synth_interact(cfg.model_copy(update={"resume": True}))
    assert sorted(r["id"] for r in read(cfg.out / "interactions.jsonl")) == [t.id for t in tasks]
    assert stats.resumed_units == 2 and not stats.rejections


def test_kill_and_resume_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    tasks = [task(f"t{i:02d}:diverse", refund_question(f"K-{i}"), [FIND, REFUND])
             for i in range(24)]  # fmt: skip
    tasks_file, pool = write_world(tmp_path, tasks)
    out = tmp_path / "out"
    with scripted_teacher_server(ScriptedTeacher(delay_s=0.03), MODEL) as srv:
        args = ["synth", "interact", "--tasks", str(tasks_file), "--pool", str(pool), "--out",
                str(out), "--base-url", srv.base_url, "--model", MODEL, "--simulate",
                "--failure-rate", "0.3", "--seed", "5", "--concurrency", "2"]  # fmt: skip
        done = kill_stage_midway(args, out, 3, len(tasks), torn="t99:diverse")
        srv.set_script(ScriptedTeacher())
        cfg = config(tasks_file, [pool], out, srv.base_url, failure_rate=0.3, seed=5)
        stats, _ = resume_killed_stage(synth_interact, cfg, "interact", srv, other={"seed": 6})
        fresh = asyncio.run(
            synth_interact(
                config(
                    tasks_file, [pool], tmp_path / "fresh", srv.base_url, failure_rate=0.3, seed=5
                )
            )
        )
    resumed = read(out / "interactions.jsonl")
    assert sorted(r["id"] for r in resumed) == [t.id for t in tasks]  # each once
    assert stats.resumed_units == done and stats.trajectories == len(tasks)
    by_id = {r["id"]: r for r in read(tmp_path / "fresh" / "interactions.jsonl")}
    for r in resumed:  # the same episodes as an uninterrupted run, injected failures included
        assert calls(r) == calls(by_id[r["id"]]) and injected_calls(r) == injected_calls(
            by_id[r["id"]]
        )
    assert stats.injected == fresh.injected and stats.calls == fresh.calls
    assert stats.tokens["agent"].calls == fresh.tokens["agent"].calls  # the killed run's kept


# ------------------------------------------------------------------ judging, then SFT data


async def test_judge_keeps_the_good_and_feeds_data_sft(
    tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    tasks = [task(f"j{i}:diverse", refund_question(f"J-{i}"), [FIND, REFUND]) for i in range(6)]
    tasks_file, pool = write_world(tmp_path, tasks)
    low = dict.fromkeys(DIMENSIONS, 2) | {"reason": "weak"}
    unsure = dict.fromkeys(DIMENSIONS, 5) | {"call_success": 1, "reason": "calls failed"}

    def plants(body: dict[str, Any]) -> Reply | None:
        text = question_of(body)
        if not text.startswith("[astra-synth:trajectory_judge"):
            return None
        attempt = sum(m.get("role") == "user" for m in body["messages"])
        if '"J-1"' in text:
            return Reply(content=json.dumps(low))
        if '"J-2"' in text:
            return Reply(content="This session looks fine to me.")
        if '"J-3"' in text and attempt == 1:
            return Reply(content='{"call_conciseness": 5')
        if '"J-4"' in text:
            return Reply(content=json.dumps(unsure))
        return None

    with ScriptedServer(with_plants(plants), model=MODEL) as srv:
        icfg = config(tasks_file, [pool], tmp_path / "interact", srv.base_url, failure_rate=0.3)
        await synth_interact(icfg)
        before = len(srv.requests)
        cfg = JudgeConfig(interactions=[icfg.out], out=tmp_path / "judged",
                          model={"base_url": srv.base_url, "model": MODEL})  # fmt: skip
        stats = await synth_judge(cfg)
        judge_prompt = question_of(srv.requests[before])
    kept = {r["id"]: r for r in read(cfg.out / "trajectories.jsonl")}
    rejected = {r["id"]: r for r in read(cfg.out / "rejections.jsonl")}
    assert set(kept) == {"j0:diverse", "j3:diverse", "j5:diverse"}
    assert {k: v["reason"] for k, v in rejected.items()} == {
        "j1:diverse": "low_score", "j2:diverse": "trajectory_judge:not_json",
        "j4:diverse": "low_score"}  # fmt: skip
    assert rejected["j1:diverse"]["scores"]["overall"] == 2.0
    assert "overall 2 < 3.5" in rejected["j1:diverse"]["detail"]
    assert rejected["j4:diverse"]["detail"] == "call_success 1 < 2"  # overall 4.43: each counts
    assert rejected["j2:diverse"]["raw"] == "This session looks fine to me."
    assert "Calls (JSON, in order):" in judge_prompt and '"J-' in judge_prompt
    assert "It called find_order with" in judge_prompt
    assert "The assistant's final answer:" in judge_prompt
    record = kept["j3:diverse"]
    scores = record["metadata"]["scores"]
    assert set(scores) == {*DIMENSIONS, "overall"} and scores["overall"] >= 3.5
    assert record["metadata"]["provenance"]["stage"] == "judge"
    assert record["metadata"]["provenance"]["detail"]["attempts"] == 2  # retried, then kept
    assert record["metadata"]["interact_provenance"]["stage"] == "interact"
    assert record["metadata"]["task"] == "j3:diverse"
    assert stats.kept == 3 and stats.judged == 5 and stats.trajectories == 6
    assert stats.tokens["trajectory_judge.v1"].calls == 6 + 2 + 1  # j2 thrice, j3 twice
    assert stats.scores["overall"].judged == 5 and stats.scores["overall"].kept == 3
    assert stats.scores["call_success"].histogram.get("1") == 1
    written = json.loads((cfg.out / "stats.json").read_text())
    assert written["thresholds"]["min_score"] == 3.5 and written["scores"]["overall"]["judged"] == 5

    sft = tmp_path / "sft"
    result = CliRunner().invoke(train_app, ["data", "sft", str(cfg.out / "trajectories.jsonl"),
                                            "--out", str(sft), "--tokenizer",
                                            str(tiny_tokenizer_dir)])  # fmt: skip
    assert result.exit_code == 0, result.output
    table = pq.read_table(sft / "sft.parquet")
    assert table.num_rows == len(kept)
    assert sorted(table.column("id").to_pylist()) == sorted(kept)
    assert json.loads((sft / "stats.json").read_text())["rejections"] == {}


async def test_from_the_tasks_stage_to_judged_trajectories(tmp_path: Path) -> None:
    _, pool = write_world(tmp_path, [])
    chains = tmp_path / "chains.jsonl"
    chain = {"tools": [FIND, REFUND, RECEIPT], "edges": [], "scores": [], "score": 1.0,
             "servers": ["shop"]}  # fmt: skip
    chains.write_text(json.dumps({"id": "c1", **chain}) + "\n")
    with scripted_teacher_server(ScriptedTeacher(), MODEL) as srv:
        model = {"base_url": srv.base_url, "model": MODEL}
        tasks = await synth_tasks(TasksConfig(chains=[chains], pool=[pool], out=tmp_path / "t",
                                              model=model, decontaminate=False))  # fmt: skip
        icfg = config(tmp_path / "t", [pool], tmp_path / "i", srv.base_url)
        interactions = await synth_interact(icfg)
        judged = await synth_judge(JudgeConfig(interactions=[icfg.out], out=tmp_path / "j",
                                               model=model))  # fmt: skip
    assert tasks.questions == interactions.tasks == interactions.trajectories == 3
    for r in read(tmp_path / "j" / "trajectories.jsonl"):
        names = [n for n, _ in calls(r)]
        # the scripted constrained question names the first and the last tool only
        assert names == (["find_order", "send_receipt"] if r["id"].endswith(":constrained")
                         else ["find_order", "refund_order", "send_receipt"])  # fmt: skip
    assert judged.kept == 3
    with pytest.raises(ConfigError, match="holds a interact run, not a tasks run"):
        await synth_interact(config(tmp_path / "i", [pool], tmp_path / "x", srv.base_url))


def test_cli_help_shows_examples() -> None:
    for command in ("interact", "judge"):
        result = CliRunner().invoke(train_app, ["synth", command, "--help"],
                                    env={"COLUMNS": "200"})  # fmt: skip
        assert result.exit_code == 0 and "Example: astra-train synth " + command in result.output


def test_interact_needs_live_or_simulated_tools(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mcp_config"):
        InteractConfig(tasks=[tmp_path], pool=[tmp_path], out=tmp_path / "o")
