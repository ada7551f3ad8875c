"""``trl.dtype`` against the machine: bf16 autocast on a CPU that computes it, a fallback that
says why where it does not, and a refusal of an explicit bfloat16 there."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest

from astra_agent.errors import ConfigError
from serving import cpu, devices
from tests.training.conftest import ARENA_TRAIN
from training import device
from training.sft.config import SFTConfig
from training.sft.trl import trl_args

X86_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile\n"
X86_PLAIN = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.fixture
def cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Lay ``text`` as the CPU's /proc/cpuinfo, with no instruction-set cap in the environment
    (a run of the suite that emulates an AVX2 machine sets one)."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)

    def use(text: str) -> None:
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        monkeypatch.setattr(cpu, "CPUINFO", path)

    return use


@pytest.mark.parametrize("text", [X86_BF16, ARM_BF16])
def test_a_cpu_with_bf16_trains_in_bf16(cpuinfo, text: str) -> None:
    cpuinfo(text)
    assert device.trains_in_bf16("auto", "cpu") and device.trains_in_bf16("bfloat16", "cpu")
    assert not device.trains_in_bf16("float32", "cpu")


def test_without_bf16_auto_falls_back_saying_why_and_bfloat16_is_refused(
    cpuinfo, caplog: pytest.LogCaptureFixture
) -> None:
    cpuinfo(X86_PLAIN)
    with caplog.at_level(logging.WARNING, logger="training.device"):
        assert not device.trains_in_bf16("auto", "cpu")
    assert "training in float32 on cpu" in caplog.text and "avx512_bf16" in caplog.text
    with pytest.raises(ConfigError, match=r"trl\.dtype bfloat16 is not supported on cpu") as exc:
        device.trains_in_bf16("bfloat16", "cpu")
    assert "trl.dtype: auto" in (exc.value.hint or "")


def test_unreadable_cpu_flags_are_not_bf16(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cpu, "CPUINFO", tmp_path / "absent")
    assert "cannot be read" in (device.bf16_unsupported("cpu") or "")


@pytest.mark.parametrize("isa", ["AVX2", "avx512_core", "AVX512_CORE_VNNI"])
def test_a_onednn_cap_below_bf16_is_no_bf16_whatever_the_flags(
    cpuinfo, monkeypatch: pytest.MonkeyPatch, isa: str
) -> None:
    """ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16 makes bf16 matmuls emulated on an AMX CPU
    too (how the suite emulates an AVX2-only machine): auto trains in float32 and says so."""
    cpuinfo(X86_BF16)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    why = device.bf16_unsupported("cpu") or ""
    assert f"ONEDNN_MAX_CPU_ISA={isa.upper()}" in why
    assert not device.trains_in_bf16("auto", "cpu")
    for allowed in ("AVX512_CORE_BF16", "AVX512_CORE_AMX", "ALL", ""):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", allowed)
        assert device.bf16_unsupported("cpu") is None, allowed


def test_the_cpu_is_described_with_its_bf16_verdict(cpuinfo, monkeypatch) -> None:
    cpuinfo("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx avx2 fma\n")
    line = cpu.describe()
    assert line.startswith("AMD EPYC 7B13,") and "avx avx2" in line and "no bf16 (" in line
    cpuinfo(X86_BF16.replace("flags", "model name\t: Xeon\nflags"))
    assert "amx_tile" in cpu.describe() and cpu.describe().endswith("bf16 computed")


def test_trl_args_take_bf16_on_cpu(cpuinfo, tmp_path: Path) -> None:
    cpuinfo(X86_BF16)
    trl = {"device": "cpu", "dtype": "auto"}
    files = [tmp_path / "x.parquet"]
    cfg = SFTConfig.model_validate(
        {"model": tmp_path, "train_files": files, "output_dir": tmp_path / "o", "trl": trl}
    )
    args = trl_args(cfg, "cpu")
    assert args.bf16 and args.use_cpu
    cpuinfo(X86_PLAIN)
    with pytest.raises(ConfigError):
        strict = cfg.trl.model_copy(update={"dtype": "bfloat16"})
        trl_args(cfg.model_copy(update={"trl": strict}), "cpu")


NO_BF16 = "this CPU has none of the bfloat16 flags (a test double)"


def test_explicit_bf16_on_a_cpu_without_it_is_refused_before_anything_is_written(
    random_tiny: Path, arena_parquet: Path, tiny_fp32: Path, tmp_path: Path, monkeypatch
) -> None:
    """SFT and RL: the one-line error and its hint; no run directory written."""
    from training.rl.config import RLConfig
    from training.rl.trl import run_trl as run_rl
    from training.sft.trl import run_trl as run_sft

    monkeypatch.setattr(device, "bf16_unsupported", lambda dev: NO_BF16)
    trl = {"device": "cpu", "dtype": "bfloat16"}
    sft = SFTConfig.model_validate(
        {"model": random_tiny, "train_files": [arena_parquet], "output_dir": tmp_path / "sft",
         "max_length": 4096, "global_batch_size": 1, "trl": trl}
    )  # fmt: skip
    rl = RLConfig.model_validate(
        {"model": tiny_fp32, "train_files": [ARENA_TRAIN], "output_dir": tmp_path / "rl",
         "group_size": 2, "batch_groups": 1, "micro_batch_size": 1,
         "rollout": {"engine": "hf"}, "trl": trl}
    )  # fmt: skip
    for run, cfg in ((run_sft, sft), (run_rl, rl)):
        with pytest.raises(
            ConfigError, match=re.escape(f"bfloat16 is not supported on cpu: {NO_BF16}")
        ):
            run(cfg)
        assert not cfg.output_dir.exists()


@pytest.mark.integration
def test_a_bf16_sft_run_trains_with_finite_loss_and_saves_float32_weights(
    random_tiny: Path, arena_parquet: Path, tmp_path: Path, monkeypatch
) -> None:
    """bfloat16 autocast on CPU (forced on: a CPU without bf16 emulates it) through the real
    ``SFTTrainer``: the loss is finite and falls, and the checkpoint holds the float32 master
    weights, not bf16 copies."""
    from safetensors import safe_open

    from training.metrics import MetricsLog
    from training.sft.trl import run_trl

    monkeypatch.setattr(device, "bf16_unsupported", lambda dev: None)
    cfg = SFTConfig.model_validate(
        {"model": random_tiny, "train_files": [arena_parquet], "output_dir": tmp_path / "run",
         "max_length": 4096, "max_steps": 3, "learning_rate": 3e-3, "warmup_ratio": 0.0,
         "global_batch_size": 1, "micro_batch_size": 1, "save_steps": 1000,
         "trl": {"device": "cpu", "dtype": "bfloat16", "threads": 2},
         "convert": {"enabled": False}}
    )  # fmt: skip
    result = run_trl(cfg)
    losses = [m["loss"] for m in MetricsLog.read(cfg.output_dir / "metrics.jsonl")]
    assert result.steps == 3 and len(losses) == 3
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    with safe_open(str(result.final / "model.safetensors"), framework="pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    assert dtypes == {"F32"}


# ------------------------------------------------------------------ trl.device

NO_GPU = "torch sees no CUDA device here (a test double)"


def _sft_cfg(model: Path, data: Path, out: Path, trl_device: str) -> SFTConfig:
    return SFTConfig.model_validate(
        {"model": model, "train_files": [data], "output_dir": out, "max_length": 4096,
         "global_batch_size": 1, "trl": {"device": trl_device, "dtype": "float32"}}
    )  # fmt: skip


@pytest.mark.parametrize(("gpus", "want"), [(0, "cpu"), (1, "cuda")])
def test_trl_device_auto_is_cuda_where_there_is_a_gpu_else_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: int, want: str
) -> None:
    monkeypatch.setattr(devices, "_cuda_devices", lambda: (gpus, None if gpus else NO_GPU))
    cfg = _sft_cfg(tmp_path, tmp_path / "x.parquet", tmp_path / "o", "auto")
    assert device.device_of(cfg) == want
    cpu_only = _sft_cfg(tmp_path, tmp_path / "x.parquet", tmp_path / "o", "cpu")
    assert device.device_of(cpu_only) == "cpu"


def test_trl_device_cuda_without_a_gpu_is_refused_before_anything_is_written(
    random_tiny: Path, arena_parquet: Path, tiny_fp32: Path, tmp_path: Path, monkeypatch
) -> None:
    """SFT and RL: the GPU asked for is not there, so neither trains (on the CPU instead);
    the model is not loaded and no run directory is written."""
    from training.rl.config import RLConfig
    from training.rl.trl import run_trl as run_rl
    from training.sft import trl as sft_trl

    monkeypatch.setattr(devices, "_cuda_devices", lambda: (0, NO_GPU))
    monkeypatch.setattr(sft_trl, "load_model", lambda cfg: pytest.fail("the model was loaded"))
    sft = _sft_cfg(random_tiny, arena_parquet, tmp_path / "sft", "cuda")
    rl = RLConfig.model_validate(
        {"model": tiny_fp32, "train_files": [ARENA_TRAIN], "output_dir": tmp_path / "rl",
         "group_size": 2, "batch_groups": 1, "micro_batch_size": 1,
         "rollout": {"engine": "hf"}, "trl": {"device": "cuda"}}
    )  # fmt: skip
    for run, cfg in ((sft_trl.run_trl, sft), (run_rl, rl)):
        with pytest.raises(ConfigError) as exc:
            run(cfg)
        assert exc.value.message == (
            f"trl.device 'cuda': a GPU asked for, but {NO_GPU}; accepted here: auto, cpu"
        )
        assert "--set trl.device=cpu" in (exc.value.hint or "")
        assert not cfg.output_dir.exists()


def test_astra_train_sft_with_trl_device_cuda_on_a_machine_without_a_gpu_exits_2(
    random_tiny: Path, arena_parquet: Path, tmp_path: Path
) -> None:
    """As the user runs it, no GPU visible (CUDA_VISIBLE_DEVICES empty: a GPU machine too)."""
    from tests.conftest import run_module

    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({
        "model": str(random_tiny), "train_files": [str(arena_parquet)], "max_length": 4096,
        "output_dir": str(tmp_path / "run"), "global_batch_size": 1, "max_steps": 1,
        "convert": {"enabled": False},
    }))  # fmt: skip
    out = run_module(
        "training.cli", "sft", "--config", str(recipe), "--set", "trl.device=cuda", timeout=300,
        env={"CUDA_VISIBLE_DEVICES": "", "COLUMNS": "300"},
    )  # fmt: skip
    err = " ".join(out.stderr.split())
    assert out.returncode == 2, out.stdout + out.stderr
    assert "error: trl.device 'cuda': a GPU asked for, but " in err, err
    assert "accepted here: auto, cpu" in err and "(--set trl.device=cpu)" in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()
