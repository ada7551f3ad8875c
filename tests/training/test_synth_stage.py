"""The synthesis stages' shared machinery (teacher, concurrent units, resume, shards) and the
tasks stage end to end against the scripted teacher over real HTTP."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from astra_agent.errors import ConfigError
from astra_agent.model import ChatModel, ModelConfig
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from tests.training.conftest import kill_stage_midway, resume_killed_stage
from training.synth.stage import JOURNAL, Shard, UnitsFailed
from training.synth.teacher import ReplyError, Teacher, TeacherConfig, TeacherRejected, parse_reply
from training.synth.text import NearDuplicates, signature, similarity
from training.synth.tools.chains import ToolChain
from training.synth.tools.pool import ToolRecord
from training.synth.tools.tasks import (
    JudgeScores,
    Question,
    TasksConfig,
    bfcl_index,
    bfcl_questions,
    named_tool,
    synth_tasks,
)
from training.testing import Plant, ScriptedTeacher, scripted_teacher_server

MODEL = "scripted-teacher"
TOOLS = [
    {"name": "find_flights", "description": "Search direct flights between two airports."},
    {"name": "book_seat", "description": "Reserve a seat on a chosen flight."},
]
GOOD = '{"question": "Find me a direct flight from Oslo to Rome on May 3 and book a seat."}'


# ------------------------------------------------------------------ the reply parser


@pytest.mark.parametrize(
    "text",
    [
        GOOD,
        f"```json\n{GOOD}\n```",
        f"```\n{GOOD}\n```",
        f"<think>the user wants JSON</think>\n{GOOD}",
        f"reasoning that began in the prompt</think>{GOOD}",
        f"Here it is: {GOOD} Hope that helps!",
        f'{GOOD}\n{{"question": "a second object, ignored"}}',
    ],
)
def test_parser_takes_the_object_out_of_tolerated_shapes(text: str) -> None:
    assert parse_reply(text, Question).question.startswith("Find me a direct flight")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty"),
        ("<think>still thinking when the tokens ran out", "truncated"),
        ("Sure, the question is about flights.", "not_json"),
        ('{"question": "Find me a flight', "truncated"),
        ('{"question": "x" "y"}', "not_json"),
        ('{"question": ' + "9" * 5000 + "}", "not_json"),  # past Python's int digits limit
        ('{"question": ' + "[" * 50_000 + "]" * 50_000 + "}", "too_long"),
        ('{"question": ' + "[" * 20_000 + "]" * 20_000 + "}", "too_deep"),  # decoder recursion
        ('{"question": "a long enough question", "x": ' + "[" * 40 + "]" * 40 + "}", "too_deep"),
        ('{"question": 12345678901}', "schema"),
        ('{"question": ["Find me a flight to Rome"]}', "schema"),
        ('{"question": "Find me a flight to Rome", "answer": "no"}', "schema"),
        ('{"question": "short"}', "schema"),
    ],
)
def test_parser_refuses_unusable_replies(text: str, problem: str) -> None:
    with pytest.raises(ReplyError) as err:
        parse_reply(text, Question)
    assert err.value.problem == problem


def test_schema_is_strict_about_types() -> None:
    scores = {"tool_selection_difficulty": 4, "uniqueness": 4, "question_quality": 4}
    assert parse_reply(json.dumps({**scores, "realism": 5}), JudgeScores).realism == 5
    for bad in ("5", 5.0, 6, True):
        with pytest.raises(ReplyError, match="realism"):
            parse_reply(json.dumps({**scores, "realism": bad}), JudgeScores)


# ------------------------------------------------------------------ the teacher over HTTP

ALWAYS = 1_000_000


@pytest.fixture(scope="module")
def teacher_server() -> Iterator[ScriptedServer]:
    """One server for the many small teacher tests (stopping one takes half a second)."""
    with scripted_teacher_server(ScriptedTeacher(), MODEL) as srv:
        yield srv


@pytest.mark.parametrize(
    ("output", "times", "reason", "requests"),
    [
        (None, 0, None, 1),
        ("fenced", ALWAYS, None, 1),
        ("think", ALWAYS, None, 1),
        ("prose", ALWAYS, None, 1),
        ("not_json", 1, None, 2),
        ("extra_keys", 2, None, 3),
        ("not_json", ALWAYS, "not_json", 3),
        ("truncated", ALWAYS, "truncated", 3),
        ("unclosed_think", ALWAYS, "truncated", 3),
        ("length", ALWAYS, "truncated", 3),
        ("empty", ALWAYS, "empty", 3),
        ("huge", ALWAYS, "too_long", 3),
        ("deep", ALWAYS, "too_deep", 3),
        ("nested", ALWAYS, "too_deep", 3),
        ("wrong_types", ALWAYS, "schema", 3),
    ],
)
async def test_teacher_retries_a_bounded_number_of_times(
    teacher_server: ScriptedServer, output: Any, times: int, reason: str | None, requests: int
) -> None:
    srv = teacher_server
    srv.set_script(ScriptedTeacher(output=output, times=times))
    srv.requests.clear()
    async with ChatModel(ModelConfig(base_url=srv.base_url, model=MODEL)) as model:
        teacher = Teacher(model, TeacherConfig(max_attempts=3, keep_raw_chars=1000))
        ask = teacher.ask("tasks", Question, mode="diverse", tools=TOOLS,
                          tools_json=json.dumps(TOOLS))  # fmt: skip
        if reason is None:
            answer = await ask
            assert answer.attempts == requests
            assert "search direct flights" in answer.value.question
        else:
            with pytest.raises(TeacherRejected) as err:
                await ask
            assert (err.value.reason, err.value.code) == (reason, f"tasks:{reason}")
            assert err.value.attempts == 3
            assert len(err.value.raw_text) <= 1000 + 40  # kept, cut
    sent = srv.requests
    assert len(sent) == requests
    assert teacher.usage["tasks.v1"].calls == requests
    assert teacher.usage["tasks.v1"].prompt_tokens > 0
    assert sent[0]["messages"][0]["content"].startswith("[astra-synth:tasks.v1]\n")
    for n, body in enumerate(sent[1:], start=2):  # each retry: the bad reply and what was wrong
        messages = body["messages"]
        assert len(messages) == 2 * n - 1
        assert messages[-2]["role"] == "assistant" and len(messages[-2]["content"]) < 4100
        assert messages[-1]["content"].startswith("Your reply could not be used:")


# ------------------------------------------------------------------ similarity, tool names


def test_minhash_finds_copies_and_light_edits_not_strangers() -> None:
    a = "Move the final report into the temp folder and then compare it with last year's one"
    index = NearDuplicates(0.7)
    index.add("a", signature(a))
    assert similarity(signature(a), signature(a.upper() + " !")) == 1.0  # words, not case
    hit = index.query(signature(a + " please"))
    assert hit is not None and hit[0] == "a" and hit[1] > 0.8
    assert index.query(signature("Book a table for four at an Italian place near me")) is None
    assert index.query(()) is None


def test_minhash_index_picks_the_most_similar_of_texts_sharing_bands() -> None:
    base = "Move the final report into the temp folder and then compare it with last year's one"
    index = NearDuplicates(0.5)
    for label, text in [("x", base + " now please"), ("y", base), ("z", base + " today")]:
        index.add(label, signature(text))
    index.add("y", signature("Book a table for four"))  # a label is indexed once
    assert len(index) == 3 and index.query(signature(base)) == ("y", 1.0)
    with pytest.raises(ValueError):
        similarity(signature(base), signature(base)[:64])


def test_bfcl_questions_are_found_when_copied() -> None:
    label, text = bfcl_questions()[7]
    index = bfcl_index(0.5, 3)
    assert len(index) == len(bfcl_questions()) > 500
    hit = index.query(signature(f"{text} Thanks a lot!"))
    assert hit is not None and hit[0] == label and hit[1] >= 0.5
    assert index.query(signature("Which seat did I get on my flight to Rome tomorrow?")) is None


@pytest.mark.parametrize(
    ("question", "named"),
    [
        ("Call get_weather for Paris and tell me if I need a coat", "get_weather"),
        ("What's the weather in Paris, do I need a coat?", None),
        ("Use `search` to find cheap flights", "search"),
        ("Run search(flights) for me", "search"),
        ("Could you ask the search tool for cheap flights?", "search"),
        ("Search for cheap flights to Rome next week", None),
        ("Please have the FileSearch find my notes", "fileSearch"),
        ("Check get_weather_v2 output", None),  # another identifier
        ("Ask srv/get_weather about Oslo", "get_weather"),  # the pool id
        ("Call GET_WEATHER for Oslo", "get_weather"),  # case is ignored
        ("Use `\u017fearch` to find flights", "search"),  # long s: an s to re.IGNORECASE
        ("Ask the \u0130\u0131le tool", None),
        ("Use `search` in Zürich", "search"),  # other non-ASCII text around a name
    ],
)
def test_named_tool(question: str, named: str | None) -> None:
    tools = [
        ToolRecord(id="srv/get_weather", server="srv", name="get_weather"),
        ToolRecord(id="srv/search", server="srv", name="search"),
        ToolRecord(id="srv/fileSearch", server="srv", name="fileSearch"),
    ]
    assert named_tool(question, tools) == named


def test_the_characters_that_fold_to_ascii_letters_are_all_known() -> None:
    """named_tool skips a name that cannot be in the question by a plain substring test; the
    test is exact only if it knows every character re.IGNORECASE matches to an ASCII letter
    (and no other character lowercases to one)."""
    import re

    from training.synth.tools.tasks import _FOLDS_TO_ASCII

    letter = re.compile("[a-z]", re.IGNORECASE)
    found = {chr(i) for i in range(128, 0x110000) if letter.match(chr(i))}
    assert found == _FOLDS_TO_ASCII
    lowers_to_ascii = [
        c for c in map(chr, range(128, 0x110000)) if any(ch.isascii() for ch in c.lower())
    ]
    assert set(lowers_to_ascii) <= found


# ------------------------------------------------------------------ a world of chains


def write_world(root: Path, chains: dict[str, list[tuple[str, str]]]) -> tuple[Path, Path]:
    """pool.jsonl and chains.jsonl for chains of (tool name, description)."""
    tools: dict[str, ToolRecord] = {}
    lines = []
    for cid, spec in chains.items():
        for name, desc in spec:
            tools.setdefault(name, ToolRecord(id=f"srv/{name}", server="srv", name=name,
                                              description=desc))  # fmt: skip
        chain = ToolChain(id=cid, tools=[f"srv/{n}" for n, _ in spec], edges=[], scores=[],
                          score=1.0, servers=["srv"])  # fmt: skip
        lines.append(chain.model_dump_json())
    pool, chain_file = root / "pool.jsonl", root / "chains.jsonl"
    pool.write_text("".join(t.model_dump_json() + "\n" for t in tools.values()))
    chain_file.write_text("\n".join(lines) + "\n")
    return chain_file, pool


def random_chains(n: int, seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """Chains of two tools whose descriptions share hardly a word."""
    rng = random.Random(seed)
    vocab = [f"w{rng.getrandbits(40):x}" for _ in range(400)]
    return {
        f"chain-{i:03d}": [(f"tool_{i}_{k}", "Handle " + " ".join(rng.sample(vocab, 8)))
                           for k in range(2)]
        for i in range(n)
    }  # fmt: skip


def config(chains: Path, pool: Path, out: Path, url: str, **kw: Any) -> TasksConfig:
    base = {"decontaminate": False, "concurrency": 4}
    model = {"base_url": url, "model": MODEL, **kw.pop("model", {})}
    return TasksConfig(chains=[chains], pool=[pool], out=out, model=model, **{**base, **kw})


def outputs(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    def read(name: str) -> list[dict[str, Any]]:
        return [json.loads(x) for x in (out / name).read_text().splitlines() if x]

    return read("tasks.jsonl"), read("rejections.jsonl")


# ------------------------------------------------------------------ the tasks stage


async def test_tasks_stage_end_to_end(tmp_path: Path) -> None:
    bfcl_label, bfcl_text = bfcl_questions()[3]
    chains, pool = write_world(
        tmp_path,
        {
            "c-ok1": [("find_flights", "Search direct flights between two airports on a date."),
                      ("book_seat", "Reserve a seat on a chosen flight for one passenger.")],
            "c-ok2": [("get_forecast", "Return the hourly weather forecast for a named city."),
                      ("send_sms", "Send a short text message to a phone number.")],
            "c-dup": [("search_trips", "Search direct flights between two airports on a date."),
                      ("reserve_place", "Reserve a seat on a chosen flight for one passenger.")],
            "c-name": [("lookup_order", "Fetch an online order with its items and status."),
                       ("refund_payment", "Issue a refund for part or all of a card payment.")],
            "c-low": [("list_rooms", "List the meeting rooms free in a building at an hour."),
                      ("book_room", "Book one meeting room for a slot and invite people.")],
            "c-bfcl": [("count_words", "Count the words, lines and characters of a text file."),
                       ("mail_report", "Email a short report to the address of a colleague.")],
            "c-bad": [("convert_money", "Convert an amount of money into another currency."),
                      ("log_expense", "Record an expense with its amount and category.")],
            "c-retry": [("find_recipe", "Find cooking recipes that use a list of ingredients."),
                        ("order_food", "Order the missing ingredients from a grocery store.")],
            "c-judge": [("scan_ports", "Scan the open network ports of a server by its host."),
                        ("open_ticket", "Open a ticket in the security tracker with a level.")],
            "c-unknown": [("find_flights", "")],
        },
    )  # fmt: skip
    lines = chains.read_text().splitlines()
    unknown = json.loads(lines[-1])
    unknown["tools"].append("srv/no_such_tool")
    lines[-1] = json.dumps(unknown)
    chains.write_text("\n".join([*lines, lines[1]]) + "\n")  # and c-ok2 twice
    teacher = ScriptedTeacher(
        plants=[
            Plant("lookup_order", "constrained", question="Use lookup_order to find order 5521 "
                  "and refund the broken lamp in it."),
            Plant("list_rooms", "persona", scores={"realism": 1}),
            Plant("count_words", "diverse", question=bfcl_text),
            Plant("convert_money", "diverse", output="not_json"),
            Plant("find_recipe", output="wrong_types", times=1),
            Plant("scan_ports", "persona", template="tasks_judge", output="extra_keys"),
        ]
    )  # fmt: skip
    with scripted_teacher_server(teacher, MODEL) as srv:
        cfg = config(chains, pool, tmp_path / "out", srv.base_url, decontaminate=True,
                     concurrency=1)  # fmt: skip
        stats = await synth_tasks(cfg)
        sent = len(srv.requests)
    kept, rejected = outputs(cfg.out)
    reasons = Counter(r["reason"] for r in rejected)
    assert reasons == {
        "near_duplicate": 3, "names_tool": 1, "low_score": 1, "contaminated": 1,
        "tasks:not_json": 1, "tasks_judge:schema": 1, "unknown_tool": 1, "duplicate_chain": 1,
    }  # fmt: skip
    assert stats.rejections == dict(sorted(reasons.items()))
    assert len(kept) == stats.questions == 19 and stats.chains == 10
    assert stats.by_mode == {"diverse": 6, "constrained": 7, "persona": 6}
    assert {r["id"] for r in rejected if r["reason"] == "near_duplicate"} == {
        f"c-dup:{m}" for m in ("diverse", "constrained", "persona")
    }
    by_reason = {r["reason"]: r for r in rejected}
    assert by_reason["names_tool"]["id"] == "c-name:constrained"
    assert "lookup_order" in by_reason["names_tool"]["detail"]
    assert bfcl_label in by_reason["contaminated"]["detail"]
    assert by_reason["low_score"]["scores"]["realism"] == 1
    assert by_reason["tasks:not_json"]["raw"].startswith("Sure!")
    assert '"confidence"' in by_reason["tasks_judge:schema"]["raw"]
    # 27 questions + 2 retries (c-bad) + 3 (c-retry); 21 judged + 3 retries + 2 (c-judge)
    assert stats.tokens["tasks.v1"].calls == 32 and stats.tokens["tasks_judge.v1"].calls == 26
    assert sent == 58 and stats.prompt_tokens > 0 and stats.completion_tokens > 0
    realism = stats.scores["realism"]
    assert realism.judged == 20 and realism.histogram == {"1": 1, "4": 19}
    assert realism.kept == 19 and realism.kept_mean == 4.0
    assert stats.scores["tool_selection_difficulty"].histogram == {"4": 20}
    assert stats.bfcl_questions == len(bfcl_questions())
    record = next(r for r in kept if r["id"] == "c-ok1:persona")
    assert record["persona"] and record["tools"] == ["srv/find_flights", "srv/book_seat"]
    prov = record["provenance"]
    assert prov["stage"] == "tasks" and prov["inputs"] == ["c-ok1"] and prov["created"]
    assert prov["prompts"] == {"tasks": "tasks.v1", "tasks_judge": "tasks_judge.v1"}
    assert prov["teacher"]["model"] == MODEL and prov["teacher"]["temperature"] == 0.6
    written = json.loads((cfg.out / "stats.json").read_text())
    assert written["scores"]["realism"]["histogram"] == {"1": 1, "4": 19}
    assert written["params"]["prompts"].keys() == {"tasks.v1", "tasks_judge.v1"}


def test_shards_split_the_ids_exactly() -> None:
    ids = [f"chain-{i}" for i in range(2000)]
    for n in (1, 2, 3, 5):
        owners = Counter(i for k in range(n) for i in ids if Shard(k, n).holds(i))
        assert set(owners) == set(ids) and set(owners.values()) == {1}
    sizes = [sum(Shard(k, 4).holds(i) for i in ids) for k in range(4)]
    assert min(sizes) > 400  # spread, not lumped
    with pytest.raises(ConfigError):
        Shard.parse("2/2")


async def test_sharded_runs_cover_every_chain_once(tmp_path: Path) -> None:
    world = random_chains(24)
    chains, pool = write_world(tmp_path, world)
    seen: Counter[str] = Counter()
    with scripted_teacher_server(ScriptedTeacher(), MODEL) as srv:
        for k in range(2):
            cfg = config(chains, pool, tmp_path / f"shard-{k}", srv.base_url, shard=f"{k}/2",
                         modes=["diverse"])  # fmt: skip
            stats = await synth_tasks(cfg)
            kept, rejected = outputs(cfg.out)
            assert not rejected and stats.chains == len(kept) > 0
            seen.update(r["chain"] for r in kept)
    assert set(seen) == set(world) and set(seen.values()) == {1}


async def test_endpoint_failures_are_not_data(tmp_path: Path) -> None:
    world = random_chains(6, seed=1)
    chains, pool = write_world(tmp_path, world)
    sick = "tool_2_0"
    good = ScriptedTeacher()

    def flaky(body: dict[str, Any]) -> Reply:
        return Reply(status=503) if sick in body["messages"][0]["content"] else good(body)

    with ScriptedServer(flaky, model=MODEL) as srv:
        cfg = config(chains, pool, tmp_path / "out", srv.base_url, modes=["diverse"],
                     model={"max_retries": 0})  # fmt: skip
        with pytest.raises(UnitsFailed, match="1 unit"):
            await synth_tasks(cfg)
        assert not (cfg.out / "stats.json").exists()  # not finished: --resume must do it
        assert len((cfg.out / JOURNAL).read_text().splitlines()) == 5
        srv.set_script(good)
        stats = await synth_tasks(cfg.model_copy(update={"resume": True}))
    kept, rejected = outputs(cfg.out)
    assert sorted(r["chain"] for r in kept) == sorted(world) and not rejected
    assert stats.resumed_units == 5


def test_kill_and_resume_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    world = random_chains(30, seed=2)
    chains, pool = write_world(tmp_path, world)
    out = tmp_path / "out"
    with scripted_teacher_server(ScriptedTeacher(delay_s=0.03), MODEL) as srv:
        args = ["synth", "tasks", "--chains", str(chains), "--pool", str(pool), "--out",
                str(out), "--base-url", srv.base_url, "--model", MODEL, "--modes", "diverse",
                "--no-decontaminate", "--concurrency", "2"]  # fmt: skip
        done = kill_stage_midway(args, out, 4, len(world), torn="chain-999")
        srv.set_script(ScriptedTeacher())
        cfg = config(chains, pool, out, srv.base_url, modes=["diverse"])
        stats, asked = resume_killed_stage(synth_tasks, cfg, "tasks", srv, other={"min_mean": 4.0})
        assert asked == 2 * (len(world) - done)  # only the rest was asked
        after = len(srv.requests)
        kept, rejected = outputs(out)
        assert sorted(r["chain"] for r in kept) == sorted(world) and not rejected
        assert stats.resumed_units == done and stats.questions == len(world)
        assert stats.tokens["tasks.v1"].calls == len(world)  # the killed run's tokens kept
        again = asyncio.run(synth_tasks(cfg.model_copy(update={"resume": True})))
        assert again == stats and len(srv.requests) == after  # a finished run asks nothing
        fresh = asyncio.run(synth_tasks(cfg.model_copy(update={"overwrite": True})))
        assert fresh.resumed_units == 0 and fresh.questions == len(world)
