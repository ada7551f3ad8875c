"""Run directories written before their claims shared one protocol (:mod:`astra_agent.claim`)
still read and resume: each test writes a directory byte for byte as the code wrote it then (the
literal files below were captured from it), checks that this code takes it up, and that it
writes the same bytes into a fresh directory.

The places: a synthesis stage's ``.run.json`` and ``stats.json``, a training run's
``astra-sft.json``, a verl job's ``verl/fingerprint.json``, a Table 2 experiment's
``experiment.json`` and its arenas' ``arenas.json``; and a verl run from before verl runs had
a run file. (``config.json`` of ``astra-eval``: ``tests/eval/test_results_claim.py``.)"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from astra_agent.errors import ConfigError
from eval.arenas.procedural.generator import MANIFEST, SPLITS, GenSpec, write_arenas
from training.run import TrainingRun, prepare_run_dir, write_run_file
from training.sft.config import SFTConfig
from training.synth.stage import JOURNAL, RUN_STATE, STATS, StageRun, StageStats, code_version
from training.table2.config import ExperimentConfig
from training.table2.directory import Experiment
from training.verl_job import begin_run, check_resume, job_claim

# ------------------------------------------------------------------ a synthesis stage


class Rec(BaseModel):
    id: str


RUN_STATE_TEXT = '{"stage": "pool", "fingerprint": "0123456789abcdef", "code": "0.1.0+synth.0"}'
JOURNAL_TEXT = '{"unit":"u1","records":[{"id":"a"}],"rejections":[],"usage":{}}\n'
STATS_TEXT = """{
  "stage": "pool",
  "format": 1,
  "fingerprint": "0123456789abcdef",
  "code_version": "0.1.0+synth.0",
  "inputs": [],
  "params": {},
  "records": 1,
  "rejections": {},
  "resumed_units": 0,
  "finished": "2026-12-07T08:00:00+00:00"
}
"""


def stage_run(out: Path, fingerprint: str = "0123456789abcdef", **kw: Any) -> StageRun[Rec]:
    return StageRun(
        out, stage="pool", output="pool.jsonl", record_type=Rec, fingerprint=fingerprint, **kw
    )


def test_an_unfinished_stage_run_of_then_resumes_its_units(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / RUN_STATE).write_text(RUN_STATE_TEXT)
    (tmp_path / JOURNAL).write_text(JOURNAL_TEXT)
    with pytest.raises(ConfigError, match="holds an unfinished pool run"):
        stage_run(tmp_path)
    with pytest.raises(ConfigError, match=r"other inputs or parameters \(fingerprint 0123"):
        stage_run(tmp_path, fingerprint="fedcba9876543210", resume=True)
    with caplog.at_level(logging.WARNING):
        run = stage_run(tmp_path, resume=True)
    assert run.done("u1") and run.records("u1") == [Rec(id="a")] and not run.complete
    assert "made by code 0.1.0+synth.0" in caplog.text
    state = json.dumps({"stage": "pool", "fingerprint": "0123456789abcdef", "code": code_version()})
    assert (tmp_path / RUN_STATE).read_text() == state  # rewritten as it was written then


def test_a_complete_stage_run_of_then_is_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / STATS).write_text(STATS_TEXT)
    (tmp_path / "pool.jsonl").write_text('{"id": "a"}\n')
    with pytest.raises(ConfigError, match="holds a complete pool run"):
        stage_run(tmp_path)
    run = stage_run(tmp_path, resume=True)
    assert run.complete and StageStats.model_validate(run.stats).records == 1
    assert (tmp_path / STATS).read_text() == STATS_TEXT and not (tmp_path / RUN_STATE).exists()


def test_a_fresh_stage_run_writes_its_state_as_then(tmp_path: Path) -> None:
    stage_run(tmp_path / "out")
    want = f'{{"stage": "pool", "fingerprint": "0123456789abcdef", "code": "{code_version()}"}}'
    assert (tmp_path / "out" / RUN_STATE).read_text() == want


# ------------------------------------------------------------------ a training run (TRL)

# astra-sft.json as written for the config of :func:`sft_cfg`; {root} is the test's directory.
RUN_FILE_TEXT = """{
  "digest": "f4c1f96c0093673b",
  "fingerprint": {
    "backend": "trl",
    "epochs": 2.0,
    "global_batch_size": 1,
    "learning_rate": 5e-06,
    "logging_steps": 1,
    "lr_scheduler": "cosine",
    "max_grad_norm": 1.0,
    "max_length": 20480,
    "max_steps": null,
    "micro_batch_size": 1,
    "model": "{root}/m",
    "packing": true,
    "seed": 0,
    "train_files": [
      "{root}/d.parquet"
    ],
    "trl": {
      "attn_implementation": "sdpa",
      "device": "auto",
      "dtype": "float32",
      "gradient_checkpointing": false
    },
    "val_files": [],
    "verl": {
      "device": "cuda",
      "gpus_per_node": 8,
      "launcher": "torchrun",
      "nnodes": 1,
      "overrides": [],
      "ray_address": "http://127.0.0.1:8265",
      "run": false,
      "strategy": "fsdp2",
      "ulysses_sequence_parallel_size": 1
    },
    "warmup_ratio": 0.05,
    "weight_decay": 0.0
  },
  "inputs": {
    "model": "bef6acf233bd20dd9e6db488ed06d5f0e0cf0e3730765a3ef7f28c7de705b168",
    "train_files": [
      "fbc62d3b511368ee275ddc74117d8689b430e1427220e25d30816201d89ca7b6"
    ],
    "val_files": []
  },
  "memo": {
    "{root}/d.parquet": [
      4,
      1796633256546302872,
      "fbc62d3b511368ee275ddc74117d8689b430e1427220e25d30816201d89ca7b6"
    ],
    "{root}/m/config.json": [
      2,
      1796633256546267935,
      "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    ]
  }
}
"""


def sft_cfg(root: Path, **kw: Any) -> SFTConfig:
    """A config whose inputs hold what they held when ``RUN_FILE_TEXT`` was captured."""
    (root / "m").mkdir(parents=True, exist_ok=True)
    (root / "m" / "config.json").write_text("{}")
    (root / "d.parquet").write_bytes(b"PAR1")
    base = {"model": root / "m", "train_files": [root / "d.parquet"], "global_batch_size": 1}
    return SFTConfig.model_validate({**base, "output_dir": root / "run", **kw})


def run_file_text(root: Path) -> str:
    return RUN_FILE_TEXT.replace("{root}", str(root.resolve()))


def test_a_training_run_of_then_resumes_and_its_run_file_is_kept(tmp_path: Path) -> None:
    cfg = sft_cfg(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "astra-sft.json").write_text(run_file_text(tmp_path))
    run = TrainingRun.open(cfg)
    assert run.resume and run.checkpoint is None
    run.begin()
    assert (tmp_path / "run" / "astra-sft.json").read_text() == run_file_text(tmp_path)
    with pytest.raises(ConfigError, match=r"different config: learning_rate \(5e-06 → 0\.001\)"):
        TrainingRun.open(sft_cfg(tmp_path, learning_rate=1e-3))
    (tmp_path / "d.parquet").write_bytes(b"PAR2")  # changed in place: refused by content
    with pytest.raises(ConfigError, match=r"train_files .*its content changed"):
        prepare_run_dir(cfg)


def test_a_run_file_of_then_is_written_the_same_way(tmp_path: Path) -> None:
    cfg = sft_cfg(tmp_path)
    (tmp_path / "run").mkdir()
    write_run_file(cfg)
    want = run_file_text(tmp_path)
    then = {"d.parquet": "1796633256546302872", "m/config.json": "1796633256546267935"}
    for name, mtime in then.items():
        want = want.replace(mtime, str((tmp_path / name).stat().st_mtime_ns))  # this test's own
    assert (tmp_path / "run" / "astra-sft.json").read_text() == want


# ------------------------------------------------------------------ a verl job


def test_a_verl_job_of_then_resumes_only_under_its_config(tmp_path: Path) -> None:
    cfg = sft_cfg(tmp_path, backend="verl")
    out = tmp_path / "run"
    (out / "verl").mkdir(parents=True)
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("5")
    fingerprint = json.loads(run_file_text(tmp_path))["fingerprint"] | {"backend": "verl"}
    old = json.dumps(fingerprint, indent=2, sort_keys=True) + "\n"  # verl/fingerprint.json
    (out / "verl" / "fingerprint.json").write_text(old)
    assert job_claim(cfg).text() == old
    check_resume(cfg)
    other = sft_cfg(tmp_path, backend="verl", learning_rate=1e-3)
    with pytest.raises(
        ConfigError, match=r"holds checkpoints of a different config: learning_rate \(5e-06"
    ):
        check_resume(other)
    check_resume(other.model_copy(update={"resume": False}))  # starting over: not checked


def test_a_verl_run_from_before_verl_runs_had_a_run_file_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "verl").mkdir(parents=True)
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("5")
    fingerprint = json.loads(run_file_text(tmp_path))["fingerprint"] | {"backend": "verl"}
    old = json.dumps(fingerprint, indent=2, sort_keys=True) + "\n"
    (out / "verl" / "fingerprint.json").write_text(old)
    with pytest.raises(ConfigError, match=r"holds checkpoints of a different config: learning"):
        begin_run(sft_cfg(tmp_path, backend="verl", learning_rate=1e-3))
    assert not (out / "astra-sft.json").exists()
    begin_run(sft_cfg(tmp_path, backend="verl"))
    assert json.loads((out / "astra-sft.json").read_text())["fingerprint"] == fingerprint
    assert (out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "5"


# ------------------------------------------------------------------ Table 2


def experiment_cfg(root: Path, **kw: Any) -> ExperimentConfig:
    (root / "sft.yaml").write_text("max_steps: 2\n")
    (root / "rl.yaml").write_text("steps: 1\n")
    recipes = {"sft_recipe": root / "sft.yaml", "rl_recipe": root / "rl.yaml"}
    return ExperimentConfig.model_validate({"out": root / "x", **recipes, **kw})


EXPERIMENT_TEXT = """{
  "model": null,
  "profile": "instruct-cpu",
  "arenas": {
    "seed": 0,
    "train_tasks": 400,
    "eval_tasks": 60,
    "heldout_domains": null,
    "signature_holdout_pct": 20
  },
  "reasoning": false,
  "sft_recipe": {
    "max_steps": 2
  },
  "sft": {},
  "rl_recipe": {
    "steps": 1
  },
  "rl": {},
  "eval": {
    "splits": [
      "a",
      "b",
      "c",
      "heldout"
    ],
    "bfcl_limit": 10,
    "bfcl_categories": "base",
    "max_tokens": 256,
    "max_steps": 8
  }
}"""


def test_an_experiment_of_then_is_taken_up_and_written_the_same_way(tmp_path: Path) -> None:
    Experiment(experiment_cfg(tmp_path)).open()
    assert (tmp_path / "x" / "experiment.json").read_text() == EXPERIMENT_TEXT
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "experiment.json").write_text(EXPERIMENT_TEXT)
    Experiment(experiment_cfg(tmp_path, out=tmp_path / "y", eval={"concurrency": 2})).open()
    assert (tmp_path / "y" / "experiment.json").read_text() == EXPERIMENT_TEXT
    other = experiment_cfg(tmp_path, out=tmp_path / "y", reasoning=True)
    with pytest.raises(ConfigError, match=r"another config: reasoning \(False → True\)"):
        Experiment(other).open()


def arenas_text(sha: dict[str, str]) -> str:
    """arenas.json as written for ``GenSpec(train_tasks=3, eval_tasks=2)``, its files'
    digests ``sha``."""
    return f"""{{
  "spec": {{
    "seed": 0,
    "train_tasks": 3,
    "eval_tasks": 2,
    "heldout_domains": null,
    "signature_holdout_pct": 20
  }},
  "counts": {{
    "train": 3,
    "a": 2,
    "b": 2,
    "c": 2
  }},
  "sha256": {{
    "train": "{sha["train"]}",
    "a": "{sha["a"]}",
    "b": "{sha["b"]}",
    "c": "{sha["c"]}"
  }}
}}"""


def test_arenas_of_then_are_kept_under_their_spec(tmp_path: Path) -> None:
    spec = GenSpec(train_tasks=3, eval_tasks=2)
    for split in SPLITS:
        (tmp_path / f"{split}.jsonl").write_text("{}\n")
    empty = hashlib.sha256(b"{}\n").hexdigest()
    (tmp_path / MANIFEST).write_text(arenas_text(dict.fromkeys(SPLITS, empty)))
    paths = write_arenas(tmp_path, spec)
    assert all(p.read_text() == "{}\n" for p in paths.values())  # not written again
    with pytest.raises(ConfigError, match=r"holds arenas of another spec \(seed \(0 → 3\)\)"):
        write_arenas(tmp_path, spec.model_copy(update={"seed": 3}))
    (tmp_path / "train.jsonl").write_text("{}\n{}\n")  # a split changed: written anew
    write_arenas(tmp_path, spec)
    sha = {s: hashlib.sha256(p.read_bytes()).hexdigest() for s, p in paths.items()}
    assert sha["train"] != empty
    assert (tmp_path / MANIFEST).read_text() == arenas_text(sha)
