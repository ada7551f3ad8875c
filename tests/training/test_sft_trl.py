"""``astra-train sft`` with the TRL backend: config → trainer arguments, the run directory
(fingerprint, checkpoints, metrics), a short real run on the arena corpus, kill -9 + resume, and
bad input as one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from astra_agent.errors import ConfigError
from tests.conftest import run_module
from tests.eval.test_rundir import sft_step
from tests.training.conftest import wait_for_checkpoint
from training.cli import app
from training.metrics import MetricsLog, SFTStep
from training.run import last_complete_checkpoint, prepare_run_dir
from training.sft.common import grad_accumulation
from training.sft.config import SFTConfig

REPO = Path(__file__).resolve().parents[2]
METRIC_FIELDS = {
    "step",
    "loss",
    "learning_rate",
    "grad_norm",
    "tokens",
    "padding_tokens",
    "trained_tokens",
    "tokens_per_s",
    "trained_tokens_per_s",
    "epoch",
    "elapsed_s",
    "trained_tokens_total",
}


def _cfg(tmp_path: Path, **kw: Any) -> SFTConfig:
    base: dict[str, Any] = {
        "model": tmp_path / "m",
        "train_files": [tmp_path / "d.parquet"],
        "output_dir": tmp_path / "run",
        "global_batch_size": 1,
    }
    return SFTConfig.model_validate({**base, **kw})


# --------------------------------------------------------------------- run dir, batch, metrics


def test_resume_into_a_different_config_is_refused_naming_the_keys(tmp_path: Path) -> None:
    assert prepare_run_dir(_cfg(tmp_path)) is False  # fresh: nothing to resume
    assert prepare_run_dir(_cfg(tmp_path, save_steps=7)) is True  # not in the fingerprint
    with pytest.raises(ConfigError, match=r"learning_rate \(5e-06 → 0\.001\).*trl\.dtype"):
        prepare_run_dir(_cfg(tmp_path, learning_rate=1e-3, trl={"dtype": "bfloat16"}))


def test_a_foreign_non_empty_output_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not an `astra-train sft` run"):
        prepare_run_dir(_cfg(tmp_path))


def write_checkpoint(d: Path, step: int) -> Path:
    """The files of a checkpoint that resume checks: trainer state, config, whole weights."""
    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.zeros(4, 4)}, str(d / "model.safetensors"))
    (d / "config.json").write_text("{}")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 99}))
    return d


def test_resume_picks_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    for step, complete in ((2, True), (4, True), (6, False), (10, False)):
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        if complete:
            write_checkpoint(d, step)
    (tmp_path / "checkpoint-x").mkdir()
    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-4"
    assert last_complete_checkpoint(tmp_path / "absent") is None
    # killed while the Trainer wrote trainer_state.json (in place): empty, or cut mid-JSON
    for step, torn in ((8, ""), (9, '{"global_step": 9, "log_hi')):
        write_checkpoint(tmp_path / f"checkpoint-{step}", step)
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(torn)
    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-4"


@pytest.mark.parametrize(
    ("global_batch", "micro", "world", "accum"), [(32, 1, 1, 32), (32, 4, 2, 4), (8, 8, 1, 1)]
)
def test_gradient_accumulation_makes_up_the_global_batch(
    tmp_path: Path, global_batch: int, micro: int, world: int, accum: int
) -> None:
    cfg = _cfg(tmp_path, global_batch_size=global_batch, micro_batch_size=micro)
    assert grad_accumulation(cfg, world) == accum


def test_a_global_batch_the_micro_batch_does_not_divide_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"30 is not a multiple of .* 4 × 2"):
        grad_accumulation(_cfg(tmp_path, global_batch_size=30, micro_batch_size=4), 2)


def test_metrics_on_resume_keep_each_step_once_and_the_running_totals(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog[SFTStep](path)
    for step in (1, 2, 3, 4):
        log.append(sft_step(step, trained_tokens=10, tokens=100))
    with path.open("a") as f:
        f.write('{"step": 5, "trained_')  # a torn line of a killed writer
    resumed = MetricsLog[SFTStep](path, resume_step=2)
    resumed.append(sft_step(3, trained_tokens=1, tokens=2))
    rows = MetricsLog.read(path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["trained_tokens_total"] == 21 and rows[-1]["tokens_total"] == 202
    MetricsLog(path)  # a fresh run starts the file over
    assert not path.exists()


def test_trl_arguments_follow_the_paper_schedule_and_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training import device
    from training.sft.trl import trl_args

    monkeypatch.setattr(device, "bf16_unsupported", lambda dev: None)  # a CPU that computes bf16

    cfg = _cfg(
        tmp_path,
        global_batch_size=8,
        micro_batch_size=2,
        warmup_ratio=0.05,
        max_steps=9,
        trl={"dtype": "bfloat16"},
        max_length=512,
    )
    args = trl_args(cfg, "cpu")
    assert args.lr_scheduler_type == "cosine" and args.warmup_steps == 0.05
    assert args.gradient_accumulation_steps == 4 and args.per_device_train_batch_size == 2
    # bfloat16 on CPU: autocast (accelerate's mixed precision), the weights stay float32
    assert args.use_cpu and args.bf16 and args.mixed_precision == "bf16"
    assert args.max_steps == 9 and args.seed == 0
    assert args.padding_free and args.max_length is None  # lengths are checked by us
    single = trl_args(_cfg(tmp_path, packing=False, max_length=512), "cpu")
    assert not single.padding_free and single.max_length == 512
    assert not single.bf16  # the default dtype: float32
    assert single.report_to == [] or single.report_to == ["none"] or single.report_to == "none"


# --------------------------------------------------------------------------- the real thing


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_module("training.cli", *args, timeout=timeout, env={"COLUMNS": "200"})


def _recipe(tmp_path: Path, **kw: Any) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps({"trl": {"threads": 1}, "convert": {"enabled": False}, **kw}))
    return path


@pytest.mark.integration
def test_a_short_seeded_run_learns_and_trains_exactly_the_masked_tokens(
    random_tiny: Path, arena_parquet: Path, tmp_path: Path
) -> None:
    """Two epochs, padding-free micro batches of 2, accumulation 2: the loss falls, every
    logging step is in metrics.jsonl, and the trained tokens are exactly our mask's."""
    from training.sft.trl import TokenCounts, load_model, make_trainer, run_trl, tokenized_rows
    from training.sft.trl import trl_args as make_args
    from training.template import load_tokenizer

    cfg = _cfg(
        tmp_path,
        model=random_tiny,
        train_files=[arena_parquet],
        max_length=4096,
        epochs=2,
        learning_rate=3e-3,
        micro_batch_size=2,
        global_batch_size=4,
        save_steps=1000,
        trl={"threads": 2},
        convert={"enabled": True},
    )
    tok = load_tokenizer(random_tiny)
    rows = tokenized_rows(cfg, tok)
    assert len(rows) == 24
    # TRL's labels are our mask (TRL shifts them itself): ids where the mask is 1, else -100
    args = make_args(cfg, "cpu", output_dir=str(tmp_path / "probe"))
    probe = make_trainer(cfg, load_model(cfg), tok, rows, args, [], TokenCounts())
    for row, ours in zip(probe.train_dataset, rows, strict=True):
        expect = [
            t if m else -100
            for t, m in zip(ours["input_ids"], ours["assistant_masks"], strict=True)
        ]
        assert row["input_ids"] == ours["input_ids"] and row["labels"] == expect

    result = run_trl(cfg)
    metrics = MetricsLog.read(cfg.output_dir / "metrics.jsonl")
    assert result.steps == 12 and [m["step"] for m in metrics] == list(range(1, 13))
    assert all(set(m) >= METRIC_FIELDS for m in metrics)
    assert metrics[0]["learning_rate"] == 0.0 and metrics[1]["learning_rate"] == 3e-3  # warmup
    losses = [m["loss"] for m in metrics]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 1.0, losses
    # each row seen twice; no padding in padding-free batches; the first token is never a target
    assert metrics[-1]["trained_tokens_total"] == 2 * sum(sum(r["assistant_masks"]) for r in rows)
    assert metrics[-1]["padding_tokens_total"] == 0
    assert metrics[-1]["tokens_total"] == 2 * sum(len(r["input_ids"]) for r in rows)
    # the final model: HF layout, the serving template (not the training one), converted
    final = cfg.output_dir / "final"
    assert (final / "model.safetensors").is_file()
    assert load_tokenizer(final).chat_template == tok.chat_template
    assert "endgeneration" not in (final / "chat_template.jinja").read_text()
    assert result.converted == cfg.output_dir / "final-bf16"
    assert json.loads((result.converted / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.integration
def test_kill_9_mid_run_then_resume_reaches_the_last_step_with_nothing_lost(
    random_tiny: Path, arena_parquet: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    recipe = _recipe(
        tmp_path,
        model=str(random_tiny),
        train_files=[str(arena_parquet)],
        output_dir=str(run),
        max_length=4096,
        max_steps=16,
        save_steps=4,
        learning_rate=3e-3,
        global_batch_size=1,
    )
    cmd = [sys.executable, "-m", "training.cli", "sft", "--config", str(recipe)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_checkpoint(run / "checkpoint-4" / "trainer_state.json", proc, 240)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (run / "final").exists()
    done = _cli("sft", "--config", str(recipe))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout and "trained 16 steps" in done.stdout
    steps = [m["step"] for m in MetricsLog.read(run / "metrics.jsonl")]
    assert steps == list(range(1, 17))  # each step once, none lost, none twice
    assert (run / "final" / "model.safetensors").is_file()
    # the same dir with a different config: refused, one line, exit 2, nothing touched
    other = _cli("sft", "--config", str(recipe), "--learning-rate", "0.01")
    assert other.returncode == 2 and "learning_rate" in other.stderr
    assert "Traceback" not in other.stderr


# --------------------------------------------------------------------------- bad input


def _sft(*args: str) -> Any:
    return CliRunner().invoke(app, ["sft", *args])


def test_an_unknown_recipe_key_names_the_key(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: m\ntrain_files: [d.parquet]\noutput_dir: o\nlearnig_rate: 1e-3\n")
    res = _sft("--config", str(recipe))
    assert res.exit_code == 2 and "learnig_rate" in res.output and "Traceback" not in res.output


def test_a_model_path_that_is_not_a_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notmodel").mkdir()
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    recipe = _recipe(
        tmp_path,
        model=str(tmp_path / "notmodel"),
        train_files=[str(tmp_path / "d.parquet")],
        output_dir=str(tmp_path / "o"),
    )
    res = _sft("--config", str(recipe))
    assert res.exit_code == 2 and "not a Hugging Face checkpoint" in res.output
    assert not (tmp_path / "o").exists()


def test_a_missing_parquet_is_refused(random_tiny: Path, tmp_path: Path) -> None:
    recipe = _recipe(
        tmp_path,
        model=str(random_tiny),
        train_files=[str(tmp_path / "nope.parquet")],
        output_dir=str(tmp_path / "o"),
    )
    res = _sft("--config", str(recipe))
    assert res.exit_code == 2 and "nope.parquet" in res.output and "not found" in res.output
    assert not (tmp_path / "o").exists()


def test_a_corrupt_parquet_is_refused(random_tiny: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"this is not parquet\n" * 10)
    recipe = _recipe(
        tmp_path, model=str(random_tiny), train_files=[str(bad)], output_dir=str(tmp_path / "o")
    )
    res = _sft("--config", str(recipe))
    assert res.exit_code == 2 and "bad.parquet" in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "o").exists()


def test_padding_free_attention_runs_each_sequence_on_its_own(
    random_tiny: Path, tmp_path: Path
) -> None:
    """The per-sequence sdpa of padding-free batches gives the logits of each sequence run
    alone (no attention across the sequences of a row), and the saved config says sdpa."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.sft.trl import VARLEN_SDPA, load_model

    cfg = _cfg(tmp_path, model=random_tiny, micro_batch_size=3, global_batch_size=3)
    ours = load_model(cfg)
    assert ours.config._attn_implementation == VARLEN_SDPA
    ref = AutoModelForCausalLM.from_pretrained(str(random_tiny), dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 2000, (n,), generator=gen) for n in (90, 150, 60)]
    cu = torch.tensor([0, 90, 240, 300], dtype=torch.int32)
    pos = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    with torch.no_grad():
        packed = ours(
            input_ids=torch.cat(seqs)[None], position_ids=pos, cu_seq_lens_q=cu,
            cu_seq_lens_k=cu, max_length_q=150, max_length_k=150, use_cache=False,
        ).logits[0]  # fmt: skip
        alone = torch.cat([ref(input_ids=s[None]).logits[0] for s in seqs])
    assert torch.allclose(packed, alone, atol=1e-5)
