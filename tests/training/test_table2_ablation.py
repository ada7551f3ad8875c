"""The reward ablation of the Table 2 experiment (``ablation.rewards``): one RL run per reward
from the SFT checkpoint, each recipe the experiment's RL recipe with that reward (and
``ablation.steps``) in its own directory; the table shows each run's tool calls per episode,
solved share and F1 step by step, and the fingerprint of experiments without it is as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from training.table2 import experiment
from training.table2.config import ExperimentConfig
from training.table2.directory import Experiment
from training.table2.table import build_table, render_markdown


def _step(step: int, calls: float, solved: float, f1: float) -> dict[str, Any]:
    return {"step": step, "reward_mean": f1, "solved": solved, "f1_mean": f1,
            "recall_mean": solved, "precision_mean": f1, "calls_mean": calls}  # fmt: skip


def _experiment(tmp_path: Path, **ablation: Any) -> Experiment:
    cfg = ExperimentConfig(out=tmp_path / "x", eval={"splits": ["c"]}, ablation=ablation)
    return Experiment(cfg)


def test_each_reward_trains_from_the_sft_checkpoint_with_its_reward_and_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _experiment(tmp_path, rewards=["recall", "precision"], steps=3)
    for need in (x.path("sft", "final"), x.path("arenas", "train.jsonl")):
        need.parent.mkdir(parents=True, exist_ok=True)
        need.mkdir() if need.name == "final" else need.write_text("")
    (x.ablation_dir("precision") / "final-bf16").mkdir(parents=True)
    (x.ablation_dir("precision") / "final-bf16" / "config.json").write_text("{}")  # done
    ran: list[tuple[str, ...]] = []
    monkeypatch.setattr(Experiment, "run", lambda self, stage, *args, **kw: ran.append(args))
    experiment.stage_ablation(x)
    assert len(ran) == 1, "a finished run is not run again"
    assert ran[0][:3] == ("training.cli", "rl", "--config")
    recipe = yaml.safe_load(Path(ran[0][-1]).read_text())
    assert recipe["reward"] == "recall" and recipe["steps"] == 3
    assert recipe["output_dir"] == str(x.ablation_dir("recall"))
    assert recipe["model"] == str(x.path("sft", "final"))


def test_the_table_shows_each_run_step_by_step(tmp_path: Path) -> None:
    x = _experiment(tmp_path, rewards=["f1", "recall", "precision"])
    runs = {
        "f1": [_step(1, 2.0, 0.4, 0.5), _step(2, 2.1, 0.5, 0.6)],
        "recall": [_step(1, 2.0, 0.4, 0.5), _step(2, 5.5, 0.45, 0.3)],
    }  # precision: not run yet
    for reward, steps in runs.items():
        x.ablation_dir(reward).mkdir(parents=True)
        lines = "".join(json.dumps(s) + "\n" for s in steps) + '{"step": 3, "calls'  # torn
        (x.ablation_dir(reward) / "metrics.jsonl").write_text(lines)
    table = build_table(x)
    assert list(table["ablation"]) == ["f1", "recall"]
    assert [r["calls"] for r in table["ablation"]["recall"]] == [2.0, 5.5]
    md = render_markdown(table)
    assert "| recall | 2 | 2.00 → 5.50 | 0.400 → 0.450 | 0.500 → 0.300 |" in md
    assert "| 2 | 2.10 / 0.500 / 0.600 | 5.50 / 0.450 / 0.300 |" in md
    assert "ablation" not in build_table(_experiment(tmp_path / "other"))


def test_an_experiment_without_ablation_keeps_its_fingerprint(tmp_path: Path) -> None:
    assert "ablation" not in ExperimentConfig(out=tmp_path).fingerprint()
    on = ExperimentConfig(out=tmp_path, ablation={"rewards": ["recall"], "steps": 4})
    assert on.fingerprint()["ablation"] == {"rewards": ["recall"], "steps": 4}
    for bad in ({"rewards": ["recall", "recall"]}, {"rewards": ["accuracy"]}, {"steps": 0}):
        with pytest.raises(ValueError, match="ablation"):
            ExperimentConfig(out=tmp_path, ablation=bad)
