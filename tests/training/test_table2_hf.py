"""The Table 2 experiment where vLLM is not installed (a GPU machine with torch and transformers
only): ``serve: {engine: hf}`` scores each stage through the harness's transformers server. The
scripted tiny checkpoint stands in for the model (it cannot solve an arena: the run must still
go to the end, every task scored)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.training.e2e import cli
from training.table2.config import ExperimentConfig


@pytest.mark.integration
def test_eval_stage_on_the_hf_engine(tiny_bf16: Path, tmp_path: Path) -> None:
    cfg = {
        "out": str(tmp_path / "x"),
        "model": str(tiny_bf16),
        "profile": "tiny-cpu",
        "serve": {"engine": "hf", "device": "cpu"},
        "arenas": {"seed": 0, "train_tasks": 8, "eval_tasks": 3},
        "eval": {"splits": ["c"], "bfcl_limit": 0, "max_steps": 3, "max_tokens": 64},
    }
    path = tmp_path / "t2.json"
    path.write_text(json.dumps(cfg))
    cli("training.cli", "table2", "run", "-c", str(path), "--stages", "arenas,model,eval-base")
    out = tmp_path / "x"
    summary = json.loads((out / "eval" / "base-c" / "summary.json").read_text())
    assert summary["tasks"] == 3 and "mean_reward" in summary, summary
    assert "hf_server: base on http://127.0.0.1:" in (out / "logs" / "vllm-base.log").read_text()
    assert json.loads((out / "experiment.json").read_text())["serve"] == cfg["serve"]


@pytest.mark.parametrize("serve", [{"port": 8000}, {"model": "x"}, {"no_such_field": 1}])
def test_serve_overrides_the_experiment_owns_or_serve_lacks_are_refused(serve: dict) -> None:
    with pytest.raises(ValidationError, match="cannot be set here"):
        ExperimentConfig(serve=serve)


def test_an_empty_serve_keeps_old_fingerprints() -> None:
    assert "serve" not in ExperimentConfig().fingerprint()
    assert ExperimentConfig(serve={"engine": "hf"}).fingerprint()["serve"] == {"engine": "hf"}
