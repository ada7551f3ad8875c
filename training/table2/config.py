"""The experiment's config: where it writes, the base model, the arenas, the SFT and RL
recipes with their overrides, and the evaluation (``astra-train table2 run --config``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from astra_agent.config import read_mapping
from eval.arenas.procedural import GenSpec

RECIPES = Path(__file__).resolve().parents[1] / "recipes"  # training/recipes


SPLIT_NAMES = ("a", "b", "c", "heldout")


class EvalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    splits: list[str] = Field(
        default_factory=lambda: list(SPLIT_NAMES),
        description="arena sets scored for each model: a, b, c (generated), heldout (ours)",
    )
    bfcl_limit: int = Field(
        10, ge=0, description="BFCL entries a category, the first of each (0: no BFCL)"
    )
    bfcl_categories: str = Field(
        "base",
        description="BFCL categories and groups of the slice, as `astra-eval bfcl --categories` "
        "takes them (single_turn: non-live and live AST, irrelevance, relevance)",
    )
    bfcl_half: Literal["selection", "report"] | None = Field(
        None,
        description="score one fixed half of BFCL only (`astra-eval bfcl --half`): settings are "
        "chosen on `selection`, a published table scores `report` once (docs/evaluation.md)",
    )
    concurrency: int = Field(16, ge=1, description="episodes at once against vLLM")
    max_tokens: int = Field(256, ge=16, description="tokens per reply")
    max_steps: int = Field(8, ge=1, description="model calls per arena task")

    @field_validator("splits")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        bad = [s for s in v if s not in SPLIT_NAMES]
        if bad or len(set(v)) != len(v) or not v:
            raise ValueError(f"splits must be distinct names of {SPLIT_NAMES}, got {v}")
        return v


class AblationSettings(BaseModel):
    """The paper's reward ablation: RL runs from the same SFT checkpoint, each training on one
    reward (``astra-train rl``'s ``reward``), compared by their rollouts' tool calls per episode,
    solved share and F1 step by step."""

    model_config = ConfigDict(extra="forbid")
    rewards: list[Literal["f1", "recall", "precision"]] = Field(
        default_factory=list,
        description="one RL run per reward, in OUT/ablation/REWARD (none: no ablation)",
    )
    steps: int | None = Field(None, ge=1, description="steps of each run (default: rl's)")

    @field_validator("rewards")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"rewards must be distinct, got {v}")
        return v


class ExperimentConfig(BaseModel):
    """One experiment: where it writes, the base model, the arenas, the SFT and RL recipes
    (each a shipped recipe file with overrides) and the evaluation."""

    model_config = ConfigDict(extra="forbid")
    out: Path = Field(Path("runs/table2"), description="experiment directory")
    model: Path | None = Field(
        None, description="base HF checkpoint (default: SmolLM2-135M-Instruct from its GGUF)"
    )
    profile: str = Field("instruct-cpu", description="astra-serve profile of every model")
    serve: dict[str, Any] = Field(
        default_factory=dict,
        description="overrides of the profile for the eval servers, e.g. {engine: hf, device: "
        "cuda} where vLLM is not installed",
    )
    arenas: GenSpec = Field(default_factory=GenSpec)
    reasoning: bool = Field(False, description="reference trajectories carry reasoning")
    sft_recipe: Path = Field(RECIPES / "sft-smollm2-cpu.yaml", description="SFT recipe")
    sft: dict[str, Any] = Field(default_factory=dict, description="overrides of the SFT recipe")
    rl_recipe: Path = Field(RECIPES / "rl-smollm2-cpu.yaml", description="RL recipe")
    rl: dict[str, Any] = Field(default_factory=dict, description="overrides of the RL recipe")
    eval: EvalSettings = Field(default_factory=EvalSettings)
    ablation: AblationSettings = Field(default_factory=AblationSettings)

    @field_validator("serve")
    @classmethod
    def _serve_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        from serving.server import ServeConfig

        own = {"model", "port", "served_model_name", "log_file"}
        bad = sorted(k for k in v if k in own or k not in ServeConfig.model_fields)
        if bad:
            raise ValueError(
                f"{', '.join(bad)} cannot be set here: the experiment sets model, port, name "
                "and log; the rest must be astra-serve config fields"
            )
        return v

    def fingerprint(self) -> dict[str, Any]:
        """What the results depend on: all but where they go and how fast evals run (no
        ``serve`` when it is empty: experiments started before it existed still match)."""
        data = self.model_dump(
            mode="json", exclude={"out"} | ({"serve"} if not self.serve else set())
        )
        data["eval"].pop("concurrency")
        if data["eval"]["bfcl_half"] is None:  # experiments started before it existed match
            data["eval"].pop("bfcl_half")
        if not self.ablation.rewards:  # the same
            data.pop("ablation")
        for key in ("sft_recipe", "rl_recipe"):
            data[key] = read_mapping(getattr(self, key))
        return data


def load_experiment(path: Path | None, overrides: dict[str, Any]) -> ExperimentConfig:
    from astra_agent.config import load_config

    return load_config(ExperimentConfig, path, overrides, env_prefix="ASTRA_TABLE2_")
