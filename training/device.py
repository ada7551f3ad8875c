"""Where a TRL run (SFT or RL) trains and in which precision: ``trl.device`` and ``trl.dtype``
resolved against this machine, before anything is written.

``bfloat16`` is autocast with float32 master weights (the Trainer's ``bf16=True``; on CPU with
``use_cpu=True``, through accelerate): the weights, the optimizer state and the saved
checkpoints stay float32; the matmuls run in bfloat16. On a CPU that pays only where the cores
compute bfloat16 themselves (AVX512-BF16 or AMX on x86, the BF16 extension on ARM): SmolLM2-135M
trained 7.1× as many tokens a second as in float32 on the 2-core Xeon of DESIGN.md ("Real
models"). Elsewhere bfloat16 is emulated, slower than float32: ``auto`` falls back to float32
there, saying why, and an explicit ``bfloat16`` is refused. Whether the CPU computes it is
``serving.cpu``'s answer (its flags, and an instruction-set cap on oneDNN), which serving's
``dtype: auto`` shares. A ``trl.device`` this machine lacks (``cuda`` without a GPU) is refused,
as serving's ``--device`` is (``serving.devices``).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.errors import ConfigError
from serving.cpu import bf16_missing
from serving.devices import resolve_device

log = logging.getLogger(__name__)


class TRLOptions(BaseModel):
    """One machine (CPU in CI, or GPUs): TRL's trainers (``SFTTrainer``, ``GRPOTrainer``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "float32",
        description="bfloat16: autocast, float32 master weights (CPU too; refused where the "
        "device does not compute bf16); auto: bfloat16 where the device computes it (CUDA "
        "with bf16; a CPU with avx512_bf16, amx_bf16 or ARM's bf16), else float32 with a "
        "warning (training.device); the real-model recipes use auto",
    )
    gradient_checkpointing: bool = False
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    threads: int | None = Field(None, ge=1, description="torch threads on CPU (default: all)")


def bf16_unsupported(device: str) -> str | None:
    """Why ``device`` ("cpu" or "cuda") cannot train in bfloat16, or None where it can."""
    if device == "cuda":
        import torch

        if torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False):
            return None
        return "this GPU does not compute bfloat16 (torch.cuda.is_bf16_supported() is false)"
    return bf16_missing()


def device_of(cfg: Any) -> str:
    """The device of ``cfg.trl.device`` (an SFT or RL config); ``auto``: CUDA if present.
    ``cuda`` where torch sees no GPU is a ConfigError (``serving.devices``), not a run on the
    CPU: the TRL runs ask this before the model is loaded."""
    return resolve_device(str(cfg.trl.device), "trl.device")


def trains_in_bf16(dtype: str, device: str) -> bool:
    """Whether ``trl.dtype`` ``dtype`` on ``device`` trains with bfloat16 autocast (float32
    master weights). ``auto``: where the device supports it, else float32 with a warning that
    says why; ``bfloat16`` where it does not: a ConfigError."""
    if dtype == "float32":
        return False
    why = bf16_unsupported(device)
    if why is None:
        log.info("training in bfloat16 autocast on %s (float32 master weights)", device)
        return True
    if dtype == "bfloat16":
        raise ConfigError(
            f"trl.dtype bfloat16 is not supported on {device}: {why}",
            hint="use trl.dtype: auto (float32 where bfloat16 is not supported) or float32",
        )
    log.warning("trl.dtype auto: training in float32 on %s, because %s", device, why)
    return False
