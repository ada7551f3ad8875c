"""Every shipped recipe loads into ``SFTConfig`` (no unknown key, every value valid)."""

from __future__ import annotations

from pathlib import Path

import pytest

from astra_agent.config import load_config, read_mapping
from training.sft.config import SFTConfig

RECIPES = Path(__file__).resolve().parents[2] / "training" / "recipes"
SHIPPED = sorted(RECIPES.glob("*.yaml"))


def test_the_recipes_are_shipped() -> None:
    assert "sft-tiny-cpu.yaml" in {p.name for p in SHIPPED}


@pytest.mark.parametrize("recipe", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_recipe_validates(recipe: Path) -> None:
    cfg = load_config(SFTConfig, recipe, environ={})
    # every key written in the file is a field (extra=forbid), and it is the value used
    raw = read_mapping(recipe)
    assert set(raw) <= set(SFTConfig.model_fields)
    assert cfg.backend == raw.get("backend", "trl")
    assert cfg.global_batch_size % cfg.micro_batch_size == 0


def test_the_tiny_recipe_trains_on_cpu_with_trl() -> None:
    cfg = load_config(SFTConfig, RECIPES / "sft-tiny-cpu.yaml", environ={})
    assert cfg.backend == "trl" and cfg.trl.device == "cpu" and cfg.trl.dtype == "float32"
    assert cfg.max_steps and cfg.convert.enabled and cfg.lr_scheduler == "cosine"
