"""The RL algorithm core: hand-computed values, verl's core_algos on the same tensors, ABF."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from training.rl.core import (
    AdaptiveBatchFiller,
    BatchFillingStalled,
    Group,
    group_advantages,
    policy_loss,
    reward_std,
)

# ---------------------------------------------------------------------------- advantages


def test_group_advantages_by_hand() -> None:
    # group a: [1, 0] → mean 0.5, unbiased std √0.5; group b: [0.5, 0.5, 0.5] → std 0
    adv = group_advantages([1.0, 0.0, 0.5, 0.5, 0.5], ["a", "a", "b", "b", "b"], eps=1e-6)
    s = math.sqrt(0.5)
    assert adv[0] == pytest.approx(0.5 / (s + 1e-6))
    assert adv[1] == pytest.approx(-0.5 / (s + 1e-6))
    assert adv[2:] == [0.0, 0.0, 0.0]
    # no scaling (Dr. GRPO): reward minus mean
    assert group_advantages([1.0, 0.0], [0, 0], scale="none") == [0.5, -0.5]
    # a group of one: mean 0, std 1 (as verl)
    assert group_advantages([0.7], ["x"]) == [pytest.approx(0.7 / (1 + 1e-6))]
    with pytest.raises(ValueError):
        group_advantages([1.0], [0, 1])


@pytest.mark.parametrize("scale", ["std", "none"])
def test_group_advantages_match_verl(scale: str) -> None:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, generator=gen).round(decimals=1)
    index = np.array([i // 4 for i in range(24)], dtype=object)
    mask = torch.ones(24, 5)
    token_rewards = torch.zeros(24, 5)
    token_rewards[:, -1] = rewards
    ref, _ = compute_grpo_outcome_advantage(
        token_rewards, mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=scale == "std"
    )
    ours = group_advantages(rewards.tolist(), list(index), eps=1e-6, scale=scale)  # type: ignore[arg-type]
    assert torch.allclose(ref[:, 0], torch.tensor(ours), atol=1e-5)


# ---------------------------------------------------------------------------- loss


def _tensors(seed: int = 0, b: int = 6, t: int = 9) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(b, t, generator=gen) > 0.3).float()
    mask[0] = 0  # a sequence with nothing to train
    return {
        "logp": -torch.rand(b, t, generator=gen) * 3,
        "old": -torch.rand(b, t, generator=gen) * 3,
        "adv": torch.randn(b, generator=gen),
        "mask": mask,
    }


def test_policy_loss_by_hand() -> None:
    # two tokens: ratio e^0.5 with A=+1 (clipped at 1.28), ratio e^-0.5 with A=-1 (clipped at 0.8)
    logp = torch.tensor([[0.0, 0.0, 0.0]])
    old = torch.tensor([[-0.5, 0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, st = policy_loss(logp, old, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.28)
    # A=+1: max(-1.6487, -1.28) = -1.28 ; second token A=+1 too, ratio 0.6065: max(-0.6065,-0.8)
    assert loss.item() == pytest.approx((-1.28 + -math.exp(-0.5)) / 2, abs=1e-6)
    assert st.tokens == 2 and st.clip_fraction == pytest.approx(0.5)
    # the denominator is the batch's token count when given (micro-batch of a larger batch)
    loss2, _ = policy_loss(logp, old, torch.tensor([1.0]), mask, clip_high=0.28, num_tokens=8)
    assert loss2.item() == pytest.approx(loss.item() * 2 / 8)


def test_token_mean_weighs_every_token_alike() -> None:
    """A long sequence counts by its tokens, not as one sequence (batch-level token mean)."""
    logp = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1.0, 0, 0, 0], [1.0, 1, 1, 1]])
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([1.0, 1.0]), mask)
    loss.backward()
    assert logp.grad is not None
    # every trained token gets the same gradient (−A/5), the short sequence's included
    assert torch.allclose(logp.grad[mask.bool()], torch.full((5,), -0.2))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_policy_loss_matches_verl(seed: int) -> None:
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    x = _tensors(seed)
    adv_tok = x["adv"].unsqueeze(1).expand_as(x["logp"])
    config = SimpleNamespace(
        clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
        global_batch_info={}, get=lambda k, d=None: 3.0 if k == "clip_ratio_c" else d,
    )  # fmt: skip
    ref, metrics = compute_policy_loss_vanilla(
        x["old"], x["logp"], adv_tok, x["mask"], loss_agg_mode="token-mean", config=config
    )
    ours, st = policy_loss(
        x["logp"], x["old"], x["adv"], x["mask"], clip_low=0.2, clip_high=0.28, dual_clip=3.0
    )
    assert ours.item() == pytest.approx(ref.item(), abs=1e-6)
    assert st.clip_fraction == pytest.approx(metrics["actor/pg_clipfrac"], abs=1e-6)
    assert st.approx_kl == pytest.approx(metrics["actor/ppo_kl"], abs=1e-6)


def test_micro_batches_sum_to_the_batch_token_mean() -> None:
    x = _tensors(3, b=8)
    whole, _ = policy_loss(x["logp"], x["old"], x["adv"], x["mask"])
    total = float(x["mask"].sum())
    parts = [
        policy_loss(x["logp"][i : i + 2], x["old"][i : i + 2], x["adv"][i : i + 2],
                    x["mask"][i : i + 2], num_tokens=total)[0]
        for i in range(0, 8, 2)
    ]  # fmt: skip
    assert sum(p.item() for p in parts) == pytest.approx(whole.item(), abs=1e-6)


# ---------------------------------------------------------------------------- ABF


def _g(key: str, rewards: list[float], step: int = 1) -> Group:
    return Group(key, rewards, payload=key, step=step)


def test_abf_keeps_varied_groups_and_buffers_surplus() -> None:
    f = AdaptiveBatchFiller(2, delta=0.1, max_age=1)
    f.begin(1)
    assert f.needed == 2
    # flat groups (all equal, or std 0.05 ≤ δ) are dropped; valid ones count
    assert f.add([_g("flat", [1, 1, 1, 1]), _g("near", [0.5, 0.6]), _g("ok", [0, 1])]) == 1
    assert f.needed == 1
    assert f.add([_g("a", [0, 0.5]), _g("b", [1, 0]), _g("c", [0.2, 0.9])]) == 3
    assert f.needed == 0
    batch = f.take()
    assert [g.key for g in batch] == ["ok", "a"]
    s = f.stats
    assert (s.sampled, s.valid, s.dropped_flat, s.buffered, s.rounds) == (6, 4, 2, 2, 2)
    # next step: the two buffered groups fill the batch without any rollout
    f.begin(2)
    assert f.needed == 0
    assert [g.key for g in f.take()] == ["b", "c"]
    assert f.stats.from_buffer == 2 and f.stats.buffered == 0


def test_abf_drops_stale_groups() -> None:
    f = AdaptiveBatchFiller(1, max_age=1)
    f.begin(1)
    f.add([_g("x", [0, 1], 1), _g("y", [0, 1], 1)])
    f.take()
    f.begin(3)  # two steps later: y is older than max_age
    assert f.stats.dropped_stale == 1 and f.needed == 1


def test_abf_stops_after_flat_rounds() -> None:
    f = AdaptiveBatchFiller(1, max_flat_rounds=3)
    f.begin(1)
    f.add([_g("a", [1, 1])])
    f.add([_g("b", [0, 0])])
    with pytest.raises(BatchFillingStalled, match="3 rounds in a row"):
        f.add([_g("c", [0.5, 0.5])])


def test_abf_buffer_is_bounded() -> None:
    f = AdaptiveBatchFiller(1, max_buffer=2)
    f.begin(1)
    f.add([_g(str(i), [0, 1]) for i in range(6)])
    f.take()
    assert f.stats.buffered == 2 and f.stats.dropped_stale == 3


def test_reward_std_is_the_population_std() -> None:
    assert reward_std([0, 1]) == 0.5
    assert reward_std([]) == 0.0


def test_a_steps_rollout_figures_count_failed_episodes_by_reason() -> None:
    """A researcher reading metrics.jsonl sees why episodes failed, not only how many."""
    from astra_agent.trajectory import Trajectory
    from training.metrics import ABFStats
    from training.rl.batch import _rollouts
    from training.rl.rollout import Episode

    why = "model error: the chat template or tokenizer failed on the messages: " + "x" * 300
    eps = [Episode("a", Trajectory(), None, why), Episode("b", Trajectory(), None, why),
           Episode("c", Trajectory(), None, "reward failed: KeyError: 'x'"),
           Episode("d", Trajectory(), None)]  # fmt: skip
    abf = ABFStats(step=1, sampled=1, valid=1, dropped_flat=0, from_buffer=0, dropped_stale=0,
                   buffered=0, rounds=1, mean_reward_sampled=0.0)  # fmt: skip
    out = _rollouts(eps, eps, abf, 0.1)
    assert out.episode_errors == 3
    assert out.episode_error_reasons == {why[:160]: 2, "reward failed: KeyError: 'x'": 1}
    assert _rollouts(eps[3:], eps[3:], abf, 0.1).episode_error_reasons == {}
