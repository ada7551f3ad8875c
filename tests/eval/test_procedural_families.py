"""The procedural arenas' general task families (``eval/arenas/procedural/families.py``): the
tools check and normalise typed arguments; each family's gold calls solve it in the sandbox and
a wrong argument does not; a task no offered function serves scores 1.0 with no call and 0.0
with one; the splits keep their meaning; nothing of BFCL's installed data is in what they
generate."""

from __future__ import annotations

import asyncio
import json
import random
import re
from typing import Any

import pytest

from astra_agent.arena import ArenaEnvironment, ArenaTask, arena_reward, parse_record
from astra_agent.errors import ConfigError
from eval.arenas import validate_arenas
from eval.arenas.procedural.arguments import other
from eval.arenas.procedural.catalog import Catalog, Param, load_catalog
from eval.arenas.procedural.families import GENERAL, Writer
from eval.arenas.procedural.generator import (
    FAMILIES,
    KINDS,
    GenSpec,
    generate,
    load_domains,
    signature_heldout,
    split_domains,
    write_arenas,
)
from eval.arenas.procedural.runtime import answer

SPEC = GenSpec(seed=7, train_tasks=80, eval_tasks=16, families=list(GENERAL))
MIXED = GenSpec(seed=1, train_tasks=300, eval_tasks=40, families=list(FAMILIES))


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="module")
def splits() -> dict[str, list[dict[str, Any]]]:
    return generate(SPEC)


@pytest.fixture(scope="module")
def mixed() -> dict[str, list[dict[str, Any]]]:
    return generate(MIXED)


def tasks_of(splits: dict[str, list[dict[str, Any]]], family: str, n: int) -> list[ArenaTask]:
    """Up to ``n`` tasks of ``family`` from training and one from split c, as loaded."""
    records = [r for r in splits["train"] if r["kind"] == family][:n]
    records += [r for r in splits["c"] if r["kind"] == family][:1]
    out = []
    for i, r in enumerate(records):
        task, problems = parse_record(r, i)
        assert task is not None and not problems, problems
        out.append(task)
    return out


async def outputs(env: ArenaEnvironment, calls: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(name, output) of each call, in a fresh state of the task's sandbox."""
    await env.reset()
    return [(c["name"], (await env.call_tool(c["name"], c["arguments"])).text) for c in calls]


# --------------------------------------------------------------------------- the tools


def test_a_tool_normalises_its_arguments_and_refuses_bad_ones(catalog: Catalog) -> None:
    spec = catalog.function("schedule_team_meeting").runtime_spec()
    args = {
        "title": "Budget sign-off",
        "meeting_date": "2026-03-05",
        "start_time": "14:30",
        "duration_minutes": 60,
        "attendees": ["Ada Novak", "Hugo Sato"],
        "agenda": ["planning", "writing"],
    }
    gold = answer(spec, [], args)
    code = gold["meeting_code"]

    def code_of(**change: Any) -> Any:
        return answer(spec, [], {**args, **change}).get("meeting_code", "error")

    # the same call, written differently: case, spaces, an unordered list, defaults, 60.0
    assert code_of(title="  budget   SIGN-OFF ") == code
    assert code_of(attendees=["hugo sato", "Ada Novak"]) == code
    assert code_of(video_call=True) == code_of(video_call=None) == code
    assert code_of(duration_minutes=60.0) == code
    # another call: another receipt (an ordered list's order counts)
    for change in (
        {"agenda": ["writing", "planning"]},
        {"video_call": False},
        {"duration_minutes": 45},
        {"attendees": ["Ada Novak", "Hugo Sato", "Wen Sato"]},
        {"meeting_date": "2026-03-06"},
    ):
        assert code_of(**change) not in (code, "error"), change
    # what the request wrote is not what the tool takes: an error naming the argument
    for change, says in (
        ({"meeting_date": "March 5, 2026"}, "meeting_date: expected a date as YYYY-MM-DD"),
        ({"start_time": "2:30 pm"}, "start_time: expected a 24-hour time as HH:MM"),
        ({"duration_minutes": "60"}, "duration_minutes: expected an integer"),
        ({"duration_minutes": 600}, "duration_minutes: expected a value from 15 to 120"),
        ({"video_call": "yes"}, "video_call: expected true or false"),
        ({"attendees": "Ada Novak and Hugo Sato"}, "attendees: expected a list of 2 to 4"),
    ):
        reply = answer(spec, [], {**args, **change})
        assert says in reply["error"] and "meeting_code" not in reply, change


def test_objects_and_enums_are_checked_field_by_field(catalog: Catalog) -> None:
    spec = catalog.function("dispatch_parcel").runtime_spec()
    to = {"name": "Ada Novak", "street": "7 Mill Road", "postcode": "0614", "city": "Porto"}
    code = answer(spec, [], {"recipient": to, "weight_kg": 2.5})["tracking_number"]
    assert answer(spec, [], {"recipient": to, "weight_kg": 2.50})["tracking_number"] == code
    assert answer(spec, [], {"recipient": {**to, "city": "Lyon"}, "weight_kg": 2.5}).get(
        "tracking_number"
    ) not in (code, None)
    for bad, says in (
        ({**to, "country": "Portugal"}, "recipient: unknown field(s) country"),
        ({k: v for k, v in to.items() if k != "city"}, "recipient: missing field(s) city"),
        ("Ada Novak, 7 Mill Road, 0614 Porto", "recipient: expected an object"),
    ):
        assert says in answer(spec, [], {"recipient": bad, "weight_kg": 2.5})["error"]
    room = catalog.function("reserve_guest_room").runtime_spec()
    base = {"guest_name": "Ada Novak", "arrival": "2026-02-01", "nights": 2}
    suite = answer(room, [], {**base, "room_type": "suite"})["reservation_code"]
    assert answer(room, [], {**base, "room_type": "Suite"})["reservation_code"] == suite
    loft = answer(room, [], {**base, "room_type": "loft"})
    assert "room_type: expected one of single, double, twin, suite" in loft["error"]


def test_the_batch_code_holds_every_distinct_call_in_any_order(catalog: Catalog) -> None:
    spec = catalog.function("block_focus_time").runtime_spec()
    calls = [{"day": "2026-05-0" + str(d), "hours": 2} for d in (1, 2, 3)]
    forward: list[str] = []
    last = [answer(spec, forward, c)["batch"] for c in calls][-1]
    backward: list[str] = []
    assert [answer(spec, backward, c)["batch"] for c in reversed(calls)][-1] == last
    extra: list[str] = []
    for c in [*calls, {"day": "2026-05-04", "hours": 2}]:
        reply = answer(spec, extra, c)
    assert reply["batch"] != last and reply["calls_in_batch"] == 4
    refused: list[str] = []  # an invalid call is not part of the batch
    for c in [*calls, {"day": "May 4", "hours": 2}]:
        answer(spec, refused, c)
    assert answer(spec, refused, calls[0])["batch"] == last


# --------------------------------------------------------------------------- the reward


def test_no_sub_question_scores_one_without_a_call_and_zero_with_one() -> None:
    none = arena_reward({}, [])
    assert (none.reward, none.recall, none.precision, none.required) == (1.0, 1.0, 1.0, 0)
    assert none.fully_solved
    for calls in ([("any_tool", '{"status": "done"}')], [("a", ""), ("b", "x")]):
        r = arena_reward({}, calls)
        assert r.reward == 0.0 and r.precision == 0.0 and not r.fully_solved
        assert r.tool_calls == len(calls)


def test_an_empty_sub_qa_dict_loads_as_a_task_with_no_sub_question(
    splits: dict[str, list[dict[str, Any]]],
) -> None:
    record = next(r for r in splits["train"] if r["kind"] == "none")
    task, problems = parse_record(record, 0)
    assert task is not None and not problems and task.sub_qa == {} and task.reference == []
    _, problems = parse_record({**record, "sub_qa_dict": "[]"}, 3)
    assert [str(p) for p in problems] == ["record 3, sub_qa_dict: must be a mapping"]


# --------------------------------------------------------------------------- gold and wrong


def _unnormalised(p: Param, value: Any) -> Any:
    """``value`` as a request might write it, which the tool must refuse."""
    if p.type == "date":
        return value.replace("-", "/")
    if p.type == "time":
        h, m = int(value[:2]), value[3:]
        return f"{(h - 1) % 12 + 1}:{m} {'am' if h < 12 else 'pm'}"
    if p.type in ("int", "float"):
        return str(value)
    if p.type == "bool":
        return "yes" if value else "no"
    if p.type == "enum":
        return f"{value} please"
    if p.type == "list":
        return ", ".join(map(str, value))
    if p.type == "object":
        return ", ".join(map(str, value.values()))
    return [value]


def wrong_calls(
    task: ArenaTask, catalog: Catalog, rng: random.Random
) -> list[list[dict[str, Any]]]:
    """The reference with one argument of one call wrong: another valid value, and the value
    as the request wrote it (not normalised)."""
    ref = task.reference or []
    i = rng.randrange(len(ref))
    fn = catalog.function(ref[i]["name"])
    p = rng.choice([q for q in fn.params if q.name in ref[i]["arguments"]])
    value = ref[i]["arguments"][p.name]
    out = []
    for bad in (other(p, value, catalog, rng), _unnormalised(p, value)):
        calls = [dict(c, arguments=dict(c["arguments"])) for c in ref]
        calls[i]["arguments"][p.name] = bad
        out.append(calls)
    return out


@pytest.mark.parametrize("family", [f for f in GENERAL if f != "none"])
def test_each_family_s_gold_calls_solve_it_and_a_wrong_argument_does_not(
    family: str, splits: dict[str, list[dict[str, Any]]], catalog: Catalog
) -> None:
    rng = random.Random(family)

    async def check(task: ArenaTask) -> None:
        async with ArenaEnvironment(task) as env:
            gold = arena_reward(task.sub_qa, await outputs(env, task.reference or []))
            k = len(task.reference or [])
            # one sub-question per tool (ASTRA's format): k calls of one tool can reach only
            # precision 1/k, so a parallel task's gold scores F1 = 2/(k+1), fully solved
            best = 2 / (k + 1) if family == "parallel" else 1.0
            assert gold.fully_solved and gold.reward == pytest.approx(best, abs=1e-5)
            for calls in wrong_calls(task, catalog, rng):
                bad = arena_reward(task.sub_qa, await outputs(env, calls))
                assert not bad.fully_solved and bad.reward < gold.reward, calls

    tasks = tasks_of(splits, family, 3)
    assert len(tasks) >= 3
    for task in tasks:
        asyncio.run(check(task))


def test_a_no_call_task_scores_one_with_no_call_and_zero_with_a_call(
    splits: dict[str, list[dict[str, Any]]], catalog: Catalog
) -> None:
    writer = Writer(catalog, random.Random(5))

    async def check(task: ArenaTask) -> None:
        assert not task.sub_qa and not task.reference
        assert arena_reward(task.sub_qa, []).reward == 1.0
        offered = catalog.function(task.tools[0].name)
        async with ArenaEnvironment(task) as env:
            calls = await outputs(env, [{"name": offered.name, "arguments": writer.args(offered)}])
        assert '"status"' in calls[0][1]  # a valid call, answered: still the wrong thing to do
        r = arena_reward(task.sub_qa, calls)
        assert r.reward == 0.0 and not r.fully_solved

    tasks = tasks_of(splits, "none", 2)
    assert len(tasks) >= 2
    for task in tasks:
        asyncio.run(check(task))


def test_generated_general_tasks_validate_in_the_sandbox(tmp_path: Any) -> None:
    """``astra-eval arenas validate``'s checks (blind calls, answers in arguments, conduct)
    pass; the only warning is that a no-call task has no reference chain to run."""
    spec = GenSpec(seed=11, train_tasks=21, eval_tasks=7, families=list(GENERAL))
    path = write_arenas(tmp_path / "gen", spec)["b"]
    report, failures, warnings = asyncio.run(validate_arenas(path))
    assert report.records == len(report.tasks) == 7 and not report.problems
    assert not failures
    n_none = sum(1 for t in report.tasks if not t.sub_qa)
    assert len(warnings) == n_none and all("no reference chain" in w for w in warnings)


# --------------------------------------------------------------------------- the splits


def _tool_names(records: list[dict[str, Any]]) -> set[str]:
    return {t["function"]["name"] for r in records for t in json.loads(r["tool_schema"])}


def test_the_general_families_keep_the_splits_meaning(
    mixed: dict[str, list[dict[str, Any]]], catalog: Catalog
) -> None:
    _, held = split_domains(MIXED, load_domains())
    held_names = {d.name for d in held} | {s.name for s in catalog.services if s.heldout}
    assert not {r["domain"] for r in mixed["train"]} & held_names
    assert {r["domain"] for r in mixed["c"]} <= held_names
    assert not any(signature_heldout(r["signature"], 20) for r in mixed["train"])
    assert all(signature_heldout(r["signature"], 20) for r in mixed["b"])
    general = [r for r in mixed["train"] if "instance" in r]
    values = {r["instance"] for r in general}
    assert not values & {r["instance"] for r in mixed["a"] if "instance" in r}
    # split c: no word of its function names (the verb aside) is offered in training
    words = {w for t in _tool_names(mixed["train"]) for w in t.split("_")[1:]}
    for t in _tool_names(mixed["c"]):
        assert not set(t.split("_")[1:]) & words, t
    for split in ("a", "b", "c"):
        assert {r["kind"] for r in mixed[split]} >= set(GENERAL) - {"none", "followup"}
    assert {r["kind"] for r in mixed["train"]} == set(FAMILIES)
    chains = sum(r["kind"] in KINDS for r in mixed["train"])
    assert 0.06 < chains / len(mixed["train"]) < 0.2  # the chain kinds share one slot of 8


def test_general_generation_is_deterministic_and_the_seed_matters() -> None:
    small = GenSpec(seed=2, train_tasks=30, eval_tasks=6, families=["typed", "none", "hop"])
    assert generate(small) == generate(small)
    assert generate(small.model_copy(update={"seed": 3}))["train"] != generate(small)["train"]


def test_the_families_field_is_canonical_and_only_dumped_when_not_the_default() -> None:
    assert "families" not in GenSpec().model_dump()
    assert GenSpec(families=list(reversed(KINDS))).model_dump() == GenSpec().model_dump()
    spec = GenSpec(families=["none", "hop", "typed"])
    assert spec.families == ["hop", "typed", "none"]
    assert spec.model_dump(mode="json")["families"] == ["hop", "typed", "none"]
    for bad in (["typed", "typed"], [], ["lookup"]):
        with pytest.raises(ValueError, match="families must be distinct names"):
            GenSpec(families=bad)


def test_a_catalogue_that_would_leak_split_c_into_training_is_refused(catalog: Catalog) -> None:
    from eval.arenas.procedural.catalog import split_services

    with pytest.raises(ConfigError, match=r"share the words \['kiln'\]"):
        split_services(catalog, {"kiln"}, set())
    with pytest.raises(ConfigError, match=r"share the words \['room'\]"):
        split_services(catalog, set(), {"room"})


# --------------------------------------------------------------------------- nothing of BFCL


def _words(text: str) -> list[str]:
    return re.sub(r"[^\w\s]", " ", text.lower()).split()


def _bfcl() -> tuple[set[str], list[str]]:
    """Every function name and user question of the installed BFCL data: the single-turn
    categories and the multi-turn ones (their classes' functions and every turn)."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    from eval.bfcl.categories import SINGLE_TURN
    from eval.bfcl.official import CATEGORIES, function_docs, load_category
    from eval.bfcl.single import load_single

    names: set[str] = set()
    questions: list[str] = []
    for category in SINGLE_TURN:
        for e in load_single(category):
            names |= {f["name"] for f in e.functions}
            questions += [m["content"] for t in e.question for m in t if m["role"] == "user"]
    for cls in MULTI_TURN_FUNC_DOC_FILE_MAPPING:
        names |= {f["name"] for f in function_docs(cls)}
    for category in CATEGORIES:
        for entry in load_category(category):
            questions += [m["content"] for t in entry.question for m in t if m["role"] == "user"]
    return names, questions


def test_no_bfcl_function_name_or_question_is_in_the_generated_data() -> None:
    names, questions = _bfcl()
    assert len(names) > 1900 and len(questions) > 6000  # the installed data was read
    bfcl_names = {n.lower() for n in names} | {n.lower().replace(".", "_") for n in names}
    compound = {n for n in bfcl_names if "_" in n or "." in n}
    grams = {tuple(w[i : i + 8]) for q in questions for w in [_words(q)] for i in range(len(w) - 7)}
    tools: set[str] = set()
    tokens: set[str] = set()
    asked: list[str] = []
    for seed in (0, 1, 2):
        spec = GenSpec(seed=seed, train_tasks=400, eval_tasks=60, families=list(FAMILIES))
        for records in generate(spec).values():
            tools |= _tool_names(records)
            for r in records:
                text = " ".join((*(m["content"] for m in r["prompt"]), r["tool_schema"]))
                tokens |= {t.strip(".").lower() for t in re.findall(r"[\w.]+", text)}
                asked += [m["content"] for m in r["prompt"] if m["role"] == "user"]
    assert len(tools) > 140 and len(asked) > 1800
    assert not {t.lower() for t in tools} & bfcl_names
    assert not tokens & compound  # no compound BFCL name written anywhere a model reads
    shared = [
        " ".join(w[i : i + 8])
        for q in asked
        for w in [_words(q)]
        for i in range(len(w) - 7)
        if tuple(w[i : i + 8]) in grams
    ]
    assert not shared


# --------------------------------------------------------------------------- the replay


def test_the_replay_makes_a_parallel_task_s_calls_in_one_reply_and_declines_a_no_call_task(
    tmp_path: Any,
) -> None:
    """What SFT sees of the families: a parallel or multi task's calls in one assistant reply
    (as BFCL's parallel categories and an OpenAI ``tool_calls`` list ask for), a chain's one a
    reply, and a task no offered function serves answered without a call, saying so."""
    from eval.arenas.replay import DECLINE
    from training.replay import replay_arenas

    spec = GenSpec(seed=3, train_tasks=24, eval_tasks=4, families=["parallel", "multi", "none"])
    data = write_arenas(tmp_path / "gen", spec)["train"]
    results, summary = asyncio.run(replay_arenas(data, tmp_path / "replay", reasoning=False))
    assert summary.fully_solved == 1.0
    kinds = {r["task_id"]: r["kind"] for r in map(json.loads, data.read_text().splitlines())}
    seen = set()
    for rec in map(json.loads, results.read_text().splitlines()):
        kind = kinds[rec["task_id"]]
        replies = [m for m in rec["trajectory"]["messages"] if m["role"] == "assistant"]
        calls = [len(m.get("tool_calls") or []) for m in replies]
        if kind == "none":
            assert calls == [0] and replies[0]["content"] == DECLINE
        else:  # every call in the first reply, then the answer
            assert len(calls) == 2 and calls[0] == rec["tool_calls"] >= 2 and calls[1] == 0
        seen.add(kind)
    assert seen == {"parallel", "multi", "none"}
