"""``astra-train sft`` (TRL) when a run breaks: a broken run must not look finished.

Each case goes through the CLI as a user runs it (in-process with typer's runner, or as a
process where a signal is sent) on the random tiny model and six rows of the arena SFT corpus:
numbers the config must refuse, a run that diverges (a learning rate so high that the loss,
the gradient or the weights overflow, for real), a rerun of a finished run, a checkpoint with
a truncated file, a run directory that moved, Ctrl-C of a background job, and broken cells of
``sft.parquet``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from astra_agent.errors import ConfigError
from tests.training.conftest import train_in_process, wait_for_checkpoint
from tests.training.e2e import write_recipe
from training.metrics import MetricsLog
from training.run import last_complete_checkpoint, prepare_run_dir
from training.sft.config import SFTConfig

REPO = Path(__file__).resolve().parents[2]
ROWS = 6  # one epoch: 6 steps at a global batch of 1
pytestmark = pytest.mark.usefixtures("wide_consoles", "torch_threads_kept")


@pytest.fixture(scope="module")
def parquet(arena_parquet: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first six arena trajectories through `astra-train data sft`."""
    import pyarrow.parquet as pq

    out = tmp_path_factory.mktemp("sft-attacks-data") / "six.parquet"
    pq.write_table(pq.read_table(arena_parquet).slice(0, ROWS), out)
    return out


def recipe(tmp_path: Path, model: Path, data: Path, **over: Any) -> Path:
    cfg: dict[str, Any] = {
        "model": str(model),
        "train_files": [str(data)],
        "output_dir": str(tmp_path / "run"),
        "max_length": 4096,
        "global_batch_size": 1,
        "learning_rate": 3e-3,
        "max_steps": 4,
        "save_steps": 2,
        "save_total_limit": 10,
        "trl": {"threads": 1},
        "convert": {"enabled": False},
    }
    return write_recipe(tmp_path, cfg, over)


def sft(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``astra-train sft ARGS`` in-process: (exit code, stdout + stderr)."""
    return train_in_process("sft", *args, env=env)


def steps(run: Path) -> list[int]:
    return [m["step"] for m in MetricsLog.read(run / "metrics.jsonl")]


def tree(run: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``run``: (size, modification time in ns)."""
    return {
        str(p.relative_to(run)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


def weights_finite(ckpt: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    tensors = [t for f in ckpt.glob("*.safetensors") for t in load_file(str(f)).values()]
    return bool(tensors) and all(bool(torch.isfinite(t).all()) for t in tensors)


# ------------------------------------------------------------------ numbers the config refuses


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--learning-rate", "nan"], None, "learning_rate"),
        (["--learning-rate", "inf"], None, "learning_rate"),
        (["--learning-rate", "-1e-3"], None, "learning_rate"),
        (["--learning-rate", "0"], None, "learning_rate"),
        (["--epochs", "inf"], None, "epochs"),
        (["--seed", "-1"], None, "seed"),
        (["--seed", str(2**32)], None, "seed"),
        ([], {"ASTRA_TRAIN_LEARNING_RATE": "Infinity"}, "learning_rate"),
        ([], {"ASTRA_TRAIN_MAX_GRAD_NORM": "inf"}, "max_grad_norm"),
        ([], {"ASTRA_TRAIN_WARMUP_RATIO": "nan"}, "warmup_ratio"),
        ([], {"ASTRA_TRAIN_WEIGHT_DECAY": "-inf"}, "weight_decay"),
    ],
)
def test_a_non_finite_or_out_of_range_number_is_refused_before_anything(
    tmp_path: Path, args: list[str], env: dict[str, str] | None, named: str
) -> None:
    cfg = recipe(tmp_path, tmp_path / "no-model", tmp_path / "no.parquet")
    code, out = sft("--config", str(cfg), *args, env=env)
    assert code == 2 and f"  {named}: " in out and "Traceback" not in out, out
    assert not (tmp_path / "run").exists()


def test_infinity_in_the_recipe_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"  # YAML spells it .inf; JSON cannot hold it at all
    path.write_text("model: m\ntrain_files: [d.parquet]\noutput_dir: o\nmax_grad_norm: .inf\n")
    code, out = sft("--config", str(path))
    assert code == 2 and "max_grad_norm: Input should be a finite number" in out, out


# ------------------------------------------------------------------ a run that diverges


@pytest.mark.parametrize(
    ("lr", "warmup", "stopped"),
    [
        # warmup makes step 1's rate 0; step 2's update (at 1e6) is finite, step 3's gradient
        # overflows (its loss is still finite): stopped before the optimizer applies it
        (1e6, 0.05, "training diverged at step 3: the gradient norm is nan (not applied); "
         "checkpoint-2 is the last checkpoint"),
        # step 1's update leaves weights near 1e30: step 2's forward overflows
        (1e30, 0.0, "training diverged at step 2: the loss is nan; checkpoint-1 is the last "
         "checkpoint"),
        # step 1's update (at 1e39, past float32's range) makes the weights infinite with a
        # finite loss and gradient: its checkpoint is not saved
        (1e39, 0.0, "training diverged at step 1: its update made weights non-finite "
         "(model.embed_tokens.weight"),
    ],
    ids=["grad-norm", "loss", "weights"],
)  # fmt: skip
def test_a_diverging_run_stops_at_the_first_non_finite_value_and_looks_unfinished(
    tmp_path: Path, random_tiny: Path, parquet: Path, lr: float, warmup: float, stopped: str
) -> None:
    run = tmp_path / "run"
    cfg = recipe(
        tmp_path, random_tiny, parquet, learning_rate=lr, warmup_ratio=warmup, max_steps=6,
        save_steps=1, max_grad_norm=1e9, convert={"enabled": True},
    )  # fmt: skip
    code, out = sft("--config", str(cfg))
    assert code == 1 and stopped in out and "no final/ was written" in out, out
    assert "Traceback" not in out
    assert not (run / "final").exists() and not (run / "final-bf16").exists()
    saved = sorted(run.glob("checkpoint-*"))
    assert all(weights_finite(c) for c in saved)  # every checkpoint kept is a sound one
    records = MetricsLog.read(run / "metrics.jsonl")  # strict JSON: no NaN written
    assert all(r["loss"] > 1.0 for r in records), records  # no NaN logged as a 0.0 loss
    # a resume picks the last sound checkpoint and diverges again: still no final/
    code, out = sft("--config", str(cfg))
    assert code == 1 and "training diverged" in out and not (run / "final").exists(), out


def test_a_start_checkpoint_with_nan_weights_is_refused_before_anything(
    tmp_path: Path, random_tiny: Path, parquet: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(random_tiny), dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight[3] = float("nan")
    bad = tmp_path / "nan-model"
    model.save_pretrained(str(bad))
    for f in random_tiny.iterdir():
        if "token" in f.name or "template" in f.name:
            shutil.copy(f, bad / f.name)
    code, out = sft("--config", str(recipe(tmp_path, bad, parquet)))
    assert code == 2 and "Traceback" not in out, out
    assert f"{bad} holds weights that are not finite (NaN or inf): model.norm.weight" in out
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ reruns of a finished run


def test_a_finished_run_reruns_as_a_no_op_and_completes_a_missing_final(
    tmp_path: Path, random_tiny: Path, parquet: Path
) -> None:
    """max_steps 3 of 6-step epochs: resumed from its last checkpoint, the Trainer would train
    a 4th step and overwrite final/ and final-bf16/."""
    run = tmp_path / "run"
    cfg = recipe(tmp_path, random_tiny, parquet, max_steps=3, convert={"enabled": True})
    code, out = sft("--config", str(cfg))
    assert code == 0 and "trained 3 steps" in out, out
    before = tree(run)
    code, out = sft("--config", str(cfg))
    assert code == 0 and f"{run} holds a finished run (3 steps): nothing to do" in out, out
    assert tree(run) == before and steps(run) == [1, 2, 3]
    # killed after its last checkpoint, before final-bf16/ (or final/) was written
    shutil.rmtree(run / "final-bf16")
    code, out = sft("--config", str(cfg))
    assert code == 0 and f"written from it: {run / 'final-bf16'}" in out, out
    assert tree(run) == before | {k: v for k, v in tree(run).items() if "final-bf16" in k}
    shutil.rmtree(run / "final")
    shutil.rmtree(run / "final-bf16")
    code, out = sft("--config", str(cfg))
    assert code == 0 and "the run had finished at checkpoint-3 (3 steps)" in out, out
    assert not (run / "checkpoint-4").exists() and steps(run) == [1, 2, 3]
    from safetensors.torch import load_file

    assert (
        load_file(str(run / "final" / "model.safetensors")).keys()
        == load_file(str(run / "checkpoint-3" / "model.safetensors")).keys()
    )
    final = load_file(str(run / "final" / "model.safetensors"))
    ckpt = load_file(str(run / "checkpoint-3" / "model.safetensors"))
    assert all(bool((final[k] == ckpt[k]).all()) for k in ckpt)  # the trained weights
    assert (run / "final-bf16" / "config.json").is_file()
    # starting over is still possible, and sets the earlier run aside
    code, out = sft("--config", str(cfg), "--no-resume", "--max-steps", "3")
    assert code == 0 and "trained 3 steps" in out, out
    assert (run / "previous-1" / "final").is_dir() and steps(run) == [1, 2, 3]


# ------------------------------------------------------------------ checkpoints with a bad file


@pytest.fixture(scope="module")
def four_steps(random_tiny: Path, parquet: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 4 steps, checkpoints at 2 and 4, its final/ removed (as if killed after
    checkpoint-4): copied by each test that breaks one of its files."""
    tmp = tmp_path_factory.mktemp("four-steps")
    code, out = sft("--config", str(recipe(tmp, random_tiny, parquet)))
    assert code == 0, out
    shutil.rmtree(tmp / "run" / "final")
    return tmp / "run"


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    ("name", "breaks", "says"),
    [
        ("model.safetensors", _truncate, "is truncated: tensor"),
        ("model.safetensors", lambda p: p.write_bytes(b""), "shorter than a safetensors header"),
        ("optimizer.pt", _truncate, "optimizer.pt is truncated or corrupt"),
        ("scheduler.pt", lambda p: p.write_bytes(b""), "scheduler.pt is truncated or corrupt"),
        ("rng_state.pth", _truncate, "rng_state.pth is truncated or corrupt"),
        ("config.json", lambda p: p.write_text('{"architec'), "config.json is torn"),
        ("config.json", lambda p: p.unlink(), "it has no config.json"),
        ("trainer_state.json", lambda p: p.write_text('{"glo'), "trainer_state.json is unreadable"),
    ],
    ids=["weights-half", "weights-empty", "optimizer", "scheduler", "rng", "config-torn",
         "config-gone", "state-torn"],
)  # fmt: skip
def test_a_checkpoint_with_a_truncated_file_is_skipped_saying_which_and_why(
    four_steps: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str,
    breaks: Any, says: str,
) -> None:  # fmt: skip
    run = tmp_path / "run"
    shutil.copytree(four_steps, run)
    breaks(run / "checkpoint-4" / name)
    with caplog.at_level("WARNING"):
        assert last_complete_checkpoint(run) == run / "checkpoint-2"
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(f"{run / 'checkpoint-4'} skipped") and says in warning, warning


def test_resume_past_a_truncated_checkpoint_trains_on_from_the_one_before(
    four_steps: Path, tmp_path: Path, random_tiny: Path, parquet: Path
) -> None:
    shutil.copytree(four_steps, tmp_path / "run")
    _truncate(tmp_path / "run" / "checkpoint-4" / "model.safetensors")
    code, out = sft("--config", str(recipe(tmp_path, random_tiny, parquet)))
    assert code == 0 and "Traceback" not in out, out
    assert f"resumed from {tmp_path / 'run' / 'checkpoint-2'}" in out and "trained 4 steps" in out
    assert steps(tmp_path / "run") == [1, 2, 3, 4]  # each step once
    assert weights_finite(tmp_path / "run" / "checkpoint-4")  # saved again, whole


# ------------------------------------------------------------------ a run directory that moved


def test_a_moved_run_directory_resumes_with_moved_inputs_of_the_same_content(
    four_steps: Path, tmp_path: Path, random_tiny: Path, parquet: Path
) -> None:
    """The run directory, the model and the data all copied elsewhere (another machine, a
    scratch disk): the same config resumes; a different one, or other data under the same
    path, is refused naming what differs."""
    here = tmp_path / "elsewhere"
    shutil.copytree(four_steps, here / "run")
    shutil.rmtree(here / "run" / "checkpoint-4")  # as if killed after checkpoint-2
    shutil.copytree(random_tiny, here / "model")
    shutil.copy(parquet, here / "data.parquet")
    cfg = recipe(here, here / "model", here / "data.parquet")
    code, out = sft("--config", str(cfg), "--learning-rate", "0.01")
    assert code == 2 and "learning_rate (0.003 → 0.01)" in out, out
    code, out = sft("--config", str(cfg))
    assert code == 0 and f"resumed from {here / 'run' / 'checkpoint-2'}" in out, out
    assert steps(here / "run") == [1, 2, 3, 4]
    # other data at the new path: not the run's data
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(here / "data.parquet").slice(1), here / "data.parquet")
    code, out = sft("--config", str(cfg))
    assert code == 2 and f"→ ['{here / 'data.parquet'}'], other content)" in out, out


def test_inputs_are_matched_by_content_not_by_path(tmp_path: Path) -> None:
    model, data = tmp_path / "a" / "model", tmp_path / "a" / "d.parquet"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    data.write_bytes(b"rows " * 100)

    def cfg(model: Path, data: Path, out: Path) -> SFTConfig:
        return SFTConfig(model=model, train_files=[data], output_dir=out)

    assert prepare_run_dir(cfg(model, data, tmp_path / "run")) is False
    # all of it copied elsewhere: the same run
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.copytree(tmp_path / "run", tmp_path / "run-copy")
    moved = cfg(tmp_path / "b" / "model", tmp_path / "b" / "d.parquet", tmp_path / "run-copy")
    assert prepare_run_dir(moved) is True
    (tmp_path / "b" / "model" / ".cache").mkdir()  # a download cache: not the model
    (tmp_path / "b" / "model" / ".cache" / "x.lock").write_text("1")
    assert prepare_run_dir(moved) is True
    # changed in place, under the paths the run started with
    data.write_bytes(b"other rows " * 100)
    with pytest.raises(ConfigError, match=r"train_files \(\[.*\]: its content changed since"):
        prepare_run_dir(cfg(model, data, tmp_path / "run"))
    (model / "generation_config.json").write_text("{}")  # one more file in the model
    with pytest.raises(ConfigError, match=r"model \('.*/a/model': its content changed"):
        prepare_run_dir(cfg(model, data, tmp_path / "run"))


def test_a_run_file_of_an_earlier_version_resumes_in_place(tmp_path: Path) -> None:
    """Written when the fingerprint held the output directory and no input digests (and the
    torch threads): still the same run where it is."""
    cfg = SFTConfig.model_validate(
        {"model": tmp_path / "m", "train_files": [tmp_path / "d.parquet"],
         "output_dir": tmp_path / "run", "trl": {"threads": 2}}
    )  # fmt: skip
    old = {**cfg.model_dump(mode="json", exclude={"resume", "save_steps", "save_total_limit",
                                                   "report_to", "convert"})}  # fmt: skip
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "astra-sft.json").write_text(json.dumps({"fingerprint": old}))
    assert prepare_run_dir(cfg) is True
    other = cfg.model_copy(update={"seed": 5})
    with pytest.raises(ConfigError, match=r"seed \(0 → 5\)"):
        prepare_run_dir(other)


# ------------------------------------------------------------------ signals


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts `cmd &`


@pytest.mark.integration  # processes, signalled
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_background_run_stops_on_a_signal_and_resumes(
    tmp_path: Path, random_tiny: Path, parquet: Path, sig: signal.Signals
) -> None:
    """Started with SIGINT ignored (a background job of a non-interactive shell): Ctrl-C or
    `kill -INT` still stops it, and SIGTERM too, with one line saying how to resume."""
    run = tmp_path / "run"
    cfg = recipe(tmp_path, random_tiny, parquet, max_steps=12, save_steps=2)
    cmd = [sys.executable, "-m", "training.cli", "sft", "--config", str(cfg)]
    env = {**os.environ, "COLUMNS": "300"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=_ignore_sigint,
    )  # fmt: skip
    try:
        wait_for_checkpoint(run / "checkpoint-2" / "trainer_state.json", proc, 240)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = err.decode()
    assert proc.returncode == 128 + sig, stderr[-2000:]
    ckpt = last_complete_checkpoint(run)
    assert (
        ckpt is not None
        and f"stopped by {sig.name}: the same command resumes from {ckpt}\n" in stderr
    )
    assert "Traceback" not in stderr and not (run / "final").exists()
    code, out = sft("--config", str(cfg))
    assert code == 0 and f"resumed from {ckpt}" in out, out
    assert steps(run) == list(range(1, 13))


# ------------------------------------------------------------------ broken cells of sft.parquet


def _break_cell(src: Path, dst: Path, row: int, column: str, value: Any) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    cells = table.column(column).to_pylist()
    cells[row] = value
    i = table.schema.get_field_index(column)
    pq.write_table(table.set_column(i, column, pa.array(cells, type=pa.string())), dst)
    return dst


@pytest.mark.parametrize(
    ("column", "value", "why"),
    [
        ("messages", '[{"role": "user", "content": "hi"', "not JSON (Expecting"),
        ("messages", None, "null, not JSON text"),
        ("messages", '{"role": "user"}', "JSON dict, not a JSON array"),
        ("messages", "[1, 2]", "an item of the array is not a JSON object"),
        ("messages", "[]", "no messages"),
        ("messages", '[{"content": "no role"}]', "a message has role None"),
        ("messages", '[{"role": ["user"], "content": "x"}]', "a message has role ['user']"),
        ("tools", "not json at all", "not JSON (Expecting value"),
        ("tools", None, "null, not JSON text"),
        ("tools", '"a string"', "JSON str, not a JSON array"),
        ("provenance", "{oops", "not JSON"),
        ("id", None, "null, not a string"),
        ("messages", "\U0001f600 é 中", "not JSON"),
    ],
)
def test_a_broken_cell_of_the_parquet_is_refused_naming_file_row_and_column(
    tmp_path: Path, random_tiny: Path, parquet: Path, column: str, value: Any, why: str
) -> None:
    bad = _break_cell(parquet, tmp_path / "bad.parquet", 3, column, value)
    code, out = sft("--config", str(recipe(tmp_path, random_tiny, bad)))
    assert code == 2 and "Traceback" not in out, out
    line = next(ln for ln in out.splitlines() if ln.startswith("error:"))
    assert line.startswith(f"error: {bad}: row 3 (id ") and f"column '{column}': {why}" in line
    assert not (tmp_path / "run").exists()  # refused before the run directory is written


def test_a_parquet_without_a_column_is_refused(
    tmp_path: Path, random_tiny: Path, parquet: Path
) -> None:
    import pyarrow.parquet as pq

    bad = tmp_path / "bad.parquet"
    pq.write_table(pq.read_table(parquet).drop(["tools"]), bad)
    code, out = sft("--config", str(recipe(tmp_path, random_tiny, bad)))
    assert code == 2 and f"{bad} is not an `astra-train data sft` parquet" in out, out
    assert "tools" in out and not (tmp_path / "run").exists()
