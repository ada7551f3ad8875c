"""The one config of ``astra-train sft`` (YAML/JSON, ``ASTRA_TRAIN_*`` variables, flags).

Backend-neutral fields first (what the paper fixes: data, lengths, schedule, batch); then one
section per backend. Both backends read the same parquet (``astra-train data sft``) and
tokenize it with the same training template (``training.template``), so they train on the same
tokens with the same loss mask.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field

from training.device import TRLOptions
from training.run import TrainingConfig
from training.verl_job import VerlJobOptions


class VerlOptions(VerlJobOptions):
    """A cluster: verl's SFT trainer (FSDP) launched with torchrun or as a Ray job."""

    launcher: Literal["torchrun", "ray"] = "torchrun"
    device: Literal["cuda", "cpu"] = Field(
        "cuda",
        description="cpu: CPU tests and CI only (torchrun, verl's CPU platform from "
        "training.verl_cpu); never on a machine with GPUs",
    )


class SFTConfig(TrainingConfig):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    backend: Literal["trl", "verl"] = Field("trl", description="TRL (one machine) or verl")
    model: Path = Field(description="HF checkpoint dir to start from (weights + tokenizer)")
    train_files: list[Path] = Field(
        min_length=1, description="parquet of `astra-train data sft` (repeatable)"
    )
    val_files: list[Path] = Field(default_factory=list)
    max_length: int = Field(20480, ge=16, description="tokens per sequence (paper: 20k)")
    epochs: float = Field(2.0, gt=0, description="passes over the data")
    max_steps: int | None = Field(None, ge=1, description="overrides epochs when set")
    learning_rate: float = Field(5e-6, gt=0, description="peak learning rate")
    lr_scheduler: Literal["cosine", "constant", "linear"] = "cosine"
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    global_batch_size: int = Field(32, ge=1, description="sequences per optimizer step")
    micro_batch_size: int = Field(1, ge=1, description="sequences per device per forward")
    packing: bool = Field(True, description="padding-free batches (no pad tokens computed)")
    seed: int = Field(0, ge=0, lt=2**32, description="random seed (below 2**32, numpy's range)")
    save_steps: int = Field(500, ge=1, description="a checkpoint every N steps")
    save_total_limit: int = Field(2, ge=1)
    logging_steps: int = Field(1, ge=1)
    report_to: list[Literal["tensorboard", "wandb"]] = Field(default_factory=list)
    trl: TRLOptions = Field(default_factory=TRLOptions)
    verl: VerlOptions = Field(default_factory=VerlOptions)

    INPUTS: ClassVar[tuple[str, ...]] = ("model", "train_files", "val_files")
    RUN_FILE: ClassVar[str] = "astra-sft.json"
    COMMAND: ClassVar[str] = "astra-train sft"
    UNSHAPING: ClassVar[tuple[str, ...]] = (
        "output_dir", "resume", "save_steps", "save_total_limit", "report_to", "convert",
        "trl.threads",
    )  # fmt: skip
