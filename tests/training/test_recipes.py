"""Every shipped recipe loads into its config (``SFTConfig`` for sft-*, ``RLConfig`` for rl-*):
no unknown key, every value valid. The verl RL recipes are also validated against verl's own
config schema in tests/training/test_rl_verl.py."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import pytest

from astra_agent.config import load_config, read_mapping
from tests.training.conftest import RECIPES
from training.rl.config import RLConfig
from training.sft.config import SFTConfig

SHIPPED = sorted(RECIPES.glob("sft-*.yaml"))
RL_SHIPPED = sorted(RECIPES.glob("rl-*.yaml"))
TABLE2_SHIPPED = sorted(RECIPES.glob("table2-*.yaml"))
C = TypeVar("C", RLConfig, SFTConfig)


def test_the_recipes_are_shipped() -> None:
    names = {p.name for p in RECIPES.glob("*.yaml")}
    assert {"sft-tiny-cpu.yaml", "sft-astra-14b.yaml", "sft-astra-32b.yaml"} <= names
    assert {"rl-tiny-cpu.yaml", "rl-astra-14b.yaml", "rl-astra-32b.yaml"} <= names
    assert names == {p.name for p in SHIPPED + RL_SHIPPED + TABLE2_SHIPPED}  # no other kind
    assert TABLE2_SHIPPED


@pytest.mark.parametrize("recipe", TABLE2_SHIPPED, ids=lambda p: p.name)
def test_a_shipped_experiment_validates_with_its_sft_and_rl_recipes(recipe: Path) -> None:
    """An ``astra-train table2`` config: the experiment, and the SFT and RL recipes it writes
    (the shipped ones with its overrides) each valid as the stage will load it."""
    from astra_agent.config import deep_merge
    from training.table2.config import ExperimentConfig

    raw = read_mapping(recipe)
    cfg = load_config(ExperimentConfig, recipe, environ={})
    assert set(raw) <= set(ExperimentConfig.model_fields)
    stage = {"model": "m", "train_files": ["t.parquet"], "output_dir": "o"}
    sft = SFTConfig.model_validate(deep_merge(read_mapping(cfg.sft_recipe), {**stage, **cfg.sft}))
    rl = RLConfig.model_validate(deep_merge(read_mapping(cfg.rl_recipe), {**stage, **cfg.rl}))
    # where the eval servers are the harness's transformers server (no vLLM), so is rollout
    engine = "hf" if cfg.serve.get("engine") == "hf" else "vllm"
    assert sft.trl.dtype == "auto" and rl.rollout.engine == engine and rl.abf.enabled
    assert sft.trl.device == rl.trl.device == ("cuda" if engine == "hf" else "cpu")
    assert cfg.eval.splits == ["a", "b", "c", "heldout"] and cfg.arenas.heldout_domains is None


def load_shipped(config: type[C], recipe: Path) -> C:
    """``recipe`` loaded into ``config``: every key written in the file is a field
    (extra=forbid), and it is the value used."""
    cfg = load_config(config, recipe, environ={})
    raw = read_mapping(recipe)
    assert set(raw) <= set(config.model_fields)
    assert cfg.backend == raw.get("backend", "trl")
    return cfg


@pytest.mark.parametrize("recipe", RL_SHIPPED, ids=lambda p: p.name)
def test_a_shipped_rl_recipe_validates(recipe: Path) -> None:
    cfg = load_shipped(RLConfig, recipe)
    # one update per batch, no KL/entropy anywhere to configure; the paper's bounds
    assert (cfg.batch_groups * cfg.group_size) % cfg.micro_batch_size == 0
    assert cfg.rollout.max_turns <= 32
    if "astra-" in recipe.name:
        assert cfg.batch_groups == 256 and cfg.learning_rate == 2e-6
        assert cfg.rollout.max_prompt_tokens == 25600
        assert cfg.rollout.max_response_tokens == 49152
        assert cfg.rollout.max_turns == 32 and cfg.backend == "verl"


def test_the_tiny_rl_recipe_runs_on_cpu_with_trl() -> None:
    cfg = load_config(RLConfig, RECIPES / "rl-tiny-cpu.yaml", environ={})
    assert cfg.backend == "trl" and cfg.trl.device == "cpu" and cfg.rollout.engine == "vllm"
    assert cfg.abf.enabled and cfg.convert.enabled


@pytest.mark.parametrize("recipe", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_recipe_validates(recipe: Path) -> None:
    cfg = load_shipped(SFTConfig, recipe)
    assert cfg.global_batch_size % cfg.micro_batch_size == 0


def test_the_tiny_recipe_trains_on_cpu_with_trl() -> None:
    cfg = load_config(SFTConfig, RECIPES / "sft-tiny-cpu.yaml", environ={})
    assert cfg.backend == "trl" and cfg.trl.device == "cpu" and cfg.trl.dtype == "float32"
    assert cfg.max_steps and cfg.convert.enabled and cfg.lr_scheduler == "cosine"
