"""``trl.dtype`` against the machine: bf16 autocast on a CPU that computes it, a fallback that
says why where it does not, and a refusal of an explicit bfloat16 there."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from astra_agent.errors import ConfigError
from training import device
from training.sft.config import SFTConfig
from training.sft.trl import trl_args

X86_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile\n"
X86_PLAIN = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.fixture
def cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def use(text: str) -> None:
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        monkeypatch.setattr(device, "CPUINFO", path)

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
    monkeypatch.setattr(device, "CPUINFO", tmp_path / "absent")
    assert "cannot be read" in (device.bf16_unsupported("cpu") or "")


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
