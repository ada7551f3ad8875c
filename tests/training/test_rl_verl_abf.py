"""Adaptive Batch Filling inside verl 0.9.1's real V1 ``ReplayBuffer``, over a real
TransferQueue on a local Ray (as verl's own ``test_replay_buffer_on_cpu.py`` runs it).

The sampler is loaded as verl's trainer loads it (``load_extern_type`` of the
``custom_sampler`` path and name our overrides write) and built with the keywords verl passes.
Around it, ``tests/training/verl_tq.py`` does what verl's sync trainer and its TransferQueue
agent-loop workers do: prompt markers, ``AgentLoopOutput.as_dict()`` fields written by a worker
thread while the sampler polls, refills through ``refill_fn``, the batch cleared after the
update. Every case the sampler must handle: flat groups dropped and refilled until the batch
is full; surplus valid groups kept in the queue for the next steps and trained oldest first;
the age bound; failed groups; a stall stopped with a clear message; validation and
``abf.enabled: false`` as verl samples.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from astra_agent.errors import ConfigError
from training.rl.core import BatchFillingStalled
from training.rl.verl import build_overrides
from training.rl.verl_abf import session_rewards

from .verl_tq import VerlSide, clear_partitions

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def sampler_cls() -> type:
    """Our sampler, loaded from what the generated overrides name, as verl's trainer does."""
    from verl.utils.import_utils import load_extern_type

    from training.rl.config import RLConfig
    from training.rl.verl import VerlRLData

    cfg = RLConfig.model_validate(
        {"backend": "verl", "model": "m", "train_files": ["t.jsonl"], "output_dir": "out"}
    )
    data = VerlRLData(train=_path("t"), heldout=None, train_rows=64, heldout_rows=0)
    overrides = dict(o.split("=", 1) for o in build_overrides(cfg, data, _path("loops.yaml")))
    path = overrides["trainer.v1.sampler.custom_sampler.path"]
    name = overrides["trainer.v1.sampler.custom_sampler.name"]
    return load_extern_type(path, name)


def _path(name: str) -> Any:
    from pathlib import Path

    return Path("/nonexistent") / name


@pytest.fixture
def verl(verl_ray: Any, sampler_cls: type) -> Iterator[Any]:
    tq = verl_ray
    sides: list[VerlSide] = []

    def make(script: list[Any], **abf: Any) -> VerlSide:
        sides.append(VerlSide(tq, sampler_cls, script, **abf))
        return sides[-1]

    try:
        yield make
    finally:
        for side in sides:
            side.close()
        clear_partitions(tq)


def _abf(metrics: dict[str, float], *names: str) -> tuple[float, ...]:
    return tuple(metrics[f"training/abf/{n}"] for n in names)


FLAT, VALID = [1.0, 1.0], [0.0, 1.0]


def test_flat_groups_are_dropped_and_refilled_until_the_batch_is_full(verl: Any) -> None:
    t = verl([FLAT, VALID, [0.5, 0.5], VALID, [0.0, 0.05], VALID, VALID])
    uids, m = t.train_step(batch_size=3, submit=4)
    # round 1: 4 prompts, 2 valid (std 0.025 ≤ δ=0.1 is flat too); refill 1, then 1 more
    assert t.refills == [1, 1] and uids == ["p1", "p3", "p5"]
    assert _abf(m, "sampled", "valid", "dropped_flat", "rounds") == (6, 3, 3, 3)
    assert m["training/filter_groups/evicted_samples"] == 3
    assert sorted(t.batch_rewards.values()) == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert t.uids_in_queue() == set()  # flat groups cleared at once, the batch after the update


def test_surplus_valid_groups_stay_queued_and_train_oldest_first(verl: Any) -> None:
    t = verl([VALID] * 5 + [FLAT, VALID], max_age=1)
    uids, m = t.train_step(batch_size=2, submit=4)
    assert uids == ["p0", "p1"] and _abf(m, "valid", "buffered", "from_buffer") == (4, 2, 0)
    assert t.uids_in_queue() == {"p2", "p3"}  # the surplus stays in verl's queue, whole
    uids, m = t.train_step(batch_size=2, submit=2)  # p4 valid, p5 flat
    assert uids == ["p2", "p3"] and _abf(m, "from_buffer", "buffered", "dropped_flat") == (2, 1, 1)
    assert t.refills == []
    t.script = [FLAT]
    uids, m = t.train_step(batch_size=1, submit=1)  # step 3: p4 (buffered at step 2) trains
    assert uids == ["p4"] and _abf(m, "from_buffer") == (1,)
    assert len(t.batch_rewards) == 2  # both of its sessions materialise from the queue


def test_buffered_groups_older_than_max_age_are_cleared(verl: Any) -> None:
    t = verl([VALID, VALID, VALID, FLAT, FLAT, VALID], max_age=1)
    t.train_step(batch_size=1, submit=3)  # step 1: p0 trains, p1 and p2 buffered
    uids, m = t.train_step(batch_size=1, submit=1)  # step 2: p1 (age 1) trains, p2 stays
    assert uids == ["p1"] and _abf(m, "dropped_stale", "buffered") == (0, 1)
    uids, m = t.train_step(batch_size=1, submit=1)  # step 3: p2 is 2 steps old: dropped
    assert _abf(m, "dropped_stale") == (1,) and uids == ["p5"]
    assert "p2" not in t.uids_in_queue()


def test_a_stall_stops_with_a_clear_message_and_leaves_nothing_queued(verl: Any) -> None:
    t = verl([FLAT] * 10, max_flat_rounds=3)
    with pytest.raises(BatchFillingStalled, match="3 rounds in a row"):
        t.train_step(batch_size=2, submit=2)
    assert t.refills == [2, 2] and t.uids_in_queue() == set()


def test_failed_groups_are_dropped_and_replaced(verl: Any) -> None:
    t = verl(["failure", VALID, VALID])
    uids, m = t.train_step(batch_size=2, submit=2)
    assert uids == ["p1", "p2"] and _abf(m, "failed_groups") == (1,)
    assert t.refills == [1] and "p0" not in t.uids_in_queue()


def test_abf_off_samples_as_verl_does(verl: Any) -> None:
    t = verl([FLAT, FLAT], enabled=False)
    uids, m = t.train_step(batch_size=2, submit=2)
    assert uids == ["p0", "p1"] and not any(k.startswith("training/abf") for k in m)


def test_async_trainer_modes_are_refused(verl: Any) -> None:
    with pytest.raises(ConfigError, match="sync trainer mode"):
        verl([], trainer_mode="separate_async")


def test_the_mean_sampled_reward_is_the_core_fillers(verl: Any) -> None:
    """The sampler's classification is the core's: population std of the group's rewards > δ."""
    from training.rl.core import reward_std

    group = [0.0, 0.0, 0.0, 0.3]
    assert reward_std(group) > 0.1
    t = verl([group], delta=0.1)
    uids, m = t.train_step(batch_size=1, submit=1)
    assert uids == ["p0"] and _abf(m, "mean_reward_sampled") == pytest.approx((0.075,))


def test_session_rewards_take_each_sessions_last_output() -> None:
    keys = ["u1_1_0", "u1_0_0", "u1_0_1", "u2_0_0"]
    assert session_rewards(keys, [0.3, 0.0, 0.9, 1.0]) == {"u1": [0.9, 0.3], "u2": [1.0]}
