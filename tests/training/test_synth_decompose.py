"""The decomposition stage (issue #10, B.1-B.3): records and their structure, the checks, the
teacher's three prompts on good and bad replies, and the stage end to end against the scripted
teacher over real HTTP (counts, provenance, stats, shards, endpoint failures, kill + resume)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from astra_agent.errors import ConfigError
from astra_agent.model import ChatModel, ModelConfig
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from tests.training.conftest import kill_stage_midway, resume_killed_stage
from training.synth.envs import Decomposition, SubQuestion, parallel_groups
from training.synth.envs.decompose import (
    DecomposeConfig,
    DraftChain,
    Necessity,
    ScoreName,
    VerifyScores,
    chain_problem,
    low_scores,
    necessity_problem,
    parse_min_scores,
    synth_decompose,
)
from training.synth.envs.records import (
    contains_answer,
    sinks,
    structure_problem,
    topological_order,
)
from training.synth.envs.sources import read_domains, read_sources, read_taxonomy
from training.synth.stage import JOURNAL, UnitsFailed
from training.synth.teacher import ReplyError, Teacher, TeacherConfig, TeacherRejected, parse_reply
from training.testing import ScriptedTeacher, scripted_teacher_server
from training.testing.decompose import scripted_reply

MODEL = "scripted-teacher"
ALWAYS = 1_000_000


def sq(sid: str, *deps: str, answer: str = "", question: str = "") -> SubQuestion:
    return SubQuestion(
        id=sid, question=question or f"What is fact {sid}?", answer=answer or f"A-{sid}",
        depends_on=list(deps),
    )  # fmt: skip


# ------------------------------------------------------------------ records


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        ([sq("q1"), sq("q2", "q1")], None),
        ([sq("q1"), sq("q1")], "duplicate_id"),
        ([sq("q1"), sq("q2", "q7")], "unknown_dependency"),
        ([sq("q1", "q1")], "cycle"),
        ([sq("q1", "q3"), sq("q2", "q1"), sq("q3", "q2")], "cycle"),
        ([sq("q1"), sq("q2", "q3"), sq("q3", "q1")], None),  # a DAG listed out of order
    ],
)
def test_structure_problem(steps: list[SubQuestion], reason: str | None) -> None:
    problem = structure_problem(steps)
    assert (problem[0] if problem else None) == reason
    if reason == "cycle":
        assert problem is not None and "q1 → " in problem[1]


def test_records_validate_their_structure_and_give_parallel_layers() -> None:
    diamond = [sq("q1"), sq("q2", "q1"), sq("q3", "q1"), sq("q4", "q2", "q3"), sq("q5")]
    d = Decomposition(id="x", domain="d", question="Q?", answer="A", subquestions=diamond)
    assert parallel_groups(d) == [["q1", "q5"], ["q2", "q3"], ["q4"]]
    assert sinks(diamond) == ["q4", "q5"] and d.sub("q3").depends_on == ["q1"]
    for bad, message in [
        ([sq("q1", "q2"), sq("q2", "q1")], "cycle"),
        ([sq("q1"), sq("q2", "q9")], "unknown_dependency"),
        ([sq("q1"), sq("q1")], "duplicate_id"),
        ([sq("q2", "q1"), sq("q1")], "listed after it"),  # deps must come first in a record
        ([], "at least 1"),
    ]:
        with pytest.raises(ValidationError, match=message):
            Decomposition(id="x", domain="d", question="Q?", answer="A", subquestions=bad)
    ordered = topological_order([sq("q3", "q2"), sq("q2", "q1"), sq("q1"), sq("q4")])
    assert [s.id for s in ordered] == ["q1", "q2", "q3", "q4"]
    with pytest.raises(ValidationError):
        SubQuestion(id="q 1", question="?", answer="a")


def test_contains_answer_ignores_case_spaces_and_punctuation_not_digits() -> None:
    assert contains_answer("It weighs 12.5kg.", "12.5 kg")
    assert contains_answer("Stocked at wh-leeds-3", "WH-Leeds-3")
    assert not contains_answer("It weighs 12.5 kg", "1.25 kg")
    assert not contains_answer("anything", "  ")


# ------------------------------------------------------------------ the checks


def test_chain_problems() -> None:
    ok = [sq("q1", answer="SKU-4417"), sq("q2", "q1", answer="12.5 kg")]
    assert chain_problem("Q?", "It weighs 12.5 kg", ok, 2, 6) is None
    cases = [
        ([sq("q1")], "A-q1", "chain_length"),
        ([sq(f"q{i}") for i in range(1, 8)], "", "chain_length"),
        ([sq("q1"), sq("q2", "q2")], "A-q2", "cycle"),
        ([sq("q1"), sq("q2", question="WHAT is fact q1")], "A-q1 A-q2", "duplicate_subquestion"),
        (ok, "It weighs a lot", "answer_not_derived"),
        ([sq("q1"), sq("q2")], "A-q1", "answer_not_derived"),  # q2, a last step, is unused
    ]
    for steps, answer, reason in cases:
        problem = chain_problem("Q?", answer, steps, 2, 6)
        assert problem is not None and problem[0] == reason, (reason, problem)


def test_necessity_rejects_a_needed_step_without_a_tool() -> None:
    def marked(*flags: bool | None) -> list[SubQuestion]:
        steps = [sq("q1"), sq("q2", "q1"), sq("q3", "q2")]
        return [s.model_copy(update={"needs_tool": f, "necessity_reason": "stated"})
                for s, f in zip(steps, flags, strict=True)]  # fmt: skip

    assert necessity_problem(marked(True, True, False)) is None  # a last step may be reasoning
    problem = necessity_problem(marked(True, False, True))
    assert problem == ("unneeded_dependency", "q2 (needed by q3) needs no tool: stated")
    solo = [s.model_copy(update={"needs_tool": False}) for s in (sq("q1"), sq("q2"))]
    assert necessity_problem(solo) == ("no_tool_step", "no step needs a tool")


def test_verification_thresholds() -> None:
    cfg = DecomposeConfig(domains=Path("d.txt"), out=Path("o"))
    assert cfg.min_scores == dict.fromkeys(
        ("dependency", "atomicity", "forced_serialization", "completeness"), 3
    )
    assert cfg.min_overall == 4.0

    def scores(*four: int) -> dict[str, float]:
        names = ("dependency", "atomicity", "forced_serialization", "completeness", "reason")
        return VerifyScores.model_validate(dict(zip(names, [*four, ""], strict=True))).scores()

    assert scores(5, 5, 4, 5)["overall"] == 4.75
    assert low_scores(scores(5, 5, 4, 5), cfg.min_scores, 4.0) == []
    assert low_scores(scores(5, 2, 4, 5), cfg.min_scores, 4.0) == ["atomicity 2 < 3"]
    assert low_scores(scores(4, 4, 3, 4), cfg.min_scores, 4.0) == ["overall 3.75 < 4"]
    strict: dict[ScoreName, int] = {**cfg.min_scores, **parse_min_scores(["2", "completeness=5"])}
    assert strict == {"dependency": 2, "atomicity": 2, "forced_serialization": 2,
                      "completeness": 5}  # fmt: skip
    assert low_scores(scores(2, 2, 2, 4), strict, 1.0) == ["completeness 4 < 5"]
    with pytest.raises(ConfigError, match="no score"):
        parse_min_scores(["realism=4"])
    with pytest.raises(ValidationError, match="min_steps"):
        DecomposeConfig(domains=Path("d"), out=Path("o"), min_steps=5, max_steps=3)
    with pytest.raises(ValidationError, match="--domains"):
        DecomposeConfig(out=Path("o"))


# ------------------------------------------------------------------ inputs


def test_inputs_domains_taxonomy_and_seeds(tmp_path: Path) -> None:
    domains = tmp_path / "domains.txt"
    domains.write_text('# a comment\nlogistics\n\n{"domain": "Weather", "description": "w"}\n'
                       '{"description": "no name"}\nLogistics\n')  # fmt: skip
    got, bad = read_domains(domains, "decompose")
    assert [d.name for d in got] == ["logistics", "Weather", "Logistics"]
    assert [(r.source, r.reason) for r in bad] == [(f"{domains}:5", "bad_domain")]
    taxonomy = tmp_path / "taxonomy.json"
    taxonomy.write_text(json.dumps({"finance": ["loans", "stocks"], "travel": {"rail": []}}))
    assert [d.name for d in read_taxonomy(taxonomy)] == [
        "finance / loans", "finance / stocks", "travel / rail",
    ]  # fmt: skip
    seeds = tmp_path / "seeds.jsonl"
    seed = '{"question": "Where is parcel TRK-%d now?", "id": "s1"}\n'
    seeds.write_text(seed % 1 + seed % 2 + "not json\n")
    slots, rejected, files = read_sources(domains=domains, taxonomy=taxonomy, seeds=seeds,
                                          per_domain=2, stage="decompose")  # fmt: skip
    assert [k for k, _ in slots][:4] == ["logistics:0", "logistics:1", "weather:0", "weather:1"]
    assert len(slots) == 2 * 5 + 1 and slots[-1][0] == "seed:s1" and len(files) == 3
    assert Counter(r.reason for r in rejected) == {
        "bad_domain": 1, "duplicate_domain": 1, "duplicate_seed": 1, "not_json": 1,
    }  # fmt: skip
    empty = tmp_path / "empty.txt"
    empty.write_text("\n# nothing\n")
    with pytest.raises(ConfigError, match="no domain"):
        read_sources(domains=empty, taxonomy=None, seeds=None, per_domain=1, stage="decompose")


# ------------------------------------------------------------------ the teacher's replies

CHAIN: dict[str, Any] = {
    "question": "For order ORD-1, how much does its heaviest item weigh?",
    "answer": "12.5 kg",
    "subquestions": [
        {"id": "q1", "question": "Which SKU is the heaviest of ORD-1?", "answer": "SKU-4417",
         "depends_on": []},
        {"id": "q2", "question": "How much does that SKU weigh?", "answer": "12.5 kg",
         "depends_on": ["q1"]},
    ],
}  # fmt: skip


def _with(**changes: Any) -> str:
    chain = json.loads(json.dumps(CHAIN))
    chain["subquestions"][1].update(changes)
    return json.dumps(chain)


@pytest.mark.parametrize(
    ("schema", "text", "problem"),
    [
        (DraftChain, json.dumps(CHAIN), None),
        (DraftChain, f"<think>steps first</think>```json\n{json.dumps(CHAIN)}\n```", None),
        (DraftChain, _with(depends_on="q1"), "schema"),  # a string, not a list
        (DraftChain, _with(id="q 2; DROP"), "schema"),
        (DraftChain, _with(answer="x" * 201), "schema"),  # a sub-answer must be short
        (DraftChain, _with(answer=" \n "), "schema"),
        (DraftChain, _with(confidence="high"), "schema"),
        (DraftChain, json.dumps({**CHAIN, "subquestions": CHAIN["subquestions"] * 7}), "schema"),
        (DraftChain, json.dumps(CHAIN)[:-40], "truncated"),
        (Necessity, '{"needs_tool": false, "reason": "stated in the question"}', None),
        (Necessity, '{"needs_tool": "false", "reason": "a string"}', "schema"),
        (Necessity, '{"needs_tool": 0}', "schema"),
        (VerifyScores, '{"dependency": 5, "atomicity": 4, "forced_serialization": 4, '
                       '"completeness": 5}', None),
        (VerifyScores, '{"dependency": 6, "atomicity": 4, "forced_serialization": 4, '
                       '"completeness": 5}', "schema"),
        (VerifyScores, '{"dependency": 4.5, "atomicity": 4, "forced_serialization": 4, '
                       '"completeness": 5}', "schema"),
        (VerifyScores, "Looks fine to me: 5/5 overall.", "not_json"),
    ],
)  # fmt: skip
def test_reply_schemas(schema: Any, text: str, problem: str | None) -> None:
    if problem is None:
        parse_reply(text, schema)
    else:
        with pytest.raises(ReplyError) as err:
            parse_reply(text, schema)
        assert err.value.problem == problem


@pytest.fixture(scope="module")
def teacher_server() -> Iterator[ScriptedServer]:
    with scripted_teacher_server(ScriptedTeacher(), MODEL) as srv:
        yield srv


PROMPT_VARS: dict[str, tuple[Any, dict[str, Any]]] = {
    "decompose": (DraftChain, {
        "domain": {"name": "logistics", "description": ""}, "index": 0,
        "domain_json": '{"name": "logistics", "description": ""}', "seed": None,
        "seed_json": "null", "focus": "a price", "min_steps": 2, "max_steps": 6,
    }),
    "necessity": (Necessity, {
        "domain_json": '{"name": "logistics"}', "question_json": json.dumps(CHAIN["question"]),
        "known": [CHAIN["subquestions"][0]], "step_json": json.dumps(CHAIN["subquestions"][1]),
    }),
    "verify": (VerifyScores, {
        "domain_json": '{"name": "logistics"}', "question": CHAIN["question"],
        "answer": CHAIN["answer"], "steps": CHAIN["subquestions"], "layers": [["q1"], ["q2"]],
        "decomposition_json": json.dumps(CHAIN),
    }),
}  # fmt: skip


@pytest.mark.parametrize("name", ["decompose", "necessity", "verify"])
@pytest.mark.parametrize(
    ("output", "times", "reason", "requests"),
    [
        (None, 0, None, 1),
        ("think", ALWAYS, None, 1),
        ("prose", ALWAYS, None, 1),
        ("not_json", 2, None, 3),
        ("wrong_types", ALWAYS, "schema", 3),
        ("huge", ALWAYS, "too_long", 3),
        ("deep", ALWAYS, "too_deep", 3),
        ("unclosed_think", ALWAYS, "truncated", 3),
    ],
)
async def test_each_prompt_through_the_teacher(
    teacher_server: ScriptedServer, name: str, output: Any, times: int, reason: str | None,
    requests: int,
) -> None:  # fmt: skip
    srv = teacher_server
    srv.set_script(ScriptedTeacher(output=output, times=times))
    srv.requests.clear()
    schema, variables = PROMPT_VARS[name]
    async with ChatModel(ModelConfig(base_url=srv.base_url, model=MODEL)) as model:
        teacher = Teacher(model, TeacherConfig(max_attempts=3, keep_raw_chars=500))
        if reason is None:
            answer = await teacher.ask(name, schema, **variables)
            assert answer.attempts == requests
            if name == "necessity":
                assert answer.value.needs_tool is True
            elif name == "verify":
                assert answer.value.scores()["overall"] == 4.75
            else:
                assert len(answer.value.subquestions) == 3
        else:
            with pytest.raises(TeacherRejected) as err:
                await teacher.ask(name, schema, **variables)
            assert err.value.code == f"{name}:{reason}" and err.value.attempts == 3
            assert 0 < len(err.value.raw_text) <= 500 + 40  # the raw reply kept, cut
    assert len(srv.requests) == requests
    assert srv.requests[0]["messages"][0]["content"].startswith(f"[astra-synth:{name}.v1]\n")
    assert teacher.usage[f"{name}.v1"].calls == requests


def test_scripted_rules_answer_what_the_prompts_ask() -> None:
    text = '[astra-synth:decompose.v1]\nDomain (JSON): {"name": "retail banking"}\nIndex: 0\n'
    chain = DraftChain.model_validate(scripted_reply("decompose", text))
    steps = [SubQuestion.model_validate(s.model_dump()) for s in chain.subquestions]
    assert chain_problem(chain.question, chain.answer, steps, 2, 6) is None
    assert chain.answer.startswith("EUR ") and steps[-1].question.startswith("Compute")
    assert chain == DraftChain.model_validate(scripted_reply("decompose", text))  # deterministic


# ------------------------------------------------------------------ the stage end to end

PLANTS = ("cycle", "unknown_dep", "dup_id", "dup_sub", "not_derived", "short", "long",
          "unneeded", "ambiguous", "meh", "bad_schema", "necessity_schema")  # fmt: skip


def write_inputs(root: Path) -> tuple[Path, Path]:
    lines = ["logistics", json.dumps({"name": "retail banking", "description": "accounts"}),
             "travel", "healthcare"]  # fmt: skip
    lines += [json.dumps({"name": f"Plant {p}", "description": f"plant:{p}"}) for p in PLANTS]
    lines += ["LOGISTICS", '{"description": "a domain without a name"}']
    domains = root / "domains.txt"
    domains.write_text("\n".join(lines) + "\n")
    seeds = root / "seeds.jsonl"
    seeds.write_text(
        '{"question": "Which courier delivered the parcel I sent to my aunt in Porto last week?",'
        ' "answer": "Veloce Cargo", "domain": "logistics", "id": "courier"}\n'
        '{"question": "How many loyalty points are left on my card after the March refund?"}\n'
        '{"question": "Which courier delivered the parcel I sent to my aunt in Porto last week'
        ' then?", "id": "courier-again"}\n'
        '{"question": "Some other question of mine about my parcels", "id": "courier"}\n'
        "not json at all\n"
    )
    return domains, seeds


def outputs(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    def read(name: str) -> list[dict[str, Any]]:
        return [json.loads(x) for x in (out / name).read_text().splitlines() if x]

    return read("decompositions.jsonl"), read("rejections.jsonl")


def config(out: Path, url: str, **kw: Any) -> DecomposeConfig:
    model = {"base_url": url, "model": MODEL, **kw.pop("model", {})}
    return DecomposeConfig(out=out, model=model, **{"concurrency": 4, **kw})


async def test_decompose_stage_end_to_end(tmp_path: Path, teacher_server: ScriptedServer) -> None:
    domains, seeds = write_inputs(tmp_path)
    srv = teacher_server
    srv.set_script(ScriptedTeacher())
    srv.requests.clear()
    cfg = config(tmp_path / "out", srv.base_url, domains=domains, seeds=seeds, per_domain=2,
                 concurrency=1)  # fmt: skip
    stats = await synth_decompose(cfg)
    kept, rejected = outputs(cfg.out)
    reasons = Counter(r["reason"] for r in rejected)
    assert reasons == {
        "cycle": 2, "unknown_dependency": 2, "duplicate_id": 2, "duplicate_subquestion": 2,
        "answer_not_derived": 2, "chain_length": 4, "unneeded_dependency": 1, "low_score": 4,
        "decompose:schema": 2, "necessity:schema": 2, "near_duplicate": 1,
        "duplicate_domain": 1, "bad_domain": 1, "duplicate_seed": 1, "not_json": 1,
    }  # fmt: skip
    assert stats.rejections == dict(sorted(reasons.items()))
    # 4 domains x 2, plant:unneeded's second question (its stated step is a last step), 2 seeds
    assert len(kept) == stats.decompositions == 11 and stats.units == 35
    assert {r["id"] for r in kept} >= {"logistics:0", "retail-banking:1", "plant-unneeded:1",
                                       "seed:courier"}  # fmt: skip
    by_id = {r["id"]: r for r in rejected}
    assert by_id["plant-unneeded:0"]["reason"] == "unneeded_dependency"
    assert by_id["seed:courier-again"]["reason"] == "near_duplicate"
    assert "seed:courier" in by_id["seed:courier-again"]["detail"]
    assert by_id["plant-ambiguous:0"]["scores"]["atomicity"] == 2
    assert by_id["plant-meh:1"]["detail"] == "overall 3.75 < 4"
    assert by_id["plant-cycle:0"]["raw"].startswith('{"question"')  # the raw reply kept
    assert '"subquestions": "first' in by_id["plant-bad-schema:0"]["raw"]
    assert '"needs_tool": "yes"' in by_id["plant-necessity-schema:1"]["raw"]
    # calls: 35 questions + 2 x 2 retries; 24 + 4 + 4 + 4 + 4 steps + 2 x 2 x 3; 15 verified
    assert {k: v.calls for k, v in stats.tokens.items()} == {
        "decompose.v1": 39, "necessity.v1": 52, "verify.v1": 15,
    }  # fmt: skip
    assert len(srv.requests) == 39 + 52 + 15 and stats.completion_tokens > 0
    assert stats.scores["atomicity"].histogram == {"2": 2, "4": 2, "5": 11}
    assert stats.scores["overall"].judged == 15 and stats.scores["overall"].kept_mean == 4.75
    assert stats.steps == {"2": 5, "3": 4, "4": 2} and stats.depth == {"1": 1, "2": 8, "3": 2}
    assert stats.with_parallel_steps == 7 and stats.reasoning_steps == 2
    assert stats.thresholds["overall"] == 4.0 and stats.seeds == 3
    banking = Decomposition.model_validate(next(r for r in kept if r["id"] == "retail-banking:0"))
    assert parallel_groups(banking) == [["q1", "q2"], ["q3"], ["q4"]]
    assert [s.needs_tool for s in banking.subquestions] == [True, True, True, False]
    assert banking.scores == {"dependency": 5, "atomicity": 5, "forced_serialization": 4,
                              "completeness": 5, "overall": 4.75}  # fmt: skip
    prov = banking.provenance
    assert prov["stage"] == "decompose" and prov["inputs"] == ["retail banking"]
    assert prov["prompts"] == {"decompose": "decompose.v1", "necessity": "necessity.v1",
                               "verify": "verify.v1"}  # fmt: skip
    assert prov["teacher"]["model"] == MODEL and prov["created"]
    assert prov["detail"]["attempts"] == {"decompose": 1, "necessity": [1, 1, 1, 1], "verify": 1}
    seed = next(r for r in kept if r["id"] == "seed:courier")
    assert seed["answer"] == "Veloce Cargo" and seed["domain"] == "logistics"
    written = json.loads((cfg.out / "stats.json").read_text())
    assert written["scores"]["overall"]["histogram"] == {"3.75": 2, "4": 2, "4.75": 11}
    # a finished run is left as it is on --resume, refused without it
    again = await synth_decompose(cfg.model_copy(update={"resume": True}))
    assert again.decompositions == 11 and len(srv.requests) == 106
    with pytest.raises(ConfigError, match="complete decompose run"):
        await synth_decompose(cfg)


async def test_shards_and_endpoint_failures(tmp_path: Path) -> None:
    domains = tmp_path / "domains.txt"
    domains.write_text("".join(f"area w{i}x{i * 7}\n" for i in range(8)))
    good = ScriptedTeacher()
    sick = "area w3x21"

    def flaky(body: dict[str, Any]) -> Reply:
        text = body["messages"][0]["content"]
        if sick in text and text.startswith("[astra-synth:necessity"):
            return Reply(status=503)
        return good(body)

    with ScriptedServer(flaky, model=MODEL) as srv:
        seen: Counter[str] = Counter()
        failed = 0
        for k in range(2):
            cfg = config(tmp_path / f"shard-{k}", srv.base_url, domains=domains, per_domain=2,
                         shard=f"{k}/2", model={"max_retries": 0})  # fmt: skip
            try:
                stats = await synth_decompose(cfg)
            except UnitsFailed as exc:  # the sick domain's units: not data, not committed
                assert "unit(s) could not be done" in exc.message
                failed += 1
                assert not (cfg.out / "stats.json").exists()
                done = len((cfg.out / JOURNAL).read_text().splitlines())
                srv.set_script(good)
                stats = await synth_decompose(cfg.model_copy(update={"resume": True}))
                assert stats.resumed_units == done
            kept, rejected = outputs(cfg.out)
            assert not rejected and stats.units == len(kept) > 0
            seen.update(r["id"] for r in kept)
    assert failed >= 1
    assert set(seen) == {f"area-w{i}x{i * 7}:{k}" for i in range(8) for k in range(2)}
    assert set(seen.values()) == {1}


@pytest.mark.integration
def test_kill_and_resume_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    domains = tmp_path / "domains.txt"
    names = [f"zone q{i}v{i * 13}" for i in range(14)]
    domains.write_text("\n".join(names) + "\n")
    out = tmp_path / "out"
    with scripted_teacher_server(ScriptedTeacher(delay_s=0.03), MODEL) as srv:
        args = ["synth", "decompose", "--domains", str(domains), "--out", str(out),
                "--base-url", srv.base_url, "--model", MODEL, "--per-domain", "2",
                "--concurrency", "2"]  # fmt: skip
        done = kill_stage_midway(args, out, 4, 2 * len(names), torn="zone-x:0")
        srv.set_script(ScriptedTeacher())
        cfg = config(out, srv.base_url, domains=domains, per_domain=2)
        stats, asked = resume_killed_stage(
            synth_decompose, cfg, "decompose", srv, other={"min_overall": 3}
        )
        # the generic chains: 1 question + 2 steps + 1 verification each, only the rest asked
        assert asked == 4 * (2 * len(names) - done)
    kept, rejected = outputs(out)
    ids = [r["id"] for r in kept]
    assert sorted(ids) == sorted(f"zone-q{i}v{i * 13}:{k}" for i in range(14) for k in range(2))
    assert not rejected and stats.resumed_units == done
