"""`astra-eval compare`: the classification and the paired tests on records written with the
real record classes, then the command on real runs of `astra-eval bfcl` and `astra-eval
arenas` (scripted servers over HTTP): kinds refused, half-written runs, --json, --show."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from astra_agent.arena import load_arena_file
from astra_agent.errors import ConfigError
from astra_agent.testing.scripted_server import Reply, Script, ScriptedServer
from astra_agent.trajectory import append_jsonl
from eval.arenas import DATA_DIR
from eval.arenas.replay import replay_script as arena_replay
from eval.arenas.runner import ArenaEvalConfig, ArenaRecord
from eval.arenas.runner import summarize as arena_summary
from eval.bfcl import load_category
from eval.bfcl.replay import replay_script as bfcl_replay
from eval.bfcl.runner import BFCLConfig, BFCLRecord
from eval.bfcl.runner import summarize as bfcl_summary
from eval.compare import compare_runs, mcnemar, wilcoxon_rewards
from eval.results import RunMeta, write_json_atomic
from tests.conftest import run_module

HELDOUT = DATA_DIR / "heldout.jsonl"
MISMATCH, RESPONSE = "multi_turn:instance_state_mismatch", "multi_turn:execution_response_mismatch"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"COLUMNS": "250", "ASTRA_EVAL_MODEL__MAX_RETRIES": "0"}
    return run_module("eval", *args, timeout=300, env=env)


def compare_json(a: Path, b: Path, out_json: Path) -> tuple[Any, dict[str, Any]]:
    """`astra-eval compare A B --json OUT` as a user runs it: its output, and the comparison
    it wrote."""
    out = cli("compare", str(a), str(b), "--json", str(out_json))
    assert out.returncode == 0, out.stderr[-2000:]
    return out, json.loads(out_json.read_text())


def write_run(out: Path, records: list[Any], *, complete: bool = True) -> Path:
    """A run directory as `run_eval` writes it: config.json, results.jsonl, summary.json."""
    out.mkdir(parents=True)
    bfcl = isinstance(records[0], BFCLRecord)
    spec = BFCLConfig(out=out) if bfcl else ArenaEvalConfig(out=out, data=HELDOUT)
    meta = RunMeta(fingerprint={"model": out.name, **spec.fingerprint()})
    write_json_atomic(out / "config.json", meta.model_dump(mode="json"))
    for r in records:
        append_jsonl(out / "results.jsonl", r, fsync=False)
    last = list({r.id: r for r in records}.values())
    summary = (bfcl_summary(last) if bfcl else arena_summary(last)).written()
    n = len(last) + (0 if complete else 3)
    summary |= {"total": n, "complete": complete, "wall_s": 0.1, "model": out.name}
    write_json_atomic(out / "summary.json", summary)
    return out


def bfcl(id_: str, valid: bool, error_type: str | None = None, **kw: Any) -> BFCLRecord:
    category = kw.pop("category", "base")
    return BFCLRecord(
        id=id_, category=category, valid=valid, error_type=None if valid else error_type, **kw
    )


def arena(i: int, reward: float, **kw: Any) -> ArenaRecord:
    return ArenaRecord(
        id=f"t{i}", index=i, task_id=f"t{i}", domain="odd" if i % 2 else "even", reward=reward,
        recall=reward, precision=1.0, solved=[], required=2, tool_calls=2,
        fully_solved=reward == 1.0, termination=kw.pop("termination", "stop"), **kw,
    )  # fmt: skip


INFERENCE = {"error": "inference error: HTTP 400", "error_kind": "inference"}


def test_bfcl_counts_groups_and_exact_mcnemar(tmp_path: Path) -> None:
    a = [bfcl(f"multi_turn_base_{i}", False, MISMATCH) for i in range(5)]  # fixed
    b = [bfcl(f"multi_turn_base_{i}", True) for i in range(5)]
    a.append(bfcl("multi_turn_base_5", True))  # broken
    b.append(bfcl("multi_turn_base_5", False, RESPONSE))
    for i in (6, 7):  # changed error type
        a.append(bfcl(f"multi_turn_miss_func_{i}", False, MISMATCH, category="miss_func"))
        b.append(bfcl(f"multi_turn_miss_func_{i}", False, RESPONSE, category="miss_func"))
    a.append(bfcl("multi_turn_miss_func_8", False, MISMATCH, category="miss_func"))  # both fail
    b.append(bfcl("multi_turn_miss_func_8", False, MISMATCH, category="miss_func"))
    for i in (9, 10, 11):  # both pass
        a.append(bfcl(f"multi_turn_base_{i}", True))
        b.append(bfcl(f"multi_turn_base_{i}", True))
    a.append(bfcl("multi_turn_base_12", False, "multi_turn:inference_error", **INFERENCE))
    b.append(bfcl("multi_turn_base_12", True))
    a.append(bfcl("multi_turn_base_13", True))
    b.append(bfcl("multi_turn_base_13", False, "x", error="RuntimeError: boom", error_kind="run"))
    a.append(bfcl("multi_turn_base_14", True))  # only in A
    b += [bfcl("multi_turn_base_15", False, MISMATCH), bfcl("multi_turn_base_16", True)]
    # --retry-errors appends a newer record of an id: the later one wins (here: a fix).
    a.insert(0, bfcl("multi_turn_base_9", False, "multi_turn:inference_error", **INFERENCE))
    c = compare_runs(write_run(tmp_path / "a", a), write_run(tmp_path / "b", b))
    d = c.to_dict()
    assert d["kind"] == "bfcl" and d["names"] == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert d["counts"] == {
        "fixed": 5, "broken": 1, "changed_error": 2, "both_fail": 1, "both_pass": 3,
        "errors": 2, "only_a": 1, "only_b": 2,
    }  # fmt: skip
    # Exact McNemar by hand: 5 of 6 discordant pairs fixed, two-sided:
    # 2 * P(X <= 1 | n=6, p=1/2) = 2 * (1 + 6) / 64.
    (test,) = d["tests"]
    assert test["n"] == 6 and test["statistic"] == 5
    assert test["p_value"] == pytest.approx(14 / 64, abs=1e-12)
    # Accuracies over the 12 compared entries only (errors and one-run ids left out).
    assert d["groups"] == {
        "base": {"a": round(4 / 9, 4), "b": round(8 / 9, 4), "n": 9},
        "miss_func": {"a": 0.0, "b": 0.0, "n": 3},
    }
    assert d["overall"] == {"a": round(4 / 12, 4), "b": round(8 / 12, 4), "n": 12}
    rows = {r["id"]: r for r in d["rows"]}
    assert [r["id"] for r in d["rows"]][:3] == [f"multi_turn_base_{i}" for i in range(3)]
    assert rows["multi_turn_base_12"] == {
        "id": "multi_turn_base_12", "change": "error", "category": "base", "a": None, "b": True,
        "a_error": "inference error: HTTP 400", "b_error": None,
    }  # fmt: skip
    assert rows["multi_turn_miss_func_7"]["a_error"] == MISMATCH
    assert rows["multi_turn_miss_func_7"]["b_error"] == RESPONSE
    assert (
        rows["multi_turn_base_14"]["change"] == "only_a" and rows["multi_turn_base_14"]["b"] is None
    )
    assert [r.change for r in c.changed()][:3] == ["broken", "fixed", "fixed"]
    json.dumps(d)  # JSON-able as it is


def test_arena_rewards_wilcoxon_and_mcnemar_on_fully_solved(tmp_path: Path) -> None:
    before = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 1.0, 0.5]
    after = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.95, 0.5]
    a = [arena(i, r) for i, r in enumerate(before)]
    b = [arena(i, r) for i, r in enumerate(after)]
    a.append(arena(9, 0.0, termination="model_error", **INFERENCE))
    b.append(arena(9, 1.0))
    c = compare_runs(write_run(tmp_path / "a", a), write_run(tmp_path / "b", b))
    d = c.to_dict()
    assert d["kind"] == "arenas"
    assert d["counts"] == {
        "fixed": 7, "broken": 1, "changed_error": 0, "both_fail": 1, "both_pass": 0,
        "errors": 1, "only_a": 0, "only_b": 0, "reward_up": 7, "reward_down": 1, "reward_same": 1,
    }  # fmt: skip
    wilcoxon, solved = d["tests"]
    # By hand: the 8 non-zero differences have distinct sizes, the one negative one the
    # smallest (rank 1): W- = 1, and P(W <= 1) = 2 / 2^8 ({} and {1}); two-sided 4 / 256.
    assert wilcoxon["n"] == 8 and wilcoxon["statistic"] == 1
    assert wilcoxon["p_value"] == pytest.approx(4 / 256, abs=1e-12)
    mean = (sum(after) - sum(before)) / 9
    assert f"{mean:+.4f}" in wilcoxon["note"]
    # McNemar on fully_solved: 7 fixed vs 1 broken → 2 * (1 + 8) / 256.
    assert solved["n"] == 8 and solved["p_value"] == pytest.approx(18 / 256, abs=1e-12)
    assert d["groups"]["even"]["n"] == 5 and d["groups"]["odd"]["n"] == 4
    assert d["overall"]["a_reward"] == round(sum(before) / 9, 4)
    row = next(r for r in d["rows"] if r["id"] == "t7")
    assert row["change"] == "broken" and row["reward"] == "down" and row["a_solved"] is True
    assert next(r for r in d["rows"] if r["id"] == "t9")["change"] == "error"


def test_too_few_pairs_and_no_discordant_pairs() -> None:
    few = wilcoxon_rewards([0.5, 0.25, -0.1, 0.2, 0.3, 0.0, 0.0])
    assert few.p_value is None and few.statistic is None and few.n == 5
    assert "too few pairs" in few.note
    same = mcnemar(0, 0)
    assert same.p_value is None and same.n == 0 and "no discordant pairs" in same.note
    assert mcnemar(3, 0).p_value == pytest.approx(2 / 8)


def test_bad_pairs_of_runs_are_config_errors(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", [bfcl("multi_turn_base_0", True)])
    b = write_run(tmp_path / "b", [bfcl("multi_turn_base_1", True)])
    with pytest.raises(ConfigError, match="no entry in common"):
        compare_runs(a, b)
    ar = write_run(tmp_path / "ar", [arena(0, 1.0)])
    with pytest.raises(ConfigError, match=r"different kinds: .* is a BFCL run, .* an arena run"):
        compare_runs(a, ar)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError):
        compare_runs(a, tmp_path / "empty")
    with pytest.raises(ConfigError):
        compare_runs(a, tmp_path / "missing")


def test_incomplete_and_half_written_runs_warn(tmp_path: Path) -> None:
    recs = [bfcl("multi_turn_base_0", True), bfcl("multi_turn_base_1", False, MISMATCH)]
    a = write_run(tmp_path / "a", recs, complete=False)
    b = write_run(tmp_path / "b", recs)
    (b / "summary.json").unlink()  # killed before its first summary
    c = compare_runs(a, b)
    assert c.counts()["both_pass"] == 1 and c.counts()["both_fail"] == 1
    assert any(w.startswith(f"{a}: ") and "incomplete: 2 of 5" in w for w in c.warnings)
    assert any(w.startswith(f"{b}: no summary.json") for w in c.warnings)


# ------------------------------------------------------------------ real runs, the command


def run_cli(script: Script, *args: str) -> None:
    with ScriptedServer(script) as srv:
        out = cli(*args, "--base-url", srv.base_url)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Real runs: BFCL base A (7 entries; 0, 1 fail) and B (8; 2, 3 fail, 4 an inference
    error); arenas A (6 tasks; 0, 1 stop after one call) and B (2, 3 stop early, 4 errors)."""
    root = tmp_path_factory.mktemp("runs")
    entries = list(load_category("base"))[:8]
    first = [e.question[0][0]["content"] for e in entries]
    replay = bfcl_replay(entries)

    def no_calls(fail: set[int], error: set[int]) -> Script:
        def serve(req: dict[str, Any]) -> Reply:
            n = first.index(next(m["content"] for m in req["messages"] if m["role"] == "user"))
            if n in error:
                return Reply(status=400)
            return Reply(content="I cannot do that.") if n in fail else replay(req)

        return serve

    bfcl_args = ["bfcl", "--categories", "base", "--concurrency", "4"]
    run_cli(no_calls({0, 1}, set()), *bfcl_args, "--limit", "7", "--out", str(root / "bfcl-a"))
    run_cli(no_calls({2, 3}, {4}), *bfcl_args, "--limit", "8", "--out", str(root / "bfcl-b"))
    tasks = load_arena_file(HELDOUT).tasks[:6]
    prompts = [t.prompt[-1]["content"] for t in tasks]
    play = arena_replay(tasks)

    def early_stop(stop: set[int], error: set[int]) -> Script:
        def serve(req: dict[str, Any]) -> Reply:
            msgs = req["messages"]
            n = prompts.index([m for m in msgs if m["role"] == "user"][-1]["content"])
            if n in error:
                return Reply(status=400)
            if n in stop and any(m["role"] == "tool" for m in msgs):
                return Reply(content="Done.")
            return play(req)

        return serve

    arena_args = ["arenas", "--data", str(HELDOUT), "--limit", "6", "--concurrency", "3"]
    run_cli(early_stop({0, 1}, set()), *arena_args, "--out", str(root / "arenas-a"))
    run_cli(early_stop({2, 3}, {4}), *arena_args, "--out", str(root / "arenas-b"))
    yield {k: root / k for k in ("bfcl-a", "bfcl-b", "arenas-a", "arenas-b")}


@pytest.mark.integration
def test_compare_bfcl_runs_from_the_command(runs: dict[str, Path], tmp_path: Path) -> None:
    out_json = tmp_path / "cmp.json"
    out, d = compare_json(runs["bfcl-a"], runs["bfcl-b"], out_json)
    assert d["counts"] == {
        "fixed": 2, "broken": 2, "changed_error": 0, "both_fail": 0, "both_pass": 2,
        "errors": 1, "only_a": 0, "only_b": 1,
    }  # fmt: skip
    change = {r["id"]: r["change"] for r in d["rows"]}
    assert [change[f"multi_turn_base_{i}"] for i in range(8)] == [
        "fixed", "fixed", "broken", "broken", "error", "both_pass", "both_pass", "only_b",
    ]  # fmt: skip
    assert d["tests"][0]["p_value"] == pytest.approx(1.0) and d["tests"][0]["n"] == 4
    assert d["groups"] == {"base": {"a": round(4 / 6, 4), "b": round(4 / 6, 4), "n": 6}}
    text = out.stdout
    assert "McNemar exact (verdicts)" in text and "2 fixed vs 2 broken" in text
    assert "changed entries (first 4 of 4)" in text
    assert text.index("multi_turn_base_2") < text.index("multi_turn_base_0")  # broken first
    assert f"comparison: {out_json}" in text
    # An existing --json file is kept unless --overwrite.
    again = cli("compare", str(runs["bfcl-a"]), str(runs["bfcl-b"]), "--json", str(out_json))
    assert (
        again.returncode == 2 and "already exists" in again.stderr and "--overwrite" in again.stderr
    )
    out_json.write_text("{}")
    forced = cli("compare", str(runs["bfcl-a"]), str(runs["bfcl-b"]), "--json", str(out_json),
                 "--overwrite", "--show", "1")  # fmt: skip
    assert forced.returncode == 0 and json.loads(out_json.read_text())["kind"] == "bfcl"
    assert "changed entries (first 1 of 4)" in forced.stdout
    assert "multi_turn_base_3" not in forced.stdout  # only the first broken one listed


@pytest.mark.integration
def test_compare_arena_runs_and_a_half_written_one(runs: dict[str, Path], tmp_path: Path) -> None:
    b = tmp_path / "b"
    shutil.copytree(runs["arenas-b"], b)
    (b / "summary.json").unlink()
    out, d = compare_json(runs["arenas-a"], b, tmp_path / "c.json")
    assert f"warning: {b}: no summary.json (the run did not finish)" in out.stderr
    counts = d["counts"]
    assert (counts["fixed"], counts["broken"], counts["both_pass"], counts["errors"]) == (
        2,
        2,
        1,
        1,
    )
    assert (counts["reward_up"], counts["reward_down"]) == (2, 2)
    wilcoxon, solved = d["tests"]
    assert wilcoxon["p_value"] is None and "too few pairs: 4" in wilcoxon["note"]
    assert solved["n"] == 4 and solved["p_value"] == pytest.approx(1.0)
    assert "too few pairs" in out.stdout and "by domain" in out.stdout


@pytest.mark.integration
def test_compare_refuses_other_kinds_and_other_dirs(runs: dict[str, Path], tmp_path: Path) -> None:
    out = cli("compare", str(runs["bfcl-a"]), str(runs["arenas-b"]))
    assert out.returncode == 2, out.stderr
    assert "cannot compare runs of different kinds" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    out = cli("compare", str(runs["bfcl-a"]), str(tmp_path / "notes"))
    assert out.returncode == 2 and "error:" in out.stderr and "Traceback" not in out.stderr
