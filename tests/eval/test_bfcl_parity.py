"""Our BFCL multi-turn scoring against the official checker, verdict by verdict.

Corpus: the official ground truth of all four categories replayed as is (everything passes),
and mutated — a call dropped, an argument changed, an extra state-changing call, calls split
over several steps, a held-out function called early, a turn left empty, a turn missing.
And raw model responses, decoded by our code and by the official evaluator's decoder: steps
with invalid JSON or non-object arguments (dropped whole), text steps, empty steps.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from eval.bfcl import CATEGORIES, Entry, check_entry, load_category, openai_tools, parse_call
from eval.bfcl.backend import decode_step, method_table, new_instances
from eval.bfcl.parity import official_decode, official_verdict
from eval.bfcl.replay import json_calls


def as_is(entry: Entry) -> list[list[list[str]]]:
    return [[list(calls)] if calls else [] for calls in entry.ground_truth]


def mutate(entry: Entry, kind: str, rng: random.Random) -> list[list[list[str]]] | None:
    turns = [list(calls) for calls in entry.ground_truth]
    busy = [i for i, calls in enumerate(turns) if calls]
    if not busy:
        return None
    t = rng.choice(busy)
    if kind == "drop_call":
        del turns[t][rng.randrange(len(turns[t]))]
    elif kind == "change_argument":
        i = rng.randrange(len(turns[t]))
        name, args, kwargs = parse_call(turns[t][i])
        if kwargs:
            k = rng.choice(sorted(kwargs))
            v = kwargs[k]
            kwargs[k] = (v + 1) if isinstance(v, int | float) and not isinstance(v, bool) else "zzz"
        elif args:
            args[0] = "zzz"
        else:
            return None
        parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
        turns[t][i] = f"{name}({', '.join(parts)})"
    elif kind == "extra_call":
        turns[t].append(turns[t][-1])  # repeat a state-changing step
    elif kind == "split_steps":
        return [[[c] for c in calls] for calls in turns]
    elif kind == "held_out_early":
        if not entry.missed_function:
            return None
        k = int(next(iter(entry.missed_function)))
        turns[k - 1], turns[k] = turns[k], []
    elif kind == "empty_turn":
        turns[t] = []
    elif kind == "turn_missing":
        turns = turns[:-1]
    return [[calls] if calls else [] for calls in turns]


KINDS = [
    "drop_call",
    "change_argument",
    "extra_call",
    "split_steps",
    "held_out_early",
    "empty_turn",
    "turn_missing",
]


@pytest.mark.parametrize("category", CATEGORIES)
def test_ground_truth_replay_passes_both_checkers(category: str) -> None:
    entries = load_category(category)
    assert len(entries) == 200
    for e in entries:
        ours = check_entry(e, as_is(e))
        assert ours.valid, (e.id, ours)
        assert official_verdict(e, as_is(e)) == (True, None), e.id


@pytest.mark.parametrize("category", CATEGORIES)
def test_mutated_corpus_verdicts_agree(category: str) -> None:
    rng = random.Random(f"parity-{category}")
    seen: Counter[str] = Counter()
    failing = 0
    for e in load_category(category):
        for kind in KINDS:
            turns = mutate(e, kind, rng)
            if turns is None:
                continue
            ours = check_entry(e, turns)
            theirs = official_verdict(e, turns)
            assert (ours.valid, ours.error_type) == theirs, (e.id, kind, ours, theirs)
            seen[kind] += 1
            failing += not ours.valid
    assert sum(seen.values()) >= 100 and failing >= 100
    assert all(seen[k] > 0 for k in KINDS if k != "held_out_early" or category == "miss_func")


def test_tools_follow_the_official_fc_harness() -> None:
    e = next(x for x in load_category("miss_func") if x.missed_function)
    names = {t["function"]["name"] for t in openai_tools(e)}
    held = {f for fs in e.missed_function.values() for f in fs}
    assert held and not held & names
    t = openai_tools(e)[0]["function"]
    assert t["parameters"]["type"] == "object"
    assert t["description"].endswith("Note that the provided function is in Python 3 syntax.")


async def test_environment_dispatches_without_eval() -> None:
    from eval.bfcl import BFCLEnvironment

    e = load_category("base")[0]
    env = BFCLEnvironment(e)
    r = await env.call_tool("cd", {"folder": "document"})
    assert not r.is_error
    bad = await env.call_tool("cd", {"nope": 1})
    assert bad.is_error and bad.text.startswith("Error during execution:")
    evil = await env.call_tool("__import__('os').system", {})
    assert evil.text == "Error during execution: name '__import__('os').system' is not defined"
    assert (await env.call_tool("exit", {})).text == (
        "Error during execution: Function call exit is not allowed."
    )


Raw = list[list[object]]  # per turn, per step: [{name: json_arguments}, ...] or text


def raw_responses(entry: Entry, rng: random.Random, kind: str) -> Raw | None:
    """The ground truth as a function-calling model would return it, then spoiled by ``kind``."""
    table = method_table(new_instances(entry))
    turns: Raw = []
    for calls in entry.ground_truth:
        steps: list[object] = [[{n: a} for n, a in json_calls(calls, table)]] if calls else []
        turns.append([*steps, "Done."])  # each turn ends with a text answer
    busy = [i for i, t in enumerate(turns) if len(t) > 1]
    if kind == "as_is":
        return turns
    if not busy:
        return None
    step = turns[rng.choice(busy)][0]
    assert isinstance(step, list)
    if kind == "invalid_json":  # one bad call: the whole step is dropped, good calls too
        step.append({"cd": '{"folder": '})
    elif kind == "non_object":
        step.insert(0, {"ls": rng.choice(["[1]", "5", "null", '"a"'])})
    elif kind == "no_arguments":
        step.append({"pwd": ""})
    elif kind == "empty_step":
        turns[busy[0]].insert(0, [])
    return turns


RAW_KINDS = ["as_is", "invalid_json", "non_object", "no_arguments", "empty_step"]


@pytest.mark.parametrize("category", CATEGORIES)
def test_raw_responses_decode_and_score_as_the_official_evaluator(category: str) -> None:
    rng = random.Random(f"raw-{category}")
    seen: Counter[str] = Counter()
    verdicts: Counter[bool] = Counter()
    for e in load_category(category)[:60]:
        for kind in RAW_KINDS:
            raw = raw_responses(e, rng, kind)
            if raw is None:
                continue
            ours = [[c for c in map(decode_step, turn) if c] for turn in raw]
            theirs = official_decode(raw)
            assert ours == theirs, (e.id, kind)
            mine = check_entry(e, ours)
            assert (mine.valid, mine.error_type) == official_verdict(e, theirs), (e.id, kind)
            seen[kind] += 1
            verdicts[mine.valid] += 1
    assert all(seen[k] >= 40 for k in RAW_KINDS), seen
    assert verdicts[True] >= 60 and verdicts[False] >= 60, verdicts
