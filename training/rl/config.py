"""The one config of ``astra-train rl`` (YAML/JSON, ``ASTRA_TRAIN_*`` variables, flags).

Backend-neutral fields first (what the paper fixes or what we chose where it is silent: see
the recipes for the reasons), then the rollout, Adaptive Batch Filling and sandbox sections,
then one section per backend. Both backends roll out through the same loop
(``training.rl.rollout``), score with the same reward (``astra_agent.arena``) and fill batches
with the same ``AdaptiveBatchFiller``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from astra_agent.sandbox import SandboxLimits
from training.device import TRLOptions
from training.run import TrainingConfig
from training.verl_job import VerlJobOptions


class ABFOptions(BaseModel):
    """Adaptive Batch Filling (``training.rl.core.AdaptiveBatchFiller``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = Field(True, description="off: every sampled group trains (plain GRPO)")
    delta: float = Field(0.0, ge=0, description="a group is valid if its rewards' std > delta")
    max_age: int = Field(2, ge=0, description="steps a buffered valid group may wait")
    max_flat_rounds: int = Field(
        8, ge=1, description="rounds in a row without a valid group before giving up"
    )
    oversample: float = Field(
        1.0, ge=1.0, le=100.0, description="prompts rolled out per missing valid group in a round"
    )


class RolloutOptions(BaseModel):
    """How episodes are sampled: the engine, sampling, and the episode's bounds."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    engine: Literal["vllm", "hf"] = Field(
        "vllm", description="vllm: a vLLM server, weights reloaded after each update; "
        "hf: the trainer's own model, concurrent episodes batched (where vLLM is not installed)"
    )  # fmt: skip
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, description="-1: off")
    max_turns: int = Field(32, ge=1, description="model calls per episode (paper: 32)")
    max_tokens_per_turn: int = Field(8192, ge=1, description="tokens one model call may sample")
    max_prompt_tokens: int = Field(25600, ge=16, description="the first prompt (paper: 25,600)")
    max_response_tokens: int = Field(
        49152, ge=16, description="all tokens after the prompt, tool results included "
        "(paper: 49,152)"
    )  # fmt: skip
    tool_timeout_s: float = Field(30.0, gt=0)
    max_tool_output_chars: int = Field(8000, ge=200)
    concurrency: int = Field(64, ge=1, description="episodes in flight at once")
    serve: dict[str, Any] = Field(
        default_factory=lambda: {"dtype": "float32"},
        description="overrides of the tiny-cpu vLLM profile for the rollout server",
    )

    @field_validator("serve")
    @classmethod
    def _serve(cls, value: dict[str, Any]) -> dict[str, Any]:
        """The rollout server's options, checked now (not after the model has loaded): the
        fields of ``astra-serve``'s config and ``profile``; not those the engine sets."""
        from pydantic import ValidationError

        from serving.server import ServeConfig

        engine_sets = {"model", "log_file"}
        reserved = sorted(engine_sets & set(value))
        if reserved:
            raise ValueError(f"{', '.join(reserved)} cannot be set here: the engine sets it")
        known = {*ServeConfig.model_fields, "profile"} - engine_sets
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"unknown vLLM server option(s): {', '.join(map(repr, unknown))} "
                f"(known: {', '.join(sorted(known))})"
            )
        if "profile" in value and not isinstance(value["profile"], str):
            raise ValueError("profile must be the name of an `astra-serve` profile")
        try:
            ServeConfig.model_validate({k: v for k, v in value.items() if k != "profile"})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{where}: {first['msg']}") from None
        return value


class VerlRLOptions(VerlJobOptions):
    """A cluster: verl's PPO trainer (GRPO estimator, FSDP actor, vLLM/SGLang rollouts) with
    our agent loop, sampler and reward; launched as ``python -m verl.trainer.main_ppo``."""

    rollout_name: Literal["vllm", "sglang"] = "vllm"
    device: Literal["cuda", "cpu"] = Field(
        "cuda",
        description="cpu: CPU tests and CI only (one node; verl's CPU platform and rollouts "
        "through a vLLM-CPU server, from training.verl_cpu); never on a machine with GPUs",
    )
    tensor_model_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    ppo_micro_batch_size_per_gpu: int = Field(1, ge=1)
    param_offload: bool = False
    optimizer_offload: bool = False


class RLConfig(TrainingConfig):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    backend: Literal["trl", "verl"] = Field("trl", description="TRL (one machine) or verl")
    model: Path = Field(description="HF checkpoint to start from (an SFT checkpoint)")
    train_files: list[Path] = Field(
        min_length=1,
        description="arena records (ASTRA-RL-1k format): JSONL or parquet (repeatable)",
    )
    heldout_files: list[Path] = Field(
        default_factory=list,
        description="held-out arena records, evaluated every eval_every steps (repeatable)",
    )
    steps: int = Field(100, ge=1, description="optimizer steps (one per batch)")
    group_size: int = Field(8, ge=2, description="rollouts per prompt (GRPO group)")
    batch_groups: int = Field(256, ge=1, description="valid prompt groups per step (paper: 256)")
    learning_rate: float = Field(2e-6, gt=0, description="learning rate (paper: 2e-6)")
    lr_scheduler: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    clip_low: float = Field(0.2, gt=0, lt=1)
    clip_high: float = Field(0.28, gt=0)
    advantage_eps: float = Field(1e-6, gt=0)
    advantage_scale: Literal["std", "none"] = "std"
    reward: Literal["f1", "recall", "precision"] = Field(
        "f1",
        description="what trains: ASTRA's F1 of recall and precision, or one of them alone "
        "(the paper's ablation: recall alone makes calls explode, precision alone stops early)",
    )
    micro_batch_size: int = Field(4, ge=1, description="sequences per forward/backward")
    seed: int = Field(0, ge=0, lt=2**32, description="random seed (below 2**32, numpy's range)")
    save_steps: int = Field(10, ge=1, description="a checkpoint every N steps")
    save_total_limit: int = Field(2, ge=1)
    eval_every: int = Field(0, ge=0, description="held-out evaluation every N steps (0: off)")
    eval_limit: int | None = Field(None, ge=1, description="held-out tasks per evaluation")
    abf: ABFOptions = Field(default_factory=ABFOptions)
    rollout: RolloutOptions = Field(default_factory=RolloutOptions)
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    unsafe_no_sandbox: bool = False
    trl: TRLOptions = Field(default_factory=TRLOptions)
    verl: VerlRLOptions = Field(default_factory=VerlRLOptions)

    @field_validator("sandbox")
    @classmethod
    def _finite_limits(cls, value: SandboxLimits) -> SandboxLimits:
        """The sandbox's limits (astra_agent's model, which takes ``inf``) must be finite."""
        for name, v in value.model_dump().items():
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{name}: {v} is not a finite number")
        return value

    @model_validator(mode="after")
    def _clip(self) -> RLConfig:
        if self.rollout.max_tokens_per_turn > self.rollout.max_response_tokens:
            self.rollout.max_tokens_per_turn = self.rollout.max_response_tokens
        return self

    INPUTS: ClassVar[tuple[str, ...]] = ("model", "train_files", "heldout_files")
    RUN_FILE: ClassVar[str] = "astra-rl.json"
    COMMAND: ClassVar[str] = "astra-train rl"
    UNSHAPING: ClassVar[tuple[str, ...]] = (
        "output_dir", "resume", "save_steps", "save_total_limit", "eval_every", "eval_limit",
        "convert", "verl", "rollout.concurrency", "trl.threads",
    )  # fmt: skip
