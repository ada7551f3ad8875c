"""The arena section's grid chart: mean reward by task set (the runs' data files) × model, with
95% confidence intervals kept within [0, 1] — how a training experiment's stages read side by
side on several held-out sets; not drawn for runs of one set and one model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eval.page import render_report
from eval.results import SUMMARY
from eval.rundir import load_run
from tests.eval.test_report import figures
from tests.eval.test_rundir import arena_record, write_eval

TITLE = "Mean reward by task set and model (95% CI)"


def _run(root: Path, name: str, model: str, data: str, rewards: list[float]) -> Any:
    out = write_eval(root / name, [arena_record(i, r) for i, r in enumerate(rewards)], {}, True)
    summary = json.loads((out / SUMMARY).read_text())
    (out / SUMMARY).write_text(json.dumps({**summary, "model": model, "data": data}))
    return load_run(out, name)


def _grid(html: str) -> dict[str, Any] | None:
    found = [f for f in figures(html)["figures"].values() if f["layout"]["title"]["text"] == TITLE]
    return found[0] if found else None


def test_stages_on_task_sets_are_drawn_with_their_intervals(tmp_path: Path) -> None:
    runs = [
        _run(tmp_path, "base-c", "base", "/x/arenas/c.jsonl", [0.0, 0.0, 0.0, 0.0]),
        _run(tmp_path, "sft-c", "sft", "/x/arenas/c.jsonl", [1.0, 0.5, 0.0, 0.5]),
        _run(tmp_path, "sft-a", "sft", "/x/arenas/a.jsonl", [1.0, 1.0]),
    ]
    fig = _grid(render_report(runs))
    assert fig is not None
    by_name = {t["name"]: t for t in fig["data"]}
    assert list(by_name) == ["base", "sft"] and by_name["sft"]["x"] == ["c", "a"]
    assert by_name["base"]["y"] == [0.0, None]  # base was not scored on a: no bar
    sft = by_name["sft"]
    assert sft["y"] == [0.5, 1.0]
    half = 1.96 * (((0.25 + 0 + 0.25 + 0) / 3) ** 0.5) / 2  # sd of [1, .5, 0, .5] over √4
    assert abs(sft["error_y"]["array"][0] - half) < 1e-9
    assert sft["error_y"]["array"][1] == 0.0 and sft["error_y"]["arrayminus"][1] == 0.0
    assert by_name["base"]["error_y"]["arrayminus"][0] == 0.0  # never below 0


def test_one_set_and_one_model_get_no_grid(tmp_path: Path) -> None:
    runs = [_run(tmp_path, "only", "m", "/x/c.jsonl", [1.0, 0.0])]
    assert _grid(render_report(runs)) is None
