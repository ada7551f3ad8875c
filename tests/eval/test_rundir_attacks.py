"""What a run directory may hold that the readers (eval/rundir.py: `astra-eval report`,
`astra-eval compare`) must survive: a FIFO or /dev/zero (also behind a symlink) or a directory in
a file's place, a symlink loop, a file over the size bound, records and summaries of the wrong
shape or types, JSON nested too deeply. Each is left out with a problem that names the file (and
the line), the run is partial, a run with nothing usable is skipped (exit 2 when none is). The
CLIs run in a process of their own with a timeout: a reader that blocks fails the test rather
than hanging it; in-process reads run under an alarm for the same reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from astra_agent.errors import ConfigError
from eval.page import render_report
from eval.results import CONFIG, RESULTS, SUMMARY, write_json_atomic
from eval.rundir import detect_kind, load_run
from eval.runfiles import JSONL_LIMIT, UnreadableFile, read_bounded
from tests.conftest import run_module
from tests.eval.test_report import entry_views
from tests.eval.test_rundir import arena_record, arena_run, bfcl_record, bfcl_run, training_run

# Far above any read here, so that a slow machine (the CLI tests run subprocesses under it,
# each bounded by its own timeout) is not taken for a hang; a blocked read waits forever.
ALARM_S = 300


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A read that blocks (a FIFO opened without O_NONBLOCK) raises instead of hanging."""

    def boom(*_: Any) -> None:
        raise TimeoutError(f"a reader blocked for {ALARM_S} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(ALARM_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_module("eval", *args, timeout=timeout, env={"COLUMNS": "250"})


def text(run: Any) -> str:
    return "\n".join(run.problems)


# ------------------------------------------------------------------ files that are not files


def fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def dev_zero(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def loop(path: Path) -> None:
    path.unlink(missing_ok=True)
    other = path.with_name(path.name + ".other")
    path.symlink_to(other.name)
    other.symlink_to(path.name)


def directory(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


def huge(path: Path) -> None:
    """A sparse file over the bound (no disk used, nothing to read if it is refused)."""
    with path.open("ab") as f:
        f.truncate(JSONL_LIMIT + 1)


Plant = tuple[Callable[[Path], None], str]  # what puts it at a path, what the problem says
PLANTS: dict[str, Plant] = {
    "fifo": (fifo, "not a regular file (a FIFO)"),
    "dev_zero": (dev_zero, "not a regular file (a character device)"),
    "loop": (loop, "a symlink loop"),
    "directory": (directory, "not a regular file (a directory)"),
    "huge": (huge, "bytes, over the limit of"),
}


@pytest.fixture(params=sorted(PLANTS))
def plant(request: pytest.FixtureRequest) -> Plant:
    """One of ``PLANTS``: a test that takes it runs once for each."""
    return PLANTS[request.param]


def test_results_that_are_not_a_readable_file(tmp_path: Path, plant: Plant) -> None:
    make, why = plant
    run_dir = bfcl_run(tmp_path / "b")
    make(run_dir / RESULTS)
    run = load_run(run_dir)
    assert run.kind == "bfcl" and run.records == [] and run.partial
    assert "results.jsonl cannot be read (" in text(run) and why in text(run)
    assert run.summary is not None and run.summary["accuracy"] == {"base": 50.0}
    assert run.usable  # the summary still says what the run scored


def test_a_summary_that_is_not_a_readable_file(tmp_path: Path, plant: Plant) -> None:
    make, why = plant
    run_dir = arena_run(tmp_path / "a")
    make(run_dir / SUMMARY)
    run = load_run(run_dir)
    assert "summary.json cannot be read (" in text(run) and why in text(run) and run.partial
    assert run.summary is not None and run.summary["mean_reward"] == 0.5  # from the records


def test_training_files_that_are_not_readable_files(tmp_path: Path, plant: Plant) -> None:
    make, why = plant
    sft = training_run(tmp_path / "sft", "sft")
    make(sft / "astra-sft.json")
    rl = training_run(tmp_path / "rl", "rl")
    make(rl / "metrics.jsonl")
    a, b = load_run(sft), load_run(rl)
    assert a.kind == "sft" and len(a.metrics) == 3 and a.config is None
    assert "astra-sft.json cannot be read (" in text(a) and why in text(a) and a.partial
    assert b.kind == "rl" and b.metrics == [] and not b.usable
    assert "metrics.jsonl cannot be read (" in text(b) and why in text(b)


def test_a_directory_of_such_files_only_is_not_a_run(tmp_path: Path) -> None:
    d = tmp_path / "x"
    d.mkdir()
    fifo(d / RESULTS)
    dev_zero(d / SUMMARY)
    loop(d / CONFIG)
    directory(d / "metrics.jsonl")
    with pytest.raises(ConfigError, match="not a run directory"):
        detect_kind(d)


def test_a_run_directory_that_is_a_loop_fifo_or_device(tmp_path: Path) -> None:
    loop(tmp_path / "looped")
    fifo(tmp_path / "pipe")
    dev_zero(tmp_path / "zero")
    for name, what in (
        ("looped", "a symlink loop"),
        ("pipe", "a FIFO"),
        ("zero", "a character device"),
    ):
        with pytest.raises(ConfigError, match=what) as err:
            load_run(tmp_path / name)
        assert err.value.exit_code == 2


def test_the_bound_is_checked_before_reading(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)
    assert read_bounded(f, 100) == b"x" * 100
    with pytest.raises(UnreadableFile, match="100 bytes, over the limit of 99"):
        read_bounded(f, 99)
    assert read_bounded(tmp_path / "missing", 10) is None
    (tmp_path / "dangling").symlink_to("nowhere")
    assert read_bounded(tmp_path / "dangling", 10) is None  # as good as missing


# ------------------------------------------------------------------ records of the wrong types


def _bfcl_line(**changes: Any) -> dict[str, Any]:
    return {**json.loads(bfcl_record(20).model_dump_json()), **changes}


BAD_BFCL: dict[str, tuple[Any, str]] = {
    "trajectory_string": (_bfcl_line(trajectory="not a trajectory"), "trajectory: Input should"),
    "valid_string": (_bfcl_line(valid="yes"), "valid: Input should be a valid boolean"),
    "id_number": (_bfcl_line(id=7), "id: Input should be a valid string"),
    "messages_dict": (_bfcl_line(trajectory={"messages": {"role": "user"}}), "messages"),
    "usage_string_number": (
        _bfcl_line(trajectory={"usage": {"prompt_tokens": "12"}}),
        "prompt_tokens: Input should be a valid integer",
    ),
    "events_null": (_bfcl_line(trajectory={"events": [None]}), "events.0"),
    "decoded_ints": (_bfcl_line(decoded=[[[1, 2]]]), "decoded.0.0.0"),
    "failed_turn_float": (_bfcl_line(failed_turn=1.5), "failed_turn"),
    "category_missing": ({"id": "x", "valid": True}, "lacks the bfcl record fields (category)"),
    "not_an_object": ([1, 2, 3], "is not a JSON object"),
    "deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
}


def write_lines(path: Path, lines: list[Any]) -> None:
    with path.open("a") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")


def test_bfcl_records_of_the_wrong_types_are_skipped_by_line(tmp_path: Path) -> None:
    run_dir = bfcl_run(tmp_path / "b", summary=False)  # lines 1-4 are good
    write_lines(run_dir / RESULTS, [line for line, _ in BAD_BFCL.values()])
    run = load_run(run_dir)
    assert [r["id"] for r in run.records] == [f"multi_turn_base_{i}" for i in range(4)]
    assert run.partial and run.summary is not None and run.summary["entries"] == 4
    problems = text(run)
    for n, (_, why) in enumerate(BAD_BFCL.values(), 5):
        line = next(p for p in problems.splitlines() if f"(line {n})" in p)
        assert line.startswith("results.jsonl: line ") and why in line, (n, why, line)
    html = render_report([run])  # and the page is built from what is left
    assert "multi_turn_base_3" in html and "nested too deeply" in html


def test_arena_and_general_records_of_the_wrong_types(tmp_path: Path) -> None:
    run_dir = arena_run(tmp_path / "a", summary=False)
    good = json.loads(arena_record(9).model_dump_json())
    write_lines(
        run_dir / RESULTS,
        [
            {**good, "id": "r", "reward": "0.5"},  # a number as a string
            {**good, "id": "s", "solved": 5},
            {**good, "id": "t", "fully_solved": 1},
            {**good, "id": "u", "reward": None},
            {**good, "id": "v", "termination": "exploded"},
            {**good, "id": "w", "errors": {"x": "many"}},
            {**good, "id": "extra", "newer_field": {"any": "thing"}},  # unknown: ignored
        ],
    )
    run = load_run(run_dir)
    assert [r["id"] for r in run.records] == ["task-0", "task-1", "task-2", "extra"]
    skipped = [p for p in run.problems if p.endswith("skipped")]
    assert len(skipped) == 5
    one_fault = "is not an arenas record (reward: Input should be a valid number) (line 4, 7)"
    assert f"results.jsonl: 2 lines {one_fault}" in text(run)  # named together
    general = tmp_path / "g"
    general.mkdir()
    sample = {
        "id": "t/0",
        "task": "t",
        "index": 0,
        "prompt": "p",
        "response": "r",
        "answer": "a",
        "extracted": "a",
        "target": "a",
        "exact_match": 1.0,
    }
    write_lines(
        general / RESULTS,
        [
            sample,
            {**sample, "id": "t/1", "index": "1"},
            {**sample, "id": "t/2", "response": ["r"]},
            {**sample, "id": "t/3", "exact_match": "high"},  # a metric: any value, not charted
        ],
    )
    g = load_run(general)
    assert [r["id"] for r in g.records] == ["t/0", "t/3"]
    assert "index: Input should be a valid integer" in text(g)
    assert g.summary is not None and g.summary["tasks"] == {"t": {"exact_match": 1.0}}
    render_report([run, g])


def test_many_faults_are_counted_not_listed(tmp_path: Path) -> None:
    """30 lines, each with a fault of its own (a key of its own, one 10,000 characters
    long): twenty are named, cut short, the rest counted."""
    run_dir = arena_run(tmp_path / "a")
    good = json.loads(arena_record(9).model_dump_json())
    keys = ["k" * 10_000, *(f"kind-{i}" for i in range(29))]
    write_lines(run_dir / RESULTS, [{**good, "errors": {k: "many"}} for k in keys])
    run = load_run(run_dir)
    skipped = [p for p in run.problems if "skipped" in p]
    assert len(skipped) == 21 and len(run.records) == 3
    assert skipped[-1] == "results.jsonl: 10 more line(s) skipped for 10 other reasons"
    assert max(map(len, run.problems)) < 400


def test_untyped_parts_of_a_record_of_any_shape(tmp_path: Path) -> None:
    """Message fields and tool schemas are not typed by the record classes: whatever they
    hold, the drill-down is built."""
    rec = json.loads(bfcl_record(0).model_dump_json())
    rec["trajectory"]["messages"] = [
        {"role": ["user"], "content": {"a": 1}},
        {"role": "assistant", "tool_calls": 5, "reasoning": 7},
        {"role": "assistant", "tool_calls": [{"function": "f"}, 3, {"function": {"name": 1}}]},
        {"role": "tool", "tool_call_id": {"x": 1}, "content": None},
    ]
    rec["trajectory"]["tools"] = [{"function": "not a schema"}, {"name": "bare"}, {}]
    run_dir = bfcl_run(tmp_path / "b")
    write_lines(run_dir / RESULTS, [{**rec, "id": "multi_turn_base_0"}])
    run = load_run(run_dir)
    assert not any("skipped" in p for p in run.problems)
    (views,) = entry_views(render_report([run]))
    facts = dict(map(tuple, views[0]["facts"]))
    assert facts["tools offered"] == "?, bare, "
    assert [m["role"] for t in views[0]["turns"] for m in t] == [
        "['user']",
        "assistant",
        "assistant",
        "tool",
    ]


# ------------------------------------------------------------------ summaries of the wrong types


BAD_SUMMARIES: dict[str, tuple[Any, str]] = {
    "list": ([{"accuracy": {"base": 50.0}}], "is JSON list, not an object"),
    "string_number": ({"accuracy": {"base": "50.0"}}, "(accuracy.base: Input should be a valid"),
    "null_dict": ({"accuracy": None}, "(accuracy: Input should be a valid dictionary"),
    "dict_list": ({"errors": ["x"]}, "(errors: Input should be a valid dictionary"),
    "bool_count": ({"entries": True}, "(entries: Input should be a valid integer"),
    "model_number": ({"model": 3}, "(model: Input should be a valid string"),
    "string": ("a summary", "is JSON str, not an object"),
    "deep": (json.loads("[" * 500 + "]" * 500), "is JSON list"),
}


@pytest.mark.parametrize("case", sorted(BAD_SUMMARIES))
def test_a_summary_of_the_wrong_types_is_replaced_by_the_records(tmp_path: Path, case: str) -> None:
    data, why = BAD_SUMMARIES[case]
    run_dir = bfcl_run(tmp_path / "b")
    summary = json.loads((run_dir / SUMMARY).read_text())
    write_json_atomic(run_dir / SUMMARY, {**summary, **data} if isinstance(data, dict) else data)
    run = load_run(run_dir)
    what = "summary.json is not a bfcl summary " if why.startswith("(") else "summary.json "
    assert what + why in text(run) and run.partial
    assert run.summary is not None and run.summary["accuracy"] == {"base": 50.0}
    assert "not finish" not in text(run)  # it is there, it is wrong
    render_report([run])


def test_nulls_where_a_figure_may_be_missing_are_kept(tmp_path: Path) -> None:
    run_dir = arena_run(tmp_path / "a")
    summary = json.loads((run_dir / SUMMARY).read_text())
    summary |= {"mean_recall": None, "domains": {"banking": {"tasks": 3, "mean_reward": None}}}
    write_json_atomic(run_dir / SUMMARY, summary)
    run = load_run(run_dir)
    assert not run.partial and run.summary is not None and run.summary["mean_recall"] is None
    assert 'data-metric="mean_recall" data-run="a">–<' in render_report([run])


def test_general_and_arena_summaries_of_the_wrong_types(tmp_path: Path) -> None:
    g = tmp_path / "g"
    g.mkdir()
    write_json_atomic(g / SUMMARY, {"kind": "general", "tasks": {"t": 5}, "samples": 1})
    write_json_atomic(g / CONFIG, {"fingerprint": "not a dict"})
    run = load_run(g)
    assert "summary.json is not a general summary (tasks.t: Input should be" in text(run)
    assert not run.usable  # no records to compute the figures from
    a = arena_run(tmp_path / "a")
    summary = json.loads((a / SUMMARY).read_text())
    write_json_atomic(a / SUMMARY, {**summary, "domains": {"banking": [1]}})
    assert "domains.banking: Input should be" in text(load_run(a))


def test_metrics_lines_without_a_finite_step_are_skipped(tmp_path: Path) -> None:
    run_dir = training_run(tmp_path / "sft", "sft", steps=2)
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": NaN, "loss": 1}\n{"step": "3", "loss": 1}\n{"loss": 1}\n')
        f.write('{"step": Infinity}\n{"step": true}\n{"step": 3, "loss": "low"}\n')
    run = load_run(run_dir)
    assert [m["step"] for m in run.metrics] == [1, 2, 3]
    assert run.summary is not None and run.summary["last_step"] == 3
    problems = text(run)
    assert "line has no step number (line 5)" in problems
    assert "(line 3, 6)" in problems and "(line 4, 7)" in problems
    render_report([run])


# ------------------------------------------------------------------ the CLIs, in a process


def planted(root: Path) -> list[Path]:
    """Runs with each kind of trap, and one good run."""
    dirs = []
    for name, (make, _) in sorted(PLANTS.items()):
        d = bfcl_run(root / f"bfcl-{name}")
        make(d / RESULTS)
        make(d / SUMMARY)  # nothing usable left: skipped
        dirs.append(d)
        a = arena_run(root / f"arenas-{name}", summary=False)
        make(a / CONFIG)  # detected by its records; its fingerprint unreadable
        dirs.append(a)
    bad = bfcl_run(root / "bfcl-bad-lines")
    write_lines(bad / RESULTS, [line for line, _ in BAD_BFCL.values()])
    write_json_atomic(bad / SUMMARY, {"accuracy": [], "entries": "4"})
    dirs.append(bad)
    loop(root / "looped-run")
    dirs.append(root / "looped-run")
    return dirs


def test_report_over_traps_does_not_hang_and_names_each(tmp_path: Path) -> None:
    dirs = planted(tmp_path)
    out = tmp_path / "report.html"
    proc = cli("report", *map(str, dirs), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and out.is_file()
    err = proc.stderr.replace("\n", " ")
    for _, why in PLANTS.values():
        assert why in err
    for name in PLANTS:
        assert f"skipped: bfcl-{name} (bfcl): nothing usable" in err
        assert f"loaded arenas-{name} (arenas): 3 records (partial)" in proc.stdout
    assert "loaded bfcl-bad-lines (bfcl): 4 records (partial)" in proc.stdout
    assert "trajectory: Input should be" in err and "(line 5)" in err
    assert "summary.json is not a bfcl summary" in err
    assert "looped-run is a symlink loop" in err


def test_report_with_nothing_usable_exits_2(tmp_path: Path) -> None:
    d = bfcl_run(tmp_path / "b")
    fifo(d / RESULTS)
    write_json_atomic(d / SUMMARY, ["not", "a", "summary"])
    out = tmp_path / "report.html"
    proc = cli("report", str(d), "--out", str(out))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "nothing to report" in proc.stderr and "holds nothing usable" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_compare_reads_through_the_same_readers(tmp_path: Path) -> None:
    a, b = bfcl_run(tmp_path / "a"), bfcl_run(tmp_path / "b")
    write_lines(b / RESULTS, [_bfcl_line(id="multi_turn_base_9", valid="yes")])
    proc = cli("compare", str(a), str(b))
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = proc.stderr.replace("\n", " ")
    assert "results.jsonl: line valid" not in err  # the words are the report's
    assert "line is not a bfcl record (valid: Input should be a valid boolean) (line 5)" in err
    fifo(b / RESULTS)
    proc = cli("compare", str(a), str(b))
    assert proc.returncode == 2 and "holds no bfcl records" in proc.stderr
    assert "Traceback" not in proc.stderr
