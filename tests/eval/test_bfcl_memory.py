"""BFCL V4 memory (key-value and recursive-summary backends) against the official pipeline:
the entries as the official loader builds them; stored results scored by ours and by the
official agentic checker (a corpus of answers in other words, case and punctuation, wrong
answers, empty replies, calls only, junk); the runner end to end over real HTTP against
scripted models (gold answers pass, wrong ones fail, HTTP 500 is an inference error); and the
same scripted model through the official ``bfcl generate``: the same requests, the same stored
results, the same memory snapshots, file by file."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from astra_agent.model import ChatModel, ModelConfig
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from eval.bfcl.memory import (
    ANSWER_NOT_FOUND,
    INFERENCE_ERROR,
    MEMORY_CATEGORIES,
    MemoryEntry,
    MemoryOutcome,
    MemoryRunner,
    ScenarioRecord,
    load_memory,
    memory_verdict,
    prerequisites,
    scenarios,
)
from eval.bfcl.official import OFFICIAL_FC_MODEL
from eval.bfcl.official_memory import ask_official, official_verdicts
from eval.bfcl.replay import memory_model

ROOT = Path(__file__).parents[2]
OFFICIAL_BFCL = Path(os.environ.get("ASTRA_BFCL_OFFICIAL", ROOT / ".venv-bfcl/bin/bfcl"))
OFFICIAL_PYTHON = OFFICIAL_BFCL.parent / "python"
SCENARIO = "notetaker"  # the shortest prerequisite chain: 5 conversations, 24 turns


def needs_official() -> None:
    if not OFFICIAL_PYTHON.is_file():
        pytest.skip(f"no official bfcl-eval environment ({OFFICIAL_PYTHON}): make setup-bfcl")


def test_entries_are_the_official_loaders() -> None:
    """Ids, order, scenarios, gold answers and prerequisite chains of both categories."""
    needs_official()
    official = ask_official(
        {"mode": "entries", "categories": list(MEMORY_CATEGORIES)}, OFFICIAL_PYTHON
    )
    for category in MEMORY_CATEGORIES:
        ours = [
            {
                "id": e.id,
                "scenario": e.scenario,
                "ground_truth": list(e.ground_truth),
                "depends_on": list(e.prerequisites),
            }
            for e in load_memory(category)
        ]
        assert ours == official[category]["questions"] and len(ours) == 155
        chains = [c.id for s in scenarios() for c in prerequisites(category, s)]
        assert sorted(chains) == sorted(official[category]["prerequisites"])
        assert len(chains) == 37


# ------------------------------------------------------------------ scoring parity


def _answer_variants(gold: str, other: str, rng: random.Random) -> list[Any]:
    """Final replies around one gold answer: the same in other case, punctuation, quoting
    and layout; inside other words; wrong; numbers and times written otherwise."""
    dotted = ".".join(gold)
    spaced = gold.replace(" ", "  ")
    noisy = "".join(c + rng.choice(["", "-", "_", "*", "^", "(", ")", ","]) for c in gold)
    return [
        f"{{'answer': '{gold}', 'context': 'from memory'}}",
        f'{{"answer": "{gold.upper()}", "context": "x"}}',
        gold.lower(),
        f"It is {dotted}.",
        noisy,
        spaced,
        f"x{gold}y",
        f"{gold}s",
        f"'{gold}'",
        f"({gold})",
        gold.replace(" ", ""),
        gold.replace(":", "."),
        gold.lstrip("0"),
        f"{gold}%",
        "İ" + gold,
        gold.replace("a", "а"),  # Cyrillic a
        f"{{'answer': '{other}', 'context': 'guess'}}",
        "{'answer': 'I do not know', 'context': 'I do not know'}",
    ]


def _results(gold: str, other: str, rng: random.Random) -> list[Any]:
    """Stored results (per turn, per step) around one gold answer."""
    call = [{"core_memory_retrieve_all": "{}"}]
    answer = f"{{'answer': '{gold}', 'context': 'x'}}"
    out: list[Any] = [[[call, text]] for text in _answer_variants(gold, other, rng)]
    out += [
        [[answer]],
        [[answer, call]],  # the answer, then a call: the answer is still the last message
        [[call]],  # calls only
        [[call, call]],
        [[""]],
        [[call, ""]],
        [[None]],
        [[]],
        [[[]]],
        [[[{}]]],
        [[{}]],
        [[[answer]]],  # a list of one string
        [[[5, answer]]],
        [[{"memory_append": '{"text": "' + gold}]],  # undecodable: it is the final message
        [[{"memory_append": json.dumps({"text": gold})}]],  # a call: not an answer
        [[[{"archival_memory_add": "[1]"}]]],
        [[5]],
        [[True]],
        [[3.5]],
        [[{"answer": gold}]],
        [[[[gold]]]],
        [],  # no turn
        [[answer], [answer]],  # two turns
        f"Error during inference: {gold}",
        [answer],  # a turn that is a string: iterated by characters
        [gold[-1]],
        [{"x": 1, gold: 2}],  # a turn that is an object: iterated by keys
        [5],  # a turn that is no sequence: the official checker raises
        [None],
    ]
    return out


# Gold answers the data does not have (quotes, regex metacharacters, non-ASCII), each with
# replies around it: scored against the case's own gold on both sides.
OWN_GOLD = {
    "Joe's": ["Joe's", 'Joe"s', "Joes", "JOE'S bar", "joe`s"],
    'say "hi"': ["say 'hi'", 'say "hi"', "say hi", "SAY 'HI'!"],
    "C++ (v2.0)": ["c++ v20", "C++ (v2.0)", "c++v2.0", "C+ v20"],
    "Straße": ["STRASSE", "straße", "Straße.", "strasse"],
    "$5": ["$5", "$50", "5", "cost: $5!"],
    "a|b": ["a|b", "ab", "a", "x a|b y"],
}


def test_scoring_agrees_with_the_official_agentic_checker() -> None:
    """Every case of the corpus, over every entry of both categories: the same verdict and
    error type as the official ``_evaluate_single_agentic_entry``."""
    needs_official()
    rng = random.Random(36)
    cases, entries = [], []
    for category in MEMORY_CATEGORIES:
        all_entries = load_memory(category)
        for e in all_entries:
            other = rng.choice(all_entries).ground_truth[0]
            for gold in e.ground_truth[:2]:
                for result in _results(gold, other, rng):
                    cases.append({"category": category, "id": e.id, "result": result})
                    entries.append(e)
    first = load_memory("memory_kv")[0]
    for gold, replies in OWN_GOLD.items():
        for reply in replies:
            result = [[[{"core_memory_retrieve_all": "{}"}], reply]]
            case = {"category": "memory_kv", "id": first.id, "result": result}
            cases.append({**case, "possible_answer": [gold]})
            entries.append(dataclasses.replace(first, ground_truth=(gold,)))
    official = official_verdicts(cases, OFFICIAL_PYTHON)
    ours = [memory_verdict(e, c["result"])[:2] for e, c in zip(entries, cases, strict=True)]
    differing = [
        (c["id"], c["result"], o, t)
        for c, o, t in zip(cases, ours, official, strict=True)
        if o != t
    ]
    assert differing == []
    seen = Counter(t[1] for t in official)
    assert len(cases) > 15_000
    assert {None, ANSWER_NOT_FOUND, INFERENCE_ERROR, "agentic:no_last_message"} <= set(seen)
    assert seen["agentic:crash"] > 0 and seen[None] > 3_000 and seen[ANSWER_NOT_FOUND] > 3_000


# ------------------------------------------------------------------ scripted models


def _answer_format() -> str:
    from bfcl_eval.constants.default_prompts import (
        ADDITIONAL_SYSTEM_PROMPT_FOR_AGENTIC_RESPONSE_FORMAT,
    )

    return ADDITIONAL_SYSTEM_PROMPT_FOR_AGENTIC_RESPONSE_FORMAT


def questions(category: str, n: int) -> list[MemoryEntry]:
    return [e for e in load_memory(category) if e.scenario == SCENARIO][:n]


def gold_of(entries: list[MemoryEntry]) -> dict[str, str]:
    return {e.question[0][0]["content"]: e.ground_truth[0] for e in entries}


def is_question(req: dict[str, Any]) -> bool:
    return _answer_format() in str(req["messages"][0]["content"])


async def run_all(
    runner: MemoryRunner, entries: list[MemoryEntry], srv: ScriptedServer, *, together: bool = True
) -> list[MemoryOutcome]:
    cfg = ModelConfig(base_url=srv.base_url, model=srv.model, max_retries=0, recover_calls=False)
    async with ChatModel(cfg) as model:
        if together:
            return list(await asyncio.gather(*(runner.run(e, model) for e in entries)))
        return [await runner.run(e, model) for e in entries]


TURNS = sum(len(c.question) for c in prerequisites("memory_kv", SCENARIO))


@pytest.mark.integration
@pytest.mark.parametrize("category", MEMORY_CATEGORIES)
async def test_gold_answers_pass_wrong_ones_fail_and_the_memory_is_built_once(
    category: str, tmp_path: Path
) -> None:
    entries = questions(category, 4)
    with ScriptedServer(memory_model(gold_of(entries))) as srv:
        outcomes = await run_all(MemoryRunner(tmp_path), entries, srv)
        prereq = [r for r in srv.requests if not is_question(r)]
        asked = [r for r in srv.requests if is_question(r)]
    assert [(o.valid, o.error_type, o.error_kind) for o in outcomes] == [(True, None, None)] * 4
    assert len(prereq) == 2 * TURNS  # one chain for four questions at once: a call, "Noted."
    # each question starts from the memory the chain left, in its system prompt
    system = asked[0]["messages"][0]["content"]
    first_user = prerequisites(category, SCENARIO)[-1].question[0][0]["content"]
    assert (first_user[:100] if category == "memory_rec_sum" else "note_") in system
    assert system.endswith(_answer_format())
    out = outcomes[0]
    assert out.trajectory is not None and out.trajectory.termination == "stop"
    assert len(out.responses) == 1 and len(out.responses[0]) == 2
    record = ScenarioRecord.model_validate_json(
        (tmp_path / "prerequisites" / category / f"{SCENARIO}.json").read_text()
    )
    assert [c.id for c in record.conversations] == [c.id for c in prerequisites(category, SCENARIO)]

    # A new runner on the same directory (a resumed run) reuses the memory: no prerequisite
    # conversation runs again; a model that answers wrongly fails, on the answer.
    wrong = dict.fromkeys(gold_of(entries), "I do not know")
    with ScriptedServer(memory_model(wrong)) as srv:
        outcomes = await run_all(MemoryRunner(tmp_path), entries, srv)
        assert all(is_question(r) for r in srv.requests)
    assert all(not o.valid and o.error_type == ANSWER_NOT_FOUND for o in outcomes)
    assert outcomes[0].details["answer"].startswith("{'answer': 'I do not know'")
    assert outcomes[0].error_kind is None


@pytest.mark.integration
async def test_an_endpoint_failure_is_an_inference_error_never_an_answer(tmp_path: Path) -> None:
    entries = questions("memory_kv", 3)
    with ScriptedServer(lambda req: Reply(status=500)) as srv:  # the chain cannot run
        outcomes = await run_all(MemoryRunner(tmp_path / "a"), entries, srv)
        assert len(srv.requests) == 1  # the first prerequisite step; the chain stops there
    for o in outcomes:
        assert (o.valid, o.error_type, o.error_kind) == (False, INFERENCE_ERROR, "inference")
        assert o.endpoint_failure == "status" and o.error is not None
        assert "memory_kv_prereq_32-notetaker-0" in o.error
    assert not (tmp_path / "a" / "prerequisites" / "memory_kv" / f"{SCENARIO}.json").exists()

    good = memory_model(gold_of(entries))

    def dies_on_questions(req: dict[str, Any]) -> Reply:
        return Reply(status=500) if is_question(req) else good(req)

    with ScriptedServer(dies_on_questions) as srv:
        outcomes = await run_all(MemoryRunner(tmp_path / "b"), entries, srv)
    for o in outcomes:
        assert (o.valid, o.error_type, o.error_kind) == (False, INFERENCE_ERROR, "inference")
        assert o.endpoint_failure == "status" and o.trajectory is not None
        assert o.trajectory.termination == "model_error"


@pytest.mark.integration
async def test_a_text_beside_an_empty_tool_calls_list_is_stored_and_scored_as_officially(
    tmp_path: Path,
) -> None:
    """vLLM sends ``tool_calls: []`` beside a text reply; the official FC handler for
    OpenAI-compatible endpoints then stores ``[]``, and its checker finds no final message.
    Stored and scored as there; the text is kept in the details."""
    (entry,) = questions("memory_kv", 1)
    good = memory_model(gold_of([entry]))

    def vllm_like(req: dict[str, Any]) -> Reply:
        reply = good(req)
        if reply.tool_calls:
            return reply
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        message["tool_calls"] = []
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return Reply(body={"object": "chat.completion", "model": "scripted", "choices": [choice]})

    with ScriptedServer(vllm_like) as srv:
        (out,) = await run_all(MemoryRunner(tmp_path), [entry], srv)
    assert out.responses[0][-1] == [] and out.error_kind is None
    assert (out.valid, out.error_type) == (False, "agentic:no_last_message")
    assert entry.ground_truth[0] in out.details["text_beside_empty_tool_calls"]


@pytest.mark.integration
async def test_expected_scenarios_build_their_memory_side_by_side(tmp_path: Path) -> None:
    """Given the entries to come, the first question starts every chain they need: the
    second scenario's conversations run while the first scenario's still do."""
    first, second = questions("memory_kv", 1)[0], load_memory("memory_kv")[30]  # healthcare
    assert second.scenario != first.scenario
    runner = MemoryRunner(tmp_path, expected=[first, second])
    with ScriptedServer(memory_model(gold_of([first, second]))) as srv:
        async with ChatModel(base_url=srv.base_url, model=srv.model, max_retries=0) as model:
            a = await runner.run(first, model)
            asked_first = len(srv.requests)
            b = await runner.run(second, model)
        requests = list(srv.requests)
    assert a.valid and b.valid
    healthcare = prerequisites("memory_kv", "healthcare")[0].question[0][0]["content"]
    started = next(i for i, r in enumerate(requests) if r["messages"][1]["content"] == healthcare)
    assert started < asked_first


# ------------------------------------------------------------------ the official pipeline


def _conversation(req: dict[str, Any]) -> list[Any]:
    """What the model is sent, without what differs by construction: call ids, and the
    content of an assistant message that only calls (the official client sends null)."""
    out: list[Any] = []
    for m in req["messages"]:
        calls = [
            (c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []
        ]
        out.append((m["role"], m.get("content") or "", calls))
    return out


def _tools(req: dict[str, Any]) -> list[Any]:
    return [
        {k: v for k, v in t["function"].items() if k != "response"} for t in req.get("tools", [])
    ]


def _of_backend(requests: list[dict[str, Any]], backend: str) -> list[dict[str, Any]]:
    kv = backend == "kv"
    return [r for r in requests if ("core_memory_add" in str(r["tools"])) == kv]


def _files(root: Path) -> dict[str, Any]:
    return {str(p.relative_to(root)): json.loads(p.read_text()) for p in root.rglob("*.json")}


@pytest.mark.integration
def test_the_official_generate_sends_stores_and_remembers_the_same(tmp_path: Path) -> None:
    """One scenario of both categories (its prerequisite chain and three questions) through
    the official ``bfcl generate`` and through our runner, against the same scripted model:
    the same requests in the same order (the official handler also sends each function's
    ``response`` schema, which our tools leave out), the same stored results, and the same
    memory snapshots (every checkpoint and the final one) on disk."""
    needs_official()
    chosen = {c: questions(c, 3) for c in MEMORY_CATEGORIES}
    answers = gold_of([e for es in chosen.values() for e in es])
    ids = {
        c: [p.id for p in prerequisites(c, SCENARIO)] + [e.id for e in es]
        for c, es in chosen.items()
    }
    work = tmp_path / "official"
    work.mkdir()
    (work / "test_case_ids_to_generate.json").write_text(json.dumps(ids))
    with ScriptedServer(memory_model(answers), model=OFFICIAL_FC_MODEL) as srv:
        env = {
            **os.environ,
            "OPENAI_BASE_URL": srv.base_url,
            "OPENAI_API_KEY": "x",
            "BFCL_PROJECT_ROOT": str(work),
        }
        run = subprocess.run(
            [
                str(OFFICIAL_BFCL),
                "generate",
                "--model",
                OFFICIAL_FC_MODEL,
                "--run-ids",
                "--num-threads",
                "1",
                "--result-dir",
                str(work / "result"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        theirs = list(srv.requests)
    assert run.returncode == 0, run.stderr[-3000:]
    ours_dir = tmp_path / "ours"
    with ScriptedServer(memory_model(answers), model=OFFICIAL_FC_MODEL) as srv:
        outcomes = {}
        for c, es in chosen.items():
            runner = MemoryRunner(ours_dir)
            outcomes[c] = asyncio.run(run_all(runner, es, srv, together=False))
        ours = list(srv.requests)

    for backend in ("kv", "rec_sum"):  # the official generator interleaves the two
        sent, official = _of_backend(ours, backend), _of_backend(theirs, backend)
        assert len(sent) == 2 * TURNS + 3 * 2
        assert [_conversation(r) for r in sent] == [_conversation(r) for r in official]
        assert [_tools(r) for r in sent] == [_tools(r) for r in official]
    assert all("response" in t["function"] for r in theirs for t in r["tools"])

    result = work / "result" / OFFICIAL_FC_MODEL.replace("/", "_")
    for c, es in chosen.items():
        backend = c.removeprefix("memory_")
        folder = result / "agentic" / "memory" / backend
        stored = {
            r["id"]: r["result"]
            for name in (f"BFCL_v4_{c}_result.json", f"BFCL_v4_{c}_prereq_result.json")
            for r in map(json.loads, (folder / name).read_text().splitlines())
        }
        record = ScenarioRecord.model_validate_json(
            (ours_dir / "prerequisites" / c / f"{SCENARIO}.json").read_text()
        )
        mine = {x.id: x.responses for x in record.conversations}
        mine |= {e.id: o.responses for e, o in zip(es, outcomes[c], strict=True)}
        assert mine == stored
        assert all(o.valid for o in outcomes[c])
        snapshots = _files(folder / "memory_snapshot")
        assert len(snapshots) == 6  # five checkpoints and the final snapshot
        assert _files(ours_dir / "agentic" / "memory" / backend / "memory_snapshot") == snapshots
