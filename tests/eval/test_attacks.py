"""Attacks a new user would make on `astra-eval` that the other tests do not: ids outside the
selected categories, parity on a run of inference errors, BFCL v3 and v4 result files side by
side, a file as --out, the sub-commands' help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astra_agent.errors import ConfigError
from eval.bfcl import load_category
from eval.bfcl.backend import method_table, new_instances
from eval.bfcl.checker import check_entry
from eval.bfcl.replay import json_calls
from eval.bfcl.runner import BFCLConfig, BFCLRecord, select
from eval.bfcl.score import score_official_results
from eval.cli import app
from eval.results import CONFIG, RESULTS, ensure_writable_dir

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(
    ("overrides", "left_out"),
    [
        ({"categories": ["base"], "ids": ["multi_turn_miss_func_0"]}, "multi_turn_miss_func_0"),
        ({"categories": ["base"], "limit": 2, "ids": ["multi_turn_base_7"]}, "multi_turn_base_7"),
    ],
)
def test_ids_that_the_selection_leaves_out_are_an_error(
    tmp_path: Path, overrides: dict[str, object], left_out: str
) -> None:
    cfg = BFCLConfig(out=tmp_path, **overrides)
    with pytest.raises(ConfigError, match=f"not in the selected entries: {left_out}"):
        select(cfg)


def test_duplicate_ids_select_an_entry_once(tmp_path: Path) -> None:
    cfg = BFCLConfig(out=tmp_path, ids=["multi_turn_base_0", "multi_turn_base_0"])
    assert [e.id for e in select(cfg)] == ["multi_turn_base_0"]


def _replayed(index: int) -> BFCLRecord:
    """A record of base entry ``index`` answered with its ground truth (a passing entry)."""
    entry = load_category("base")[index]
    table = method_table(new_instances(entry))
    responses = [[[{n: a} for n, a in json_calls(gt, table)], "Done."] for gt in entry.ground_truth]
    decoded = [[list(gt)] if gt else [] for gt in entry.ground_truth]
    assert check_entry(entry, decoded).valid
    return BFCLRecord(id=entry.id, category="base", valid=True, responses=responses,
                      decoded=decoded)  # fmt: skip


def _inference_error(index: int) -> BFCLRecord:
    return BFCLRecord(
        id=f"multi_turn_base_{index}", category="base", valid=False,
        error_type="multi_turn:inference_error", error="inference error: HTTP 500",
        error_kind="inference", endpoint_failure="status",
    )  # fmt: skip


def _run_dir(tmp_path: Path, records: list[BFCLRecord]) -> Path:
    (tmp_path / RESULTS).write_text("".join(r.model_dump_json() + "\n" for r in records))
    (tmp_path / CONFIG).write_text(json.dumps({"format": 2, "fingerprint": {}}))
    return tmp_path


def _eval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eval", *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={"COLUMNS": "250"},
    )  # fmt: skip


@pytest.mark.integration
def test_parity_does_not_count_inference_errors_as_agreeing(tmp_path: Path) -> None:
    out = _run_dir(tmp_path, [_replayed(0), _inference_error(1), _inference_error(2)])
    run = _eval("bfcl", "parity", "--out", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 entries re-scored with the official checker: 1 agree, 0 differ" in run.stdout
    assert "2 of 3 entries not compared: recorded as inference errors" in run.stdout


@pytest.mark.integration
def test_parity_that_compares_nothing_fails(tmp_path: Path) -> None:
    out = _run_dir(tmp_path, [_inference_error(0), _inference_error(1)])
    run = _eval("bfcl", "parity", "--out", str(out))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "0 entries re-scored" in run.stdout and "all are inference errors" in run.stderr


def test_score_reads_v4_beside_v3_as_the_official_evaluator(tmp_path: Path) -> None:
    folder = tmp_path / "result" / "my-model" / "multi_turn"
    folder.mkdir(parents=True)
    good = _replayed(0)
    line = {"id": good.id, "result": good.responses}
    (folder / "BFCL_v4_multi_turn_base_result.json").write_text(json.dumps(line) + "\n")
    stale = {"id": good.id, "result": [[] for _ in good.responses]}  # fails: empty turns
    (folder / "BFCL_v3_multi_turn_base_result.json").write_text(json.dumps(stale) + "\n")
    summary = score_official_results(tmp_path / "result", tmp_path / "score")
    assert summary["models"]["my-model"]["accuracy"] == {"base": 1.0}


def test_an_out_that_is_a_file_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "runs"
    path.write_text("x")
    with pytest.raises(ConfigError, match="it is a file, not a directory"):
        ensure_writable_dir(path)


@pytest.mark.parametrize("group", ["bfcl", "arenas"])
def test_the_groups_help_shows_an_example(group: str) -> None:
    result = CliRunner().invoke(app, [group, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and f"Example: astra-eval {group} --" in result.output
