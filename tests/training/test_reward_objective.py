"""The RL reward switch (``reward: f1 | recall | precision``): what an episode trains on, on
both backends (both read the rollout settings of the run's config)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from astra_agent.arena import arena_reward
from astra_agent.trajectory import Trajectory
from training.rl.config import RLConfig
from training.rl.rollout import Episode, settings_of

BASE = {"model": "m", "train_files": ["t.jsonl"], "output_dir": "out"}


def episode(objective: str) -> Episode:
    # two sub-questions, one solved, in three calls: recall 1/2, precision 1/3
    reward = arena_reward(
        {"get_a": ["A-1"], "get_b": ["B-2"]},
        [("get_a", "A-1"), ("get_a", "nothing"), ("get_c", "x")],
    )
    return Episode("t", Trajectory(), reward, objective=objective)  # type: ignore[arg-type]


def test_each_objective_trains_on_its_part_of_the_reward() -> None:
    f1 = 2 * (1 / 2) * (1 / 3) / (1 / 2 + 1 / 3)
    assert episode("f1").score == pytest.approx(f1, abs=1e-5)
    assert episode("recall").score == pytest.approx(0.5)
    assert episode("precision").score == pytest.approx(1 / 3, abs=1e-5)
    none = Episode("t", Trajectory(), None, objective="recall")
    assert none.score == 0.0  # a reward that could not be computed trains as 0


def test_the_config_carries_the_objective_to_the_rollouts() -> None:
    assert settings_of(RLConfig.model_validate(BASE)).objective == "f1"  # ASTRA's default
    cfg = RLConfig.model_validate({**BASE, "reward": "precision"})
    assert settings_of(cfg).objective == "precision"
    verl = RLConfig.model_validate({**BASE, "backend": "verl", "reward": "recall"})
    # verl's agent loop rebuilds its settings from the run's config as JSON
    again = RLConfig.model_validate_json(verl.model_dump_json())
    assert settings_of(again).objective == "recall"
    with pytest.raises(ValidationError, match="reward"):
        RLConfig.model_validate({**BASE, "reward": "accuracy"})


def test_a_step_records_astras_reward_its_parts_and_the_calls_whatever_it_trains_on() -> None:
    """The ablation compares runs by the same figures: F1, recall, precision and the calls an
    episode made, whichever of them the run trains on (an episode without a reward is left out
    of them; ``reward_mean`` is the objective's, with it as 0)."""
    from training.metrics import ABFStats
    from training.rl.batch import _rollouts

    abf = ABFStats(step=1, sampled=1, valid=1, dropped_flat=0, from_buffer=0, dropped_stale=0,
                   buffered=0, rounds=1, mean_reward_sampled=0.0)  # fmt: skip
    none = arena_reward({}, [])  # a no-call task answered with no call: all 1, 0 calls
    eps = [episode("recall"), Episode("n", Trajectory(), none, objective="recall")]
    eps.append(Episode("e", Trajectory(), None, error="model error", objective="recall"))
    r = _rollouts(eps, eps, abf, 1.0)
    f1 = 2 * (1 / 2) * (1 / 3) / (1 / 2 + 1 / 3)
    assert r.reward_mean == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert r.recall_mean == pytest.approx((0.5 + 1.0) / 2)
    assert r.precision_mean == pytest.approx((1 / 3 + 1.0) / 2, abs=1e-5)
    assert r.f1_mean == pytest.approx((f1 + 1.0) / 2, abs=1e-5)
    assert r.calls_mean == 1.5
    assert _rollouts([], [], abf, 0.0).calls_mean is None
