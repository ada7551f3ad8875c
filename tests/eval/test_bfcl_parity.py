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
        held = int(next(iter(entry.missed_function)))
        turns[held - 1], turns[held] = turns[held], []
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
    evil = await env.call_tool("__import__('os').system", {})  # the official eval runs it
    assert evil.is_error and "is not supported by this harness" in evil.text
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


# --- names: what Python makes of them, as the official executor evals them -------------

FS = "multi_turn_base_0"  # TwitterAPI + GorillaFileSystem
FS_MATH = "multi_turn_base_15"  # GorillaFileSystem + MathAPI
NAME_CASES: list[tuple[str, list[str]]] = [
    (FS, ["ｌｓ()"]),  # NFKC: `ls`, which the official namespace does not hold
    (FS, ["ﬁnd(path='.')"]),
    (FS, ["cｄ(folder='document')"]),
    (FS, ["cd(ｆolder='document')", "pwd()"]),  # a keyword NFKC-normalised: it runs
    (FS, ["mkdir(dir_name='ｔｅｍｐ')", "ls()"]),  # string values are not normalised
    (FS, ["GorillaFileSystem.ls()"]),
    (FS, ["functions.cd(folder='document')"]),
    (FS, ["os.remove(path='x')", "exit()"]),
    (FS, ["cd (folder='document')", " cd(folder='..')", "\tpwd()", "cd\n(folder='document')"]),
    (FS, ["cd(folder='document')()", "ls()()", "cd(folder='..').x"]),
    (FS, ["cd(folder='document') or ls()", "ls() and cd(folder='..')", "pwd()"]),
    (FS, ["cd(folder=pwd())", "cd(folder=inf)", "cd(folder=-inf)", "cd(folder=not 1)"]),
    (FS, ["cd(folder='a',folder='b')", "cd(a-b=1)", "cd(='x')", "cd(folder='x');ls()"]),
    (FS, ["cd(folder=" + "[" * 250 + "]" * 250 + ")", "cd(folder={[1]: 2})"]),
    (FS, ["touch(file_name='f.txt')", "echo(content='ls(a) cd (b)', file_name='f.txt')"]),
    (FS, ["cat(file_name='f.txt')", "nope(a=1)", "ls", "print(content=1)", "len(obj=1)"]),
    (FS_MATH, ["touch(file_name='m.txt')", "echo(content='mean(x)', file_name='m.txt')"]),
    (FS_MATH, ["cat(file_name='m.txt')", "mean(numbers=[1,2,3])", "dict(a=[1])"]),
]


def _entry(entry_id: str) -> Entry:
    return next(e for c in CATEGORIES for e in load_category(c) if e.id == entry_id)


def _state(instances: dict[str, object]) -> dict[str, object]:
    return {
        c: {k: v for k, v in vars(i).items() if not k.startswith("_")} for c, i in instances.items()
    }


@pytest.mark.parametrize(("entry_id", "calls"), NAME_CASES)
def test_call_strings_execute_as_the_official_executor(entry_id: str, calls: list[str]) -> None:
    from eval.bfcl.backend import Namespace, execute_calls
    from eval.bfcl.parity import official_execute

    e = _entry(entry_id)
    theirs, their_instances = official_execute(e, [calls], "astra_names")
    mine = new_instances(e)
    assert execute_calls(Namespace.of(mine, f"astra_names_{e.id}"), calls) == theirs
    assert _state(mine) == _state(their_instances)


LOOP_CASES: list[tuple[str, str]] = [  # (name, JSON arguments) as a model sends them
    ("ｌｓ", "{}"),
    ("ﬁnd", '{"path": "."}'),
    ("GorillaFileSystem.cd", '{"folder": "document"}'),
    ("cd(folder='document')", "{}"),
    ("cd ", '{"folder": "document"}'),
    (" cd", '{"folder": "document"}'),
    ("cd", '{"ｆolder": "document"}'),
    ("cd", '{"folder": Infinity}'),
    ("cd", '{"folder": NaN}'),
    ("cd", '{"folder": 1e999}'),
    ("touch", '{"file_name": "ls(x)"}'),
    ("ls", '{"a-b": 1}'),
    ("pwd", '{"a": 1, "a": 2}'),
]


async def test_loop_dispatch_is_the_official_execution_and_our_scorer() -> None:
    """One call, three ways: our loop's environment, our scorer's executor, the official
    inference harness (decode, then execute); same result texts, same state."""
    import json

    from bfcl_eval.model_handler.utils import convert_to_function_call

    from eval.bfcl import BFCLEnvironment
    from eval.bfcl.backend import Namespace, execute_calls
    from eval.bfcl.parity import official_execute

    e = _entry(FS)
    env = BFCLEnvironment(e, tag="astra_loop")
    steps = [convert_to_function_call([{name: args}]) for name, args in LOOP_CASES]
    theirs, their_instances = official_execute(e, steps, "astra_loop")
    loop = [(await env.call_tool(n, json.loads(a))).text for n, a in LOOP_CASES]
    assert loop == theirs
    assert _state(env.instances) == _state(their_instances)
    scorer = new_instances(e)
    decoded = [c for n, a in LOOP_CASES for c in decode_step([{n: a}]) or []]
    assert execute_calls(Namespace.of(scorer, f"astra_loop_{e.id}"), decoded) == theirs
    assert _state(scorer) == _state(their_instances)


@pytest.mark.parametrize(
    "name",
    ["ｃｄ", "GorillaFileSystem.cd", "cd ", " cd", "functions.cd", "cd(folder='temp') or cd"],
)
def test_names_score_as_the_official_checker(name: str) -> None:
    """The ground truth of an entry with the first turn's ``cd`` renamed: verdicts equal."""
    e = _entry(FS)
    turns = as_is(e)
    turns[0] = [[c.replace("cd(", f"{name}(", 1) for c in turns[0][0]]]
    assert turns[0] != as_is(e)[0]
    ours = check_entry(e, turns)
    assert (ours.valid, ours.error_type) == official_verdict(e, turns), (name, ours)


# --- decoding failures: the step is skipped (scoring), the turn ends (inference) ---------

HUGE_INT = '{"folder": ' + "9" * 5000 + "}"  # json: ValueError (int digit limit)
DEEP = '{"folder": ' + "[" * 100_000 + "]" * 100_000 + "}"  # json: RecursionError


@pytest.mark.parametrize("arguments", [HUGE_INT, DEEP, '{"folder": ', "", "[1]", '"x"'])
def test_undecodable_steps_are_skipped_as_the_official_evaluator(arguments: str) -> None:
    e = _entry(FS)
    step = [{"cd": '{"folder": "document"}'}, {"ls": arguments}]
    assert decode_step(step) is None
    raw: Raw = [[step, *turn] for turn in raw_responses(e, random.Random(0), "as_is") or []]
    ours = [[c for c in map(decode_step, turn) if c] for turn in raw]
    assert ours == official_decode(raw)
    mine = check_entry(e, ours)
    assert (mine.valid, mine.error_type) == official_verdict(e, ours) == (True, None)


def test_steps_decode_as_the_official_decoder() -> None:
    """Shapes a result file may hold: one call object for a step, several calls in one object,
    arguments already decoded, text."""
    steps: list[object] = [
        {"cd": '{"folder": "document"}'},
        [{"cd": '{"folder": "a"}', "ls": "{}"}],
        [{"cd": {"folder": "a"}}],
        [{"cd": ["a"]}],
        [{}],
        "",
        "text",
        None,
        [["cd"]],
    ]
    raw: Raw = [[s] for s in steps]
    ours = [[c for c in [decode_step(s)] if c] for s in steps]
    assert ours == official_decode(raw)


async def test_loop_ends_the_turn_on_arguments_json_gives_up_on() -> None:
    from astra_agent.episode import decode_arguments, run_episode
    from astra_agent.model import ModelTurn, ToolCall
    from eval.bfcl import BFCLEnvironment
    from eval.bfcl.runner import OFFICIAL_CALLS

    for text in (HUGE_INT, DEEP):
        assert decode_arguments(ToolCall("c0", "cd", text)) is None

    class OneStep:
        name = "fake"

        async def complete(self, *_: object) -> ModelTurn:
            calls = [ToolCall("c0", "cd", '{"folder": "document"}'), ToolCall("c1", "cd", DEEP)]
            return ModelTurn("", "", calls, "tool_calls")

    env = BFCLEnvironment(_entry(FS))
    go = [{"role": "user", "content": "go"}]
    traj = await run_episode(OneStep(), env, go, policy=OFFICIAL_CALLS)  # type: ignore[arg-type]
    assert traj.termination == "undecodable"
    assert env.executed == []  # none of the step's calls ran


# --- the backend runs in a worker thread: its timeout fires, other entries go on ---------


async def test_a_blocking_backend_times_out_without_stalling_other_entries() -> None:
    import asyncio
    import threading
    import types

    from eval.bfcl import BFCLEnvironment

    release = threading.Event()
    slow = BFCLEnvironment(_entry(FS))
    slow_fs = slow.instances["GorillaFileSystem"]
    slow_fs.ls = types.MethodType(lambda self, **_: release.wait(30), slow_fs)  # it hangs
    fast = BFCLEnvironment(_entry(FS))
    try:
        hung = asyncio.ensure_future(asyncio.wait_for(slow.call_tool("ls", {}), 0.3))
        done = await asyncio.wait_for(fast.call_tool("cd", {"folder": "document"}), 5)
        assert not hung.done() and not done.is_error  # the other entry finished meanwhile
        with pytest.raises(TimeoutError):
            await hung
        # the entry's next call waits for the hung one, in call order: it times out too
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(slow.call_tool("pwd", {}), 0.1)
    finally:
        release.set()


async def test_reset_gives_the_initial_backends_and_tools() -> None:
    from eval.bfcl import BFCLEnvironment
    from eval.bfcl.official import held_out_tools

    e = next(x for x in load_category("miss_func") if x.missed_function)
    env = BFCLEnvironment(e)
    tools = await env.list_tools()
    fresh = (await env.call_tool("pwd", {})).text
    await env.call_tool("cd", {"folder": "..."})
    env.add_tools(held_out_tools(e, int(next(iter(e.missed_function)))))
    await env.call_tool("mkdir", {"dir_name": "left_over"})
    await env.reset()
    assert await env.list_tools() == tools and env.executed == []
    assert (await env.call_tool("pwd", {})).text == fresh
    assert "left_over" not in (await env.call_tool("ls", {})).text
