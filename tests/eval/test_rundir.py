"""Run directories (eval/rundir.py): which kind a directory holds and what it holds, written by
the real writers (record classes, append_jsonl, write_json_atomic, MetricsLog); bad input,
half-written runs, torn lines and bytes that are not UTF-8 — read without changing anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from astra_agent.errors import ConfigError
from astra_agent.trajectory import Trajectory, append_jsonl
from eval.arenas.runner import ArenaRecord
from eval.arenas.runner import summarize as summarize_arenas
from eval.bfcl.runner import PUBLISHED, BFCLRecord
from eval.bfcl.runner import summarize as summarize_bfcl
from eval.results import CONFIG, RESULTS, SUMMARY, RunMeta, write_json_atomic
from eval.rundir import detect_kind, load_run, load_runs, unique_names
from training.metrics import ABFStats, Heldout, MetricsLog, RLStep, Rollouts, SFTStep, Update


def bfcl_record(i: int, category: str = "base", valid: bool = True) -> BFCLRecord:
    traj = Trajectory(messages=[{"role": "user", "content": f"question {i}"}])
    return BFCLRecord(
        id=f"multi_turn_{category}_{i}",
        category=category,
        valid=valid,
        error_type=None if valid else "multi_turn:instance_state_mismatch",
        failed_turn=None if valid else 0,
        trajectory=traj,
    )


def arena_record(i: int, reward: float = 1.0) -> ArenaRecord:
    return ArenaRecord(
        id=f"task-{i}",
        index=i,
        task_id=f"task-{i}",
        domain="banking",
        reward=reward,
        recall=reward,
        precision=1.0,
        solved=["a"] if reward else [],
        required=1,
        tool_calls=2,
        fully_solved=reward == 1.0,
        termination="stop",
    )


def write_eval(out: Path, records: list[Any], fingerprint: dict[str, Any], summary: bool) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    meta = RunMeta(fingerprint={"model": "m", **fingerprint}, base_url="http://x/v1")
    write_json_atomic(out / CONFIG, meta.model_dump(mode="json"))
    for r in records:
        append_jsonl(out / RESULTS, r, fsync=False)
    if summary:
        if isinstance(records[0], BFCLRecord):
            data = {**summarize_bfcl(records).written(), "published": PUBLISHED}
        else:
            data = summarize_arenas(records).written()
        data |= {"total": len(records), "complete": True, "wall_s": 1.0, "model": "m"}
        write_json_atomic(out / SUMMARY, data)
    return out


def bfcl_run(out: Path, n: int = 4, summary: bool = True) -> Path:
    recs = [bfcl_record(i, valid=i % 2 == 0) for i in range(n)]
    return write_eval(out, recs, {"categories": ["base"], "ids": None, "limit": n}, summary)


def arena_run(out: Path, summary: bool = True) -> Path:
    recs = [arena_record(0), arena_record(1, 0.5), arena_record(2, 0.0)]
    return write_eval(out, recs, {"data_sha256": "0" * 64, "limits": {}}, summary)


def training_run(out: Path, kind: str, steps: int = 3, final: bool = True) -> Path:
    out.mkdir(parents=True)
    name = {"sft": "astra-sft.json", "rl": "astra-rl.json"}[kind]
    planned = {"sft": {"max_steps": 10}, "rl": {"steps": 10}}[kind]
    (out / name).write_text(json.dumps({"fingerprint": planned, "digest": "x"}))
    log: MetricsLog[Any] = MetricsLog(out / "metrics.jsonl")
    for s in range(1, steps + 1):
        if kind == "sft":
            log.append(sft_step(s, loss=3.0 / s, learning_rate=1e-3, tokens=100))
        else:
            log.append(rl_step(s, reward_mean=0.1 * s, update={"loss": 0.1}, abf={"valid": 4}))
    if final:
        (out / "final").mkdir()
    return out


def sft_step(step: int, **fields: Any) -> SFTStep:
    """An SFT step record of ``fields``, the others 0 (or not logged)."""
    zero = {
        "loss": 0.0, "learning_rate": None, "grad_norm": None, "tokens": 0, "padding_tokens": 0,
        "trained_tokens": 0, "tokens_per_s": 0.0, "trained_tokens_per_s": 0.0, "epoch": None,
        "elapsed_s": 0.0,
    }  # fmt: skip
    return SFTStep(step=step, **(zero | fields))


def rl_step(
    step: int,
    heldout: dict[str, Any] | None = None,
    abf: dict[str, Any] | None = None,
    update: dict[str, Any] | None = None,
    **rollouts: Any,
) -> RLStep:
    """An RL step record: ``heldout`` (none by default), ``rollouts`` and ``abf`` (the others
    0), ``update`` (the others None)."""
    zero_abf = dict.fromkeys(ABFStats.model_fields, 0) | {"step": step}
    zero = {k: 0 for k, f in Rollouts.model_fields.items() if f.is_required()}
    return RLStep(
        step=step,
        heldout=Heldout(**heldout) if heldout else None,
        rollouts=Rollouts(**(zero | rollouts | {"abf": ABFStats(**(zero_abf | (abf or {})))})),
        update=Update(**(dict.fromkeys(Update.model_fields) | (update or {}))),
    )


# ------------------------------------------------------------------ detection


def test_detects_every_kind(tmp_path: Path) -> None:
    general = tmp_path / "general"
    general.mkdir()
    write_json_atomic(general / SUMMARY, {"kind": "general", "model": "m", "tasks": {}})
    assert detect_kind(bfcl_run(tmp_path / "b")) == "bfcl"
    assert detect_kind(arena_run(tmp_path / "a")) == "arenas"
    assert detect_kind(general) == "general"
    assert detect_kind(training_run(tmp_path / "s", "sft")) == "sft"
    assert detect_kind(training_run(tmp_path / "r", "rl")) == "rl"


def test_detects_half_written_runs_by_what_is_there(tmp_path: Path) -> None:
    # No summary yet: by config.json's fingerprint.
    assert detect_kind(bfcl_run(tmp_path / "b", summary=False)) == "bfcl"
    assert detect_kind(arena_run(tmp_path / "a", summary=False)) == "arenas"
    # Only results (config.json lost): by the first record's fields.
    only = tmp_path / "only"
    only.mkdir()
    append_jsonl(only / RESULTS, arena_record(0), fsync=False)
    assert detect_kind(only) == "arenas"
    # metrics.jsonl without its run file: by the step's fields.
    for kind in ("sft", "rl"):
        run = training_run(tmp_path / f"t-{kind}", kind)
        (run / {"sft": "astra-sft.json", "rl": "astra-rl.json"}[kind]).unlink()
        assert detect_kind(run) == kind


@pytest.mark.parametrize("case", ["missing", "file", "empty", "foreign", "garbage"])
def test_a_directory_that_is_not_ours_is_a_config_error_naming_it(
    case: str, tmp_path: Path
) -> None:
    path = tmp_path / "x"
    if case == "file":
        path.write_text("{}")
    elif case == "empty":
        path.mkdir()
    elif case == "foreign":
        path.mkdir()
        (path / "results.jsonl").write_text('{"name": "not ours"}\n')
        (path / "summary.json").write_text('{"score": 1}')
    elif case == "garbage":
        path.mkdir()
        (path / "summary.json").write_bytes(b"\xff\xfe\x00garbage")
        (path / "results.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ConfigError) as err:
        load_run(path)
    assert str(path) in err.value.message and err.value.exit_code == 2
    assert err.value.hint and "astra-eval" in err.value.hint
    expected = {"missing": "not found", "file": "is a file"}.get(case, "not a run directory")
    assert expected in err.value.message


# ------------------------------------------------------------------ loading


def test_loads_a_complete_bfcl_run_as_plain_json(tmp_path: Path) -> None:
    run = load_run(bfcl_run(tmp_path / "b"))
    assert (run.kind, run.name, run.model, run.partial, run.problems) == (
        "bfcl",
        "b",
        "m",
        False,
        [],
    )
    assert [r["id"] for r in run.records] == [f"multi_turn_base_{i}" for i in range(4)]
    assert run.records[0]["trajectory"]["messages"][0]["content"] == "question 0"
    assert run.summary is not None and run.summary["accuracy"] == {"base": 50.0}


def test_without_summary_figures_come_from_the_records_and_the_run_is_partial(
    tmp_path: Path,
) -> None:
    run = load_run(bfcl_run(tmp_path / "b", summary=False))
    recs = [bfcl_record(i, valid=i % 2 == 0) for i in range(4)]
    assert run.partial and any("no summary.json" in p for p in run.problems)
    assert run.summary is not None
    assert run.summary["accuracy"] == summarize_bfcl(recs).accuracy == {"base": 50.0}
    assert run.summary["published"] == PUBLISHED and run.summary["model"] == "m"
    arenas = load_run(arena_run(tmp_path / "a", summary=False))
    assert arenas.partial and arenas.summary is not None
    assert arenas.summary["mean_reward"] == 0.5 and arenas.summary["tasks"] == 3


def test_a_torn_last_line_is_left_out_and_the_file_is_not_changed(tmp_path: Path) -> None:
    out = bfcl_run(tmp_path / "b", summary=False)
    with (out / RESULTS).open("a") as f:
        f.write(bfcl_record(9).model_dump_json()[:100])  # killed mid-write
    before = (out / RESULTS).read_bytes()
    run = load_run(out)
    assert len(run.records) == 4 and run.partial
    assert any("last line is cut off" in p for p in run.problems)
    assert (out / RESULTS).read_bytes() == before  # a reader never truncates a live run


def test_lines_that_are_not_utf8_or_not_json_are_skipped_with_their_numbers(
    tmp_path: Path,
) -> None:
    out = arena_run(tmp_path / "a")
    lines = (out / RESULTS).read_bytes().splitlines(keepends=True)
    lines.insert(1, b"\xff\xfe not text \xc3\x28\n")
    lines.insert(3, b"{not json\n")
    (out / RESULTS).write_bytes(b"".join(lines))
    (out / SUMMARY).write_bytes(b"\xff\xfe\xfd")
    run = load_run(out)
    assert [r["id"] for r in run.records] == ["task-0", "task-1", "task-2"]
    text = "\n".join(run.problems)
    assert "line 2" in text and "not UTF-8" in text and "line 4" in text and "not JSON" in text
    assert "summary.json is not UTF-8 text: figures computed from the records" in text
    assert run.partial
    assert run.summary is not None and run.summary["mean_reward"] == 0.5  # from the records


def test_the_later_record_of_an_id_wins_and_a_stale_summary_is_recomputed(
    tmp_path: Path,
) -> None:
    out = bfcl_run(tmp_path / "b")  # 4 entries, summary says 50 %
    append_jsonl(out / RESULTS, bfcl_record(1, valid=True), fsync=False)  # a retry fixed it
    append_jsonl(out / RESULTS, bfcl_record(7, valid=True), fsync=False)  # resumed: one more
    run = load_run(out)
    assert len(run.records) == 5 and next(r for r in run.records if r["id"].endswith("_1"))["valid"]
    assert run.summary is not None and run.summary["accuracy"] == {"base": 80.0}
    assert run.summary["model"] == "m" and run.partial
    assert any("summary.json covers 4 entries" in p for p in run.problems)


def test_records_of_another_shape_are_named_not_loaded(tmp_path: Path) -> None:
    out = bfcl_run(tmp_path / "b", summary=False)
    append_jsonl(out / RESULTS, {"id": "x", "reward": 1}, fsync=False)
    run = load_run(out)
    assert len(run.records) == 4
    assert any("lacks the bfcl record fields" in p for p in run.problems)


def test_training_runs_metrics_and_an_unfinished_run(tmp_path: Path) -> None:
    done = load_run(training_run(tmp_path / "sft", "sft"))
    assert done.kind == "sft" and not done.partial and len(done.metrics) == 3
    assert done.metrics[0]["tokens_total"] == 100  # the writer's running sums, as written
    rl = training_run(tmp_path / "rl", "rl", steps=2, final=False)
    with (rl / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "rew')
    run = load_run(rl)
    assert run.kind == "rl" and run.partial and len(run.metrics) == 2
    assert run.summary == {"last_step": 2, "planned_steps": 10, "finished": False, "verl": False}
    assert any("last logged step 2 of 10" in p for p in run.problems)
    assert any("cut off" in p for p in run.problems)


def test_verl_file_logger_metrics_are_flattened(tmp_path: Path) -> None:
    out = tmp_path / "verl-sft"
    (out / "verl").mkdir(parents=True)
    (out / "astra-sft.json").write_text('{"fingerprint": {"backend": "verl"}}')
    (out / "verl" / "metrics.jsonl").write_text(
        '{"step": 1, "data": {"train/loss": 2.5, "train/lr": 0.001}}\n'
    )
    run = load_run(out)
    assert run.metrics == [{"step": 1, "train/loss": 2.5, "train/lr": 0.001}]


def _verl_line(step: int, loss: float) -> str:
    return json.dumps({"step": step, "data": {"train/loss": loss}}) + "\n"


def test_verl_launches_read_in_order_a_resumed_launch_replacing_its_steps(tmp_path: Path) -> None:
    """A file per launch (``training.verl_job.launch_metrics_file``): the first launch logged
    steps 1-5 and was killed after its checkpoint at 4; the second resumed from 4, logged 5-8
    (one line of it bad) and converted its last checkpoint."""
    out = tmp_path / "verl-rl"
    (out / "verl-metrics").mkdir(parents=True)
    (out / "astra-rl.json").write_text('{"fingerprint": {"backend": "verl", "steps": 8}}')
    first = out / "verl-metrics" / "20261206T100000Z-001.jsonl"
    first.write_text("".join(_verl_line(s, 9.0) for s in range(1, 6)))
    second = out / "verl-metrics" / "20261206T100000Z-002.jsonl"  # the same second
    second.write_text("".join(_verl_line(s, 1.0) for s in range(5, 9)) + '{"step": "x"}\n')
    (out / "verl").mkdir()  # the job dir of the last launch (an older layout's file ignored)
    (out / "verl" / "metrics.jsonl").write_text(_verl_line(99, 0.0))
    run = load_run(out)
    assert run.kind == "rl" and [m["step"] for m in run.metrics] == list(range(1, 9))
    assert [m["train/loss"] for m in run.metrics] == [9.0] * 4 + [1.0] * 4
    assert run.summary == {"last_step": 8, "planned_steps": 8, "finished": False, "verl": True}
    assert any(p.startswith(f"verl-metrics/{second.name}: line") for p in run.problems)
    assert any("no final-bf16/ model" in p for p in run.problems), run.problems
    (out / "final-bf16").mkdir()
    assert load_run(out).summary["finished"] is True


def test_names_are_unique_among_several_runs(tmp_path: Path) -> None:
    a, b = bfcl_run(tmp_path / "x" / "run"), arena_run(tmp_path / "y" / "run")
    assert unique_names([a, b]) == ["x/run", "y/run"]
    assert unique_names([a, a]) == ["x/run", "x/run #2"]
    assert [r.name for r in load_runs([a, b])] == ["x/run", "y/run"]
