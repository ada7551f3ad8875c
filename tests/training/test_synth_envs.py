"""The environment stages after decomposition: tools written by the (scripted) teacher over
real HTTP and proven in the bubblewrap sandbox, merging, distractors, arena records that
`astra-eval arenas validate` accepts, the train/held-out split, kill and resume."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from astra_agent.arena import load_arena_file
from astra_agent.sandbox import bwrap_available
from astra_agent.testing.scripted_server import ScriptedServer
from eval.arenas import replay_script
from eval.arenas.checks import holds_token, vary_arguments
from tests.conftest import run_module
from tests.training.conftest import kill_stage_midway, resume_killed_stage
from training.synth.cli import synth_app
from training.synth.envs.build import heldout_ids
from training.synth.envs.code import CheckLimits, EnvCodeConfig, synth_env_code
from training.synth.envs.distract import BM25, DistractorIndex, Entry, words
from training.synth.envs.merge import dispatcher
from training.synth.envs.records import Decomposition, SubQuestion
from training.synth.envs.sandboxed import schema_problem, static_problem
from training.testing import ScriptedTeacher, scripted_teacher_server

MODEL = "scripted-teacher"
LIMITS = CheckLimits(wall_seconds_per_call=0.5, load_seconds_per_tool=2.0)
needs_bwrap = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not installed")


def decomposition(rid: str, *subs: tuple[Any, ...], domain: str = "geography") -> Decomposition:
    """A record of sub-questions (question, answer[, depends_on[, needs_tool]])."""
    steps = [
        SubQuestion(id=f"q{k}", question=s[0], answer=s[1],
                    depends_on=s[2] if len(s) > 2 else [],
                    needs_tool=s[3] if len(s) > 3 else True)
        for k, s in enumerate(subs, start=1)
    ]  # fmt: skip
    final = " and ".join(s[1] for s in subs)
    return Decomposition(id=rid, domain=domain, question=f"Tell me about {rid}: {final}?",
                         answer=final, subquestions=steps)  # fmt: skip


def write(path: Path, records: list[Decomposition]) -> Path:
    path.write_text("".join(r.model_dump_json() + "\n" for r in records))
    return path


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x]


def env_config(decomps: Path, out: Path, url: str, **kw: Any) -> EnvCodeConfig:
    base: dict[str, Any] = {"max_retries": 1, "sandbox": LIMITS, "concurrency": 4}
    return EnvCodeConfig(decompositions=[decomps], out=out,
                         model={"base_url": url, "model": MODEL}, **{**base, **kw})  # fmt: skip


def asked(srv: Any, marker: str) -> list[str]:
    """The prompts of the requests that were about a sub-question holding ``marker``."""
    prompts = [body["messages"][0]["content"] for body in srv.requests]
    return [p for p in prompts if marker in p]


# ------------------------------------------------------------------ the cheap checks


def test_static_and_schema_checks() -> None:
    assert static_problem("f", "import json, re\nfrom collections import Counter\n"
                          "def f(x):\n    return {'x': x}\n") is None  # fmt: skip
    bad = {
        "def f(:\n": "does_not_compile",
        "def g(x):\n    return x\n": "no_function",
        "import numpy\ndef f(x):\n    return x\n": "not_stdlib",
        "from .mod import y\ndef f(x):\n    return y\n": "not_stdlib",
    }
    for source, reason in bad.items():
        failure = static_problem("f", source)
        assert failure is not None and failure.reason == reason, source
    params = {"type": "object", "properties": {"city": {"type": "string"},
              "n": {"type": "integer"}, "unit": {"type": "string", "enum": ["C", "F"]}},
              "required": ["city"]}  # fmt: skip
    assert schema_problem(params, {"city": "Oslo", "n": 3}) is None
    assert "lack required" in (schema_problem(params, {"n": 3}) or "")
    assert "unknown parameters" in (schema_problem(params, {"city": "Oslo", "x": 1}) or "")
    assert "not of type integer" in (schema_problem(params, {"city": "Oslo", "n": True}) or "")
    assert "enum" in (schema_problem(params, {"city": "Oslo", "unit": "K"}) or "")
    assert "JSON schema" in (schema_problem({"type": "string"}, {}) or "")
    probe = vary_arguments(params, {"city": "Oslo", "n": 3, "unit": "C"})
    assert probe["unit"] == "F" and probe["city"] != "Oslo" and probe["n"] != 3  # all varied
    assert holds_token('{"q": "x Sella-7"}', "sella-7") and not holds_token("ORD-1234", "3")


# ------------------------------------------------------------------ env-code: the sandbox

HOSTILE = {  # plant → (reason, what the rejection says)
    "syntax": ("does_not_compile", "SyntaxError"),
    "loop": ("call_timeout", "timed out after 0.5 s"),
    "socket": ("call_failed", "network access is not allowed in the sandbox"),
    "write": ("call_failed", "writing outside /tmp (/etc/astra-synth-planted) is not allowed"),
    "subprocess": ("call_failed", "starting programs is not allowed in the sandbox"),
    "import": ("not_stdlib", "imports 'requests'"),
    "wrong": ("no_answer", "does not contain the sub-answer 'Sella-7'"),
    "constant": ("answer_for_other_arguments", "also returns the sub-answer"),
    "echo": ("answer_in_arguments", "contain its answer"),
}


@pytest.mark.integration
@needs_bwrap
async def test_env_code_rejects_broken_and_hostile_code_after_bounded_retries(
    tmp_path: Path,
) -> None:
    records = [decomposition("good", ("Which river crosses town-good? [key:town-good]", "Sella-7"))]
    records += [
        decomposition(kind, (f"Which river crosses town-{kind}? [key:town-{kind}] "
                             f"[plant:{kind}]", "Sella-7"))
        for kind in HOSTILE
    ]  # fmt: skip
    records.append(decomposition("fixed", ("Which river crosses town-fixed? [key:town-fixed] "
                                           "[plant:socket@1]", "Sella-7")))  # fmt: skip
    records.append(decomposition("none", ("Add 2 and 3.", "5", [], False)))
    path = write(tmp_path / "d.jsonl", records)
    with scripted_teacher_server(ScriptedTeacher(), MODEL) as srv:
        stats = await synth_env_code(env_config(path, tmp_path / "out", srv.base_url))
        counts = {r.id: len(asked(srv, f"town-{r.id}?")) for r in records[:-1]}
        fixed = asked(srv, "town-fixed?")
    kept = {r["id"]: r for r in read(tmp_path / "out" / "envs.jsonl")}
    rejected = {r["source"]: r for r in read(tmp_path / "out" / "rejections.jsonl")}
    assert set(kept) == {"good", "fixed"}
    assert counts == {"good": 1, "fixed": 2, **dict.fromkeys(HOSTILE, 2)}  # 1 + max_retries
    for kind, (reason, says) in HOSTILE.items():
        r = rejected[kind]
        assert (r["reason"], r["id"]) == (reason, f"{kind}/q1"), r
        assert says in r["detail"] and "after 2 tries" in r["detail"], r["detail"]
        assert r["raw"]  # the teacher's last reply
    assert rejected["none"]["reason"] == "no_tool_step"
    # the retry tells the teacher what the sandbox said, and shows its previous attempt
    assert "It was rejected: calling" in fixed[1] and "network access is not allowed" in fixed[1]
    assert "Attempt: 2 of 2" in fixed[1] and "Your previous attempt (JSON)" in fixed[1]
    step = kept["fixed"]["steps"][0]
    assert step["arguments"] == {"query": "town-fixed"} and "Sella-7" in step["output"]
    assert stats.rounds == {"1": 1, "2": 1} and stats.environments == 2
    assert stats.tokens["env_code.v1"].calls == 1 + 2 + 2 * len(HOSTILE)
    assert stats.rejections == dict(sorted(Counter(
        [*(reason for reason, _ in HOSTILE.values()), "no_tool_step"]).items()))  # fmt: skip
    prov = kept["good"]["provenance"]
    assert prov["stage"] == "env_code" and prov["inputs"] == ["good"]
    assert prov["prompts"] == {"env_code": "env_code.v1", "merge": "merge.v1"}


# ------------------------------------------------------------------ the merge rule, distractors


@pytest.mark.integration
@needs_bwrap
async def test_dispatcher_serves_each_variant() -> None:
    from training.synth.envs.sandboxed import Call, check_tool
    from training.testing.code import PARAMETERS, table_code

    a, b = table_code("area", {"k-one": "11 km2"}), table_code("area", {"k-two": "22 km2"})
    source = dispatcher("area", [a, b])
    calls = [Call("q1", {"query": "k-one"}, "11 km2"), Call("q2", {"query": "k-two"}, "22 km2")]
    outputs = await check_tool("area", source, PARAMETERS, calls, limits=LIMITS)
    assert isinstance(outputs, list) and "22 km2" in outputs[1]
    greedy = table_code("area", {"k-one": "11 km2"}, errors=False)  # never a miss: hides b
    failed = await check_tool("area", dispatcher("area", [greedy, b]), PARAMETERS, calls,
                              limits=LIMITS)  # fmt: skip
    assert not isinstance(failed, list) and failed.reason == "no_answer"


def _themed(n_records: int = 6) -> list[Entry]:
    themes = {
        "weather": ["weather forecast for city", "hourly rain temperature report"],
        "flight": ["search flights between airports", "flight seat booking fare"],
        "hotel": ["hotel room booking price", "hotel reviews and guest rating"],
        "bank": ["bank account balance lookup", "card payment transfer history"],
    }
    return [
        Entry(f"{theme}-{i}", f"{theme}_{i}_{k}", f"{theme} {text}")
        for theme, texts in themes.items()
        for i in range(n_records)
        for k, text in enumerate(texts)
    ]


def test_distractor_bands_are_seeded_and_banded() -> None:
    entries = _themed()
    index = DistractorIndex(entries)
    own = [e for e in entries if e.record == "weather-0"]
    picks = index.choose("weather-0", own, near=2, far=2, seed=7, near_pool=6)
    assert [p.band for p in picks] == ["near", "near", "far", "far"]
    assert all(p.entry.record.startswith("weather-") and p.entry.record != "weather-0"
               for p in picks[:2])  # fmt: skip
    assert all(not p.entry.record.startswith("weather") and p.score == 0 for p in picks[2:])
    assert len({p.entry.name for p in picks}) == 4
    again = index.choose("weather-0", own, near=2, far=2, seed=7, near_pool=6)
    assert again == picks  # same seed, same picks
    others = {
        tuple(p.entry.name for p in index.choose("weather-0", own, near=2, far=2, seed=s,
                                                 near_pool=6))
        for s in range(8)
    }  # fmt: skip
    assert len(others) > 1  # the seed matters
    tiny = DistractorIndex(entries[:4])  # weather-0 and weather-1 only: no far band
    few = tiny.choose("weather-0", own, near=1, far=3, seed=0)
    assert [p.entry.record for p in few] == ["weather-1", "weather-1"]  # what there is
    assert words("getCityWeather_v2 for-the rain") == ["city", "weather", "v2", "rain"]
    bm = BM25([["rain", "city"], ["rain"], ["flight"]])
    s = bm.scores(["rain", "city"])
    assert s[0] > s[1] > 0 and 2 not in s


def test_heldout_split_is_exact_and_seeded() -> None:
    ids = [f"rec:{i}" for i in range(50)]
    held = heldout_ids(ids, 0.1, seed=0)
    assert len(held) == 5 and held == heldout_ids(list(reversed(ids)), 0.1, seed=0)
    assert held != heldout_ids(ids, 0.1, seed=1)
    assert len(heldout_ids(ids[:3], 0.1, seed=0)) == 1  # at least one
    assert heldout_ids(ids, 0.0, seed=0) == set() and heldout_ids(ids[:1], 0.5, 0) == set()


# ------------------------------------------------------------------ end to end


def _world() -> list[Decomposition]:
    return [
        decomposition("chain", ("Which city hosts the Zorblat fair? [key:Zorblat fair]",
                                "Quenton"),
                      ("How many people live in the city that hosts the fair?", "48,213",
                       ["q1"]),
                      ("How many people is that per 1,000?", "48.2", ["q2"], False)),
        decomposition("rule", ("[tool:get_population] Population of Arvel? [key:Arvel]",
                               "1,204"),
                      ("[tool:get_population] Population of Bressa? [key:Bressa]", "9,876")),
        decomposition("teacher", ("[intent:elevation] How high is Tarn? [key:Tarn]",
                                  "2,341 m"),
                      ("[intent:elevation] Summit of Velmor? [key:Velmor]", "1,870 m")),
        decomposition("greedy", ("[tool:get_area] Area of Ilse? [key:Ilse] [plant:greedy]",
                                 "310 km2"),
                      ("[tool:get_area] Area of Orvo? [key:Orvo]", "95 km2")),
        decomposition("bad_merge", ("[intent:depth] Depth of lake Mira? [key:Mira]", "61 m"),
                      ("[intent:depth] Depth of lake Sunn? [key:Sunn] [plant:merge_wrong]",
                       "17 m")),
        decomposition("solo", ("Which port serves Haldor? [key:Haldor]", "Port Quill"),
                      domain="shipping"),
    ]  # fmt: skip


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("eval", *args, timeout=120, env={"COLUMNS": "200"})


@pytest.mark.integration
@needs_bwrap
def test_end_to_end_decompositions_to_validated_arena_records(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", _world())
    envs_dir, arenas_dir = tmp_path / "envs", tmp_path / "arenas"
    with scripted_teacher_server(ScriptedTeacher(), MODEL) as srv:
        stats = asyncio.run(
            synth_env_code(env_config(path, envs_dir, srv.base_url, merge="teacher"))
        )
        merge_asks = len([p for p in asked(srv, "") if p.startswith("[astra-synth:merge.v1]")])
    envs = {r["id"]: r for r in read(envs_dir / "envs.jsonl")}
    assert set(envs) == {r.id for r in _world()} and stats.merged == {"rule": 1, "teacher": 1}
    tools = {rid: {t["name"]: t for t in r["tools"]} for rid, r in envs.items()}
    assert tools["rule"]["get_population"]["serves"] == ["q1", "q2"]
    assert tools["rule"]["get_population"]["merged"] == "rule"
    assert set(tools["teacher"]) == {"find_elevation"}
    assert [s["tool"] for s in envs["teacher"]["steps"]] == ["find_elevation"] * 2
    assert set(tools["greedy"]) == {"get_area", "get_area_2"}  # the rule's merge failed
    assert len(tools["bad_merge"]) == 2  # the teacher's merge failed twice: kept apart
    chain = envs["chain"]
    assert chain["steps"][1]["arguments"] == {"query": "Quenton"}  # from q1's answer
    assert chain["reasoning"] == ["q3"] and len(chain["steps"]) == 2
    reasons = Counter((r["source"], r["reason"]) for r in read(envs_dir / "rejections.jsonl"))
    assert reasons == {("greedy", "merge_failed"): 1, ("bad_merge", "merge_failed"): 1}
    # merge asked once per record of 2+ tools after the rule, twice for the failed proposal
    assert merge_asks == 5 and stats.tokens["merge.v1"].calls == 5

    arena_args = ["arenas", "--envs", str(envs_dir), "--out", str(arenas_dir),
                  "--heldout", "0.34", "--near", "1", "--far", "1", "--seed", "3"]  # fmt: skip
    res = CliRunner().invoke(synth_app, arena_args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    train, held = read(arenas_dir / "train.jsonl"), read(arenas_dir / "heldout.jsonl")
    assert len(held) == 2 and len(train) == 4
    assert {r["task_id"] for r in train} | {r["task_id"] for r in held} == set(envs)
    assert {r["task_id"] for r in held} == heldout_ids(sorted(envs), 0.34, 3)
    assert read(arenas_dir / "arenas.jsonl") == sorted(
        train + held, key=lambda r: [e.id for e in _world()].index(r["task_id"])
    )
    split_of = {r["task_id"]: r["split"] for r in train + held}
    for r in train + held:
        schema = [t["function"]["name"] for t in json.loads(r["tool_schema"])]
        own = {t["name"] for t in envs[r["task_id"]]["tools"]}
        picked = r["provenance"]["detail"]["distractors"]
        assert schema == sorted(schema) and set(schema) == own | {p["name"] for p in picked}
        assert all(split_of[p["record"]] == r["split"] for p in picked)  # never across
        assert [c["name"] for c in r["reference"]] == [s["tool"] for s in envs[r["task_id"]]
                                                       ["steps"]]  # fmt: skip
    rule = next(r for r in train + held if r["task_id"] == "rule")
    assert json.loads(rule["sub_qa_dict"]) == {"get_population": ["1,204", "9,876"]}
    res = CliRunner().invoke(synth_app, [*arena_args, "--resume"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and read(arenas_dir / "train.jsonl") == train  # complete: kept
    shards: list[dict[str, Any]] = []  # shards: the same records, distractors included
    for k in range(2):
        args = [*arena_args[:4], str(tmp_path / f"shard-{k}"), *arena_args[5:], "--shard", f"{k}/2"]
        assert CliRunner().invoke(synth_app, args).exit_code == 0
        shards += read(tmp_path / f"shard-{k}" / "arenas.jsonl")

    def same(r: dict[str, Any]) -> dict[str, Any]:
        return {**r, "provenance": r["provenance"]["detail"]}

    assert sorted(map(json.dumps, map(same, shards))) == sorted(
        map(json.dumps, map(same, train + held))
    )
    for name in ("train.jsonl", "heldout.jsonl"):
        out = cli("arenas", "validate", str(arenas_dir / name))
        assert out.returncode == 0, out.stdout + out.stderr
        n = len(read(arenas_dir / name))
        assert f"{n} loaded, {n} validated in the sandbox, 0 problem(s)" in out.stdout
    # and `astra-eval arenas` runs them: a model replaying the reference chain solves each
    every = arenas_dir / "arenas.jsonl"
    with ScriptedServer(replay_script(load_arena_file(every).tasks)) as replay:
        out = cli("arenas", "--data", str(every), "--base-url", replay.base_url,
                  "--out", str(tmp_path / "run"), "--concurrency", "3")  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    results = {r["id"]: r for r in read(tmp_path / "run" / "results.jsonl")}
    assert set(results) == set(envs) and all(r["fully_solved"] for r in results.values())
    for r in read(every):  # ASTRA's F1 counts tools: a merged tool's second call lowers it
        gold, calls = len(json.loads(r["sub_qa_dict"])), len(r["reference"])
        assert results[r["task_id"]]["reward"] == pytest.approx(2 * gold / (gold + calls),
                                                                abs=1e-4)  # fmt: skip


# ------------------------------------------------------------------ kill and resume


@pytest.mark.integration
@needs_bwrap
def test_env_code_kill_and_resume_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    records = [decomposition(f"r{i:02d}", (f"Which river crosses town-{i}? [key:town-{i}]",
                                           f"River-{i}x"))
               for i in range(10)]  # fmt: skip
    path = write(tmp_path / "d.jsonl", records)
    out = tmp_path / "out"
    with scripted_teacher_server(ScriptedTeacher(delay_s=0.1), MODEL) as srv:
        args = ["synth", "env-code", "--decompositions", str(path), "--out", str(out),
                "--base-url", srv.base_url, "--model", MODEL, "--max-retries", "1",
                "--call-timeout", "2", "--concurrency", "2"]  # fmt: skip
        done = kill_stage_midway(args, out, 3, len(records), torn="r99")
        srv.set_script(ScriptedTeacher())
        cfg = env_config(path, out, srv.base_url, concurrency=2,
                         sandbox=CheckLimits(wall_seconds_per_call=2))  # fmt: skip
        stats, asked = resume_killed_stage(synth_env_code, cfg, "env_code", srv)
        assert asked == len(records) - done  # only the rest was asked
    kept = read(out / "envs.jsonl")
    assert sorted(r["id"] for r in kept) == [r.id for r in records]
    assert not read(out / "rejections.jsonl")
    assert stats.resumed_units == done and stats.environments == len(records)
    assert stats.tokens["env_code.v1"].calls == len(records)  # the killed run's tokens kept
