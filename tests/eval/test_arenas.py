"""`astra-eval arenas` end to end: our arena set, the replaying scripted model, resume, vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from astra_agent.arena import load_arena_file
from astra_agent.errors import ConfigError
from astra_agent.testing.scripted_server import ScriptedServer
from eval.arenas import DATA_DIR, ArenaEvalConfig, evaluate_arenas, replay_script
from serving.server import ModelServer
from tests.conftest import kill_after_records, run_module

pytestmark = pytest.mark.integration
HELDOUT = DATA_DIR / "heldout.jsonl"
TRAIN = DATA_DIR / "train.jsonl"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("eval", *args, timeout=600, env={"COLUMNS": "200", **(env or {})})


@pytest.fixture(scope="module")
def replay() -> Iterator[ScriptedServer]:
    tasks = load_arena_file(HELDOUT).tasks + load_arena_file(TRAIN).tasks
    with ScriptedServer(replay_script(tasks)) as srv:
        yield srv


def test_our_arena_set_shape() -> None:
    train, held = load_arena_file(TRAIN), load_arena_file(HELDOUT)
    tasks = train.tasks + held.tasks
    assert len(tasks) >= 30 and not train.errors and not held.errors
    assert len({t.domain for t in tasks}) >= 5
    assert {len(t.sub_qa) for t in tasks} <= {2, 3, 4, 5}
    assert all(len(t.tools) > len(t.sub_qa) for t in tasks)  # distractors offered
    assert not {t.task_id for t in train.tasks} & {t.task_id for t in held.tasks}


@pytest.mark.parametrize("path", [TRAIN, HELDOUT])
def test_validate_command_passes_on_our_sets(path: Path) -> None:
    out = cli("arenas", "validate", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    n = len(load_arena_file(path).tasks)
    assert f"{n} loaded, {n} validated in the sandbox, 0 problem(s)" in out.stdout


def test_validate_reports_broken_records(tmp_path: Path) -> None:
    recs = [json.loads(line) for line in HELDOUT.read_text().splitlines()[:3]]
    tools = json.loads(recs[0]["tool_dict"])
    gold_tool = next(iter(json.loads(recs[0]["sub_qa_dict"])))
    tools[gold_tool] = f"import random\ndef {gold_tool}(**kw):\n    return random.random()\n"
    recs[0]["tool_dict"] = json.dumps(tools)  # can never match its gold answer
    recs[1]["tool_schema"] = "[{broken"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    out = cli("arenas", "validate", str(bad))
    assert out.returncode == 1
    assert f"reference chain misses {gold_tool}" in out.stderr
    assert "record 1, tool_schema: invalid JSON" in out.stderr


def test_replay_scores_reward_1_on_every_heldout_task(
    replay: ScriptedServer, tmp_path: Path
) -> None:
    out = cli(
        "arenas",
        "--data",
        str(HELDOUT),
        "--base-url",
        replay.base_url,
        "--out",
        str(tmp_path / "run"),
        "--concurrency",
        "4",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    n = len(load_arena_file(HELDOUT).tasks)
    assert summary["tasks"] == n and summary["fully_solved"] == 1.0
    assert summary["mean_reward"] == pytest.approx(1.0, abs=1e-4)
    assert summary["errors"] == {}
    records = [json.loads(x) for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in records) == list(range(n))
    ids = {t.task_id for t in load_arena_file(HELDOUT).tasks}
    assert {r["id"] for r in records} == ids and len(ids) == n  # id: the task_id
    assert all(r["reward"] == pytest.approx(1.0, abs=1e-4) for r in records)
    assert "mean_reward" in out.stdout
    assert f"{n}/{n}" in out.stderr  # the bar knew its total without --limit


async def test_resume_after_kill_and_config_mismatch(
    replay: ScriptedServer, tmp_path: Path
) -> None:
    out_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eval",
            "arenas",
            "--data",
            str(TRAIN),
            "--base-url",
            replay.base_url,
            "--out",
            str(out_dir),
            "--concurrency",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    results = out_dir / "results.jsonl"
    partial = kill_after_records(proc, results, 3, timeout_s=120)
    with results.open("a") as f:
        f.write('{"index": 99, "torn')  # what a kill in mid-write could leave
    n = len(load_arena_file(TRAIN).tasks)
    assert 3 <= partial < n
    cfg = ArenaEvalConfig(
        data=TRAIN, out=out_dir, concurrency=4, resume=True, model={"base_url": replay.base_url}
    )
    summary = await evaluate_arenas(cfg)
    lines = [
        json.loads(x)
        for x in results.read_text().splitlines()
        if x.strip().endswith("}") and '"torn' not in x
    ]
    assert sorted(r["index"] for r in lines) == list(range(n))  # none lost, none duplicated
    assert summary.tasks == n and summary.fully_solved == 1.0
    with pytest.raises(ConfigError, match="already holds results"):
        await evaluate_arenas(cfg.model_copy(update={"resume": False}))
    changed = cfg.model_copy(update={"model": cfg.model.model_copy(update={"temperature": 0.1})})
    with pytest.raises(ConfigError, match=r"different configuration.*temperature"):
        await evaluate_arenas(changed)


def test_bad_input_fails_before_running(tmp_path: Path) -> None:
    out = cli(
        "arenas",
        "--data",
        str(HELDOUT),
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--out",
        str(tmp_path / "r"),
        env={"ASTRA_EVAL_MODEL__MAX_RETRIES": "0"},
    )
    assert out.returncode == 1 and "cannot connect" in out.stderr
    assert not (tmp_path / "r" / "results.jsonl").exists()
    out = cli("arenas", "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "r"))
    assert out.returncode == 2 and "not found" in out.stderr


def test_one_task_through_real_vllm(vllm_server: ModelServer, tmp_path: Path) -> None:
    """The tiny model calls a tool that is not in the arena: the pipeline is real, the score 0."""
    out = cli(
        "arenas",
        "--data",
        str(HELDOUT),
        "--base-url",
        vllm_server.base_url,
        "--out",
        str(tmp_path / "run"),
        "--limit",
        "1",
        "--max-steps",
        "3",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (rec,) = [json.loads(x) for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert rec["trajectory"]["model"] == "astra-tiny"
    assert rec["errors"].get("unknown_tool", 0) >= 1  # get_current_time is not an arena tool
    assert rec["reward"] == 0.0
