"""BFCL beyond multi-turn: the single-turn requests equal the official handler's for every
entry, category and group names, the V4 and V3 overall scores, and the runner end to end
against scripted endpoints over HTTP (the gold answers replayed; garbage; a dead endpoint)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from astra_agent.errors import ConfigError
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from eval.bfcl.categories import (
    LIVE,
    MULTI_TURN,
    NON_LIVE,
    REFUSED,
    RUNNABLE,
    SINGLE_TURN,
    resolve,
)
from eval.bfcl.official import load_category
from eval.bfcl.overall import overall
from eval.bfcl.replay import replay_script, single_replay_script
from eval.bfcl.single import fc_tools, load_single, messages
from tests.conftest import run_module

ROOT = Path(__file__).parents[2]
OFFICIAL_PYTHON = (
    Path(os.environ.get("ASTRA_BFCL_OFFICIAL", ROOT / ".venv-bfcl/bin/bfcl")).parent / "python"
)


def test_every_single_turn_request_equals_the_official_handlers() -> None:
    """Tools and messages of all 3,641 single-turn entries, byte for byte as JSON, against
    what the official FC handler for OpenAI-compatible endpoints builds (in its own env)."""
    if not OFFICIAL_PYTHON.is_file():
        pytest.skip(f"no official bfcl-eval environment ({OFFICIAL_PYTHON}): make setup-bfcl")
    run = subprocess.run(
        [str(OFFICIAL_PYTHON), str(ROOT / "eval/bfcl/official_requests.py")],
        input=json.dumps(list(SINGLE_TURN)),
        capture_output=True,
        text=True,
        env={**os.environ, "OPENAI_API_KEY": "unused"},
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    official = json.loads(run.stdout)
    ours = {
        e.id: {"tools": fc_tools(e), "messages": messages(e)}
        for c in SINGLE_TURN
        for e in load_single(c)
    }
    assert len(ours) == len(official) == 3641
    differing = [i for i in ours if ours[i] != official[i]]
    assert differing == []


def test_categories_resolve_groups_aliases_and_refusals() -> None:
    assert resolve(["all"]) == list(RUNNABLE)
    assert resolve(["live", "non_live"]) == [*NON_LIVE, *LIVE]  # the leaderboard's order
    assert resolve(["multi_turn_base", "base", "simple_python"]) == ["simple_python", "base"]
    assert resolve(["multi_turn"]) == list(MULTI_TURN)
    for name in REFUSED:
        with pytest.raises(ConfigError, match=f"{name}.*cannot run here"):
            resolve([name])
    assert resolve(["agentic"]) == resolve(["memory"]) == ["memory_kv", "memory_rec_sum"]
    with pytest.raises(ConfigError, match="SerpAPI"):
        resolve(["web_search_base"])
    with pytest.raises(ConfigError, match="choose from non_live, live"):
        resolve(["simple"])
    with pytest.raises(ConfigError, match="no category"):
        resolve([])


SIZES = {c: len(load_single(c)) for c in LIVE}


def test_v4_and_v3_overall_as_the_official_evaluator_computes_them() -> None:
    acc = {c: 50.0 for c in RUNNABLE}
    acc |= {"simple_java": 20.0, "live_simple": 80.0, "live_irrelevance": 90.0, "base": 10.0}
    counts = {c: 10 for c in RUNNABLE} | {c: SIZES[c] for c in LIVE}
    o = overall(acc, counts, SIZES)
    simple = (50 + 20 + 50) / 3
    non_live = (simple + 50 + 50 + 50) / 4
    n = {
        c: SIZES[c]
        for c in ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
    }
    live = (80 * n["live_simple"] + 50 * (sum(n.values()) - n["live_simple"])) / sum(n.values())
    irrelevance = (50 + 90) / 2
    multi = (10 + 50 + 50 + 50) / 4
    assert o.v4_groups["non_live"].value == pytest.approx(non_live)
    assert o.v4_groups["live"].value == pytest.approx(live)
    assert o.v4_groups["irrelevance"].value == pytest.approx(irrelevance)
    assert o.v4_groups["agentic"].partial
    memory = (50 + 0 + 50) / 3  # memory_vector did not run
    v4 = 0.1 * non_live + 0.1 * live + 0.1 * irrelevance + 0.3 * multi + 0.4 * (memory / 2)
    assert o.v4.value == pytest.approx(v4)
    assert o.v4.missing == ["web_search_base", "web_search_no_snippet", "memory_vector"]
    assert o.v4_groups["agentic"].value == pytest.approx((0 + memory) / 2)
    v3_non_live = (simple + 50 + 50 + 50 + 50) / 5
    six = {c: SIZES[c] for c in LIVE}
    v3_live = (
        80 * six["live_simple"]
        + 90 * six["live_irrelevance"]
        + 50 * (sum(six.values()) - six["live_simple"] - six["live_irrelevance"])
    ) / sum(six.values())
    assert o.v3.value == pytest.approx((v3_non_live + v3_live + multi) / 3)
    assert not o.v3.partial


def test_a_category_not_run_counts_zero_and_marks_partial() -> None:
    acc = {"simple_python": 90.0, "live_simple": 60.0}
    o = overall(acc, {"simple_python": 5, "live_simple": 5}, SIZES)
    assert o.v4_groups["non_live"].value == pytest.approx(90 / 3 / 4)
    assert "simple_java" in o.v4_groups["non_live"].missing
    # a live category that did not run weighs with its full size, at 0
    assert o.v4_groups["live"].value == pytest.approx(
        60
        * 5
        / (5 + sum(SIZES[c] for c in ("live_multiple", "live_parallel", "live_parallel_multiple")))
    )
    assert o.v3.partial and "base" in o.v3.missing


# ---- the runner end to end, against scripted endpoints over real HTTP ----


OFFICIAL_BFCL = OFFICIAL_PYTHON.parent / "bfcl"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("eval", "bfcl", *args, timeout=900, env={"COLUMNS": "200"})


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


def single_entries(limit: int) -> list[Any]:
    return [e for c in SINGLE_TURN for e in load_single(c)[:limit]]


@pytest.mark.integration
def test_gold_replayed_scores_100_on_every_single_turn_category(tmp_path: Path) -> None:
    with ScriptedServer(single_replay_script(single_entries(25))) as srv:
        out = cli("--categories", "single_turn", "--limit", "25", "--base-url", srv.base_url,
                  "--concurrency", "16", "--out", str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["accuracy"] == {c: 100.0 for c in SINGLE_TURN}
    assert summary["counts"] == {c: min(25, len(load_single(c))) for c in SINGLE_TURN}
    assert summary["overall"] is None and summary["bfcl_eval"] == "2026.3.23"
    v4, v3 = summary["v4_overall"], summary["v3_overall"]
    # every single-turn group at 100, multi-turn and agentic missing (counted 0)
    assert v4["value"] == 30.0 and "base" in v4["missing"] and "memory_kv" in v4["missing"]
    assert v3["value"] == pytest.approx(200 / 3, abs=0.01) and v3["missing"] == list(MULTI_TURN)
    assert "BFCL V4 overall 30.00 (partial*)" in out.stdout
    assert "not run, counted 0" in out.stdout
    rec = next(r for r in records(tmp_path) if r["id"] == "parallel_0")
    assert rec["valid"] and len(rec["calls"]) == 2 and rec["result"][0]


@pytest.mark.integration
def test_mixed_replies_agree_with_the_official_checker_and_bfcl_evaluate(tmp_path: Path) -> None:
    """Gold and mutated replies over HTTP, one run over single-turn and multi-turn: every
    verdict equals the official checker's and the official `bfcl evaluate`'s."""
    if not OFFICIAL_BFCL.is_file():
        pytest.skip(f"no official pipeline at {OFFICIAL_BFCL}: make setup-bfcl")
    script = replay_script(
        list(load_category("base")[:3]), single_replay_script(single_entries(12), mixed=True)
    )
    with ScriptedServer(script) as srv:
        out = cli("--categories", "all", "--limit", "12", "--base-url", srv.base_url,
                  "--concurrency", "16", "--out", str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    recs = records(tmp_path)
    single = [r for r in recs if r["category"] in SINGLE_TURN]
    passed = sum(r["valid"] for r in single)
    assert 0.2 * len(single) < passed < 0.9 * len(single)  # the mixed replies fail some
    assert len({r["error_type"] for r in single if not r["valid"]}) >= 5
    parity = cli("parity", "--out", str(tmp_path), "--official-bfcl", str(OFFICIAL_BFCL))
    assert parity.returncode == 0, parity.stdout[-2000:] + parity.stderr[-2000:]
    assert (
        f"{len(recs)} entries re-scored with the official checker: {len(recs)} agree"
        in parity.stdout
    )
    assert f"with the official `bfcl evaluate`: {len(recs)} agree, 0 differ" in parity.stdout
    assert (tmp_path / "official" / "astra" / "live" / "BFCL_v4_live_simple_result.json").is_file()


@pytest.mark.integration
def test_garbage_and_a_dead_endpoint_are_inference_errors_not_answers(tmp_path: Path) -> None:
    def script(req: dict[str, Any]) -> Reply:
        text = json.dumps(req["messages"])
        if "triangle" in text:
            return Reply(status=500)
        return Reply(body=b"\x00not json", content_type="application/json")

    with ScriptedServer(script) as srv:
        out = cli("--categories", "simple_python,irrelevance", "--limit", "4",
                  "--base-url", srv.base_url, "--out", str(tmp_path))  # fmt: skip
    recs = records(tmp_path)
    assert len(recs) == 8
    # irrelevance would pass on any reply without a call: an endpoint failure is not one
    assert all(not r["valid"] and r["error_kind"] == "inference" for r in recs)
    assert all(r["error_type"] == "inference_error" for r in recs)
    assert {r["endpoint_failure"] for r in recs} <= {"status", "other", "malformed"}
    assert out.returncode == 1 and "no entry of this run could be played" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_selection_and_report_halves_split_every_category_by_a_fixed_hash() -> None:
    from eval.bfcl.categories import half_of
    from eval.bfcl.runner import BFCLConfig, select

    for c in RUNNABLE:
        ids = [e.id for e in select(BFCLConfig(categories=[c]))]
        sel = [e.id for e in select(BFCLConfig(categories=[c], half="selection"))]
        rep = [e.id for e in select(BFCLConfig(categories=[c], half="report"))]
        assert sorted(sel + rep) == sorted(ids) and not set(sel) & set(rep)
        if len(ids) >= 100:
            assert 0.4 < len(sel) / len(ids) < 0.6, c
    assert half_of("simple_python_0") == half_of("simple_python_0")  # no state, no salt drift
    limited = select(BFCLConfig(categories=["live_simple"], half="report", limit=5))
    assert len(limited) == 5 and {half_of(e.id) for e in limited} == {"report"}
    assert "half" not in BFCLConfig(categories=["base"]).fingerprint()  # old runs still resume
    assert BFCLConfig(categories=["base"], half="report").fingerprint()["half"] == "report"


def test_entry_views_name_the_failed_turn_check_and_the_single_turn_verdict() -> None:
    from eval.bfcl.report import bfcl_view

    multi = {
        "id": "multi_turn_base_3",
        "category": "base",
        "valid": False,
        "error_type": "multi_turn:instance_state_mismatch",
        "failed_turn": 2,
        "details": {
            "class": "GorillaFileSystem",
            "differences": {"cwd": {"model": "/a", "ground_truth": "/b"}},
        },
    }
    line, view = bfcl_view(multi)
    assert line.label == "instance_state_mismatch (turn 2)"
    facts = dict(map(tuple, view["facts"]))
    assert facts["failed turn"] == "2" and facts["failed check"].startswith("state")
    assert view["checker"]["details"]["differences"]["cwd"]["ground_truth"] == "/b"

    single = {
        "id": "simple_python_0",
        "category": "simple_python",
        "valid": False,
        "error_type": "value_error:others",
        "details": {"errors": ["Invalid value for parameter 'base'"]},
        "result": [{"calculate_triangle_area": '{"base": 11, "height": 5}'}],
        "calls": [{"calculate_triangle_area": {"base": 11, "height": 5}}],
    }
    line, view = bfcl_view(single)
    (turn,) = view["turns"]
    assert turn[0]["role"] == "user" and "triangle" in turn[0]["content"]  # from the data
    assert turn[-1]["tool_calls"][0]["function"]["name"] == "calculate_triangle_area"
    assert "Invalid value for parameter 'base'" in view["explanation"]
    assert "gold (any of the listed values per parameter)" in view["explanation"]
