"""Adaptive Batch Filling for ``backend: verl``: verl 0.9.1's V1 replay-buffer sampler,
``trainer.v1.sampler.custom_sampler`` = ``AstraABFReplayBuffer`` (this module's, built lazily
from verl's ``ReplayBuffer`` on first access: it imports verl's trainer, which config generation
does not need). :mod:`training.rl.verl` writes the overrides that name it.

Why this plug point: in verl 0.9.1 ``main_ppo`` runs the V1 trainer, where rollouts land in a
TransferQueue and the replay buffer's ``sample`` decides which finished prompt groups form the
batch; it is the one place that sees every group's rewards before training, may evict groups
and refill prompts (``refill_fn``), and lives across steps, and verl exposes it as a plugin
(``trainer.v1.sampler.custom_sampler``) built with our ``sampler_kwargs``. The alternatives
fall short: ``data.sampler.class_path`` only orders dataset indices (it never sees a reward,
and the V1 trainer ignores it), verl's ``filter_groups`` drops zero-std groups only and, in
sync mode, discards the surplus instead of buffering it, and a trainer subclass would copy
verl's step loop. Sync mode only: ABF waits for each round to finish, so nothing is in flight
when verl updates the weights. The buffer is not in verl's checkpoints: a resumed run starts
with an empty one. Buffered groups were sampled by an older policy (at most ``max_age``
steps); verl recomputes ``old_log_prob`` with the current actor, as ASTRA's ABF trains them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from astra_agent.errors import ConfigError
from training.rl.config import RLConfig

ABF_SAMPLER = "AstraABFReplayBuffer"  # this module's lazily built replay-buffer sampler


def abf_sampler_kwargs(cfg: RLConfig) -> dict[str, Any]:
    """``trainer.v1.sampler.sampler_kwargs``: the ``abf`` section (verl hands it to the
    sampler's constructor; the target is verl's batch size, i.e. ``batch_groups``)."""
    return cfg.abf.model_dump(mode="json")


def session_rewards(keys: Sequence[str], scores: Sequence[float]) -> dict[str, list[float]]:
    """Rewards per prompt uid, one per session, from verl's TransferQueue keys
    ``{uid}_{session}_{index}`` and each output's summed ``rm_scores``: a session's reward is
    that of its last output (the one verl puts the score on)."""
    last: dict[tuple[str, str], tuple[int, float]] = {}
    for key, score in zip(keys, scores, strict=True):
        uid, session, index = key.split("_")
        if (uid, session) not in last or int(index) > last[uid, session][0]:
            last[uid, session] = (int(index), float(score))
    out: dict[str, list[float]] = {}
    for (uid, _session), (_, score) in sorted(
        last.items(), key=lambda kv: (kv[0][0], int(kv[0][1]))
    ):
        out.setdefault(uid, []).append(score)
    return out


def abf_metrics(stats: Any, failed: int) -> dict[str, float]:
    """A step's ABF statistics as verl metrics (``training/abf/...``); groups dropped as flat
    also under verl's own ``training/filter_groups/evicted_samples``."""
    out = {f"training/abf/{k}": float(v) for k, v in stats.as_dict().items() if k != "step"}
    out["training/abf/failed_groups"] = float(failed)
    out["training/filter_groups/evicted_samples"] = float(stats.dropped_flat)
    return out


class _ABF:
    """Adaptive Batch Filling over verl's replay buffer (``buf``: an AstraABFReplayBuffer).

    verl keeps every rollout in its TransferQueue, tagged per prompt group (pending, running,
    finished, failure) with the step it was submitted at. Per step: the filler drops buffered
    groups older than ``max_age`` (cleared from the queue); then rounds: wait until no prompt
    is in flight, classify the groups that finished (std > δ: kept in the queue, i.e.
    buffered; else cleared), and if valid groups are still missing submit
    ``ceil(missing × oversample)`` prompts through verl's ``refill_fn``; finally take
    ``batch_size`` groups, oldest first, leave the surplus buffered (bounded by the filler's
    ``max_buffer``) and hand verl the batch. ``max_flat_rounds`` rounds in a row without a
    valid group raise :class:`~training.rl.core.BatchFillingStalled`."""

    def __init__(self, buf: Any, options: Any) -> None:
        self.buf = buf
        self.options = options
        self.filler: Any = None
        self.held: set[str] = set()  # valid groups in the queue: buffered, or this step's

    def _drop(self, uids: set[str]) -> None:
        self.buf._clear_groups("train", uids)
        self.held -= uids

    def _drain(self) -> None:
        """Until no prompt of the train partition is pending or running."""
        b, last = self.buf, 0.0
        while True:
            b._sync_metadata_from_transfer_queue()
            if not (b.pending_keys["train"] or b.running_keys["train"]):
                return
            last = b._wait_for_next_poll("train", last)

    def _rewards(self, uids: set[str]) -> dict[str, list[float]]:
        from verl.trainer.ppo.v1 import replay_buffer as rb

        keys = [k for k in self.buf.partitions["train"] if k.split("_")[0] in uids]
        if not keys:
            return {}
        data = rb.tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["rm_scores"])
        return session_rewards(keys, [float(v.sum().item()) for v in data["rm_scores"]])

    def _round(self, step: int) -> tuple[list[Any], int]:
        """The groups that finished since the last round (failed ones cleared, counted)."""
        from training.rl.core import Group

        self._drain()
        b = self.buf
        new = (b.finished_keys["train"] | b.failure_keys["train"]) - self.held
        failed = new & b.failure_keys["train"]
        self._drop(failed)
        fresh = sorted(new - failed)
        rewards = self._rewards(set(fresh))
        steps = b.prompt_global_steps["train"]
        groups = [Group(u, rewards.get(u, []), step=int(steps.get(u, step))) for u in fresh]
        return groups, len(failed)

    def _filler_for(self, batch_size: int) -> Any:
        from training.rl.core import AdaptiveBatchFiller

        if self.filler is None:
            o = self.options
            self.filler = AdaptiveBatchFiller(
                batch_size, delta=o.delta, max_age=o.max_age, max_flat_rounds=o.max_flat_rounds
            )
        self.filler.target_groups = batch_size  # verl's; its buffer carries over
        return self.filler

    def sample(self, step: int, batch_size: int) -> tuple[Any, dict[str, float]]:
        filler = self._filler_for(batch_size)
        before = {g.key for g in filler.buffer}
        stats = filler.begin(step)
        self._drop(before - {g.key for g in filler.buffer})  # too old
        failed = 0
        while True:
            groups, n_failed = self._round(step)
            failed += n_failed
            try:
                filler.add(groups)
            finally:
                self._drop({g.key for g in groups if not filler.is_valid(g)})
                self.held |= {g.key for g in groups if filler.is_valid(g)}
            if filler.needed == 0:
                break
            self.buf.refill_fn(math.ceil(filler.needed * self.options.oversample))
        chosen = [g.key for g in filler.take()]
        buffered = {g.key for g in filler.buffer}
        self._drop(self.held - buffered - set(chosen))  # beyond max_buffer
        self.held = buffered
        snapshot = dict(self.buf.partitions["train"])
        return self.buf._materialize_batch("train", chosen, snapshot), abf_metrics(stats, failed)


_ABF_CLASS: type | None = None


def abf_replay_buffer_class() -> type:
    """``AstraABFReplayBuffer``: verl's V1 ``ReplayBuffer`` with Adaptive Batch Filling for the
    train partition (validation, and ``abf.enabled: false``, sample as verl does). Why this
    plug point, and what it implies: see the module docstring."""
    global _ABF_CLASS
    if _ABF_CLASS is not None:
        return _ABF_CLASS
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from training.rl.config import ABFOptions

    class AstraABFReplayBuffer(ReplayBuffer):
        def __init__(self, **kwargs: Any) -> None:  # verl passes keywords only
            super().__init__(**kwargs)
            if self.trainer_mode != "sync":
                raise ConfigError(
                    f"Adaptive Batch Filling runs in verl's sync trainer mode, not "
                    f"{self.trainer_mode!r}",
                    hint="set trainer.v1.trainer_mode=sync, or abf.enabled: false",
                )
            options = dict(kwargs.get("sampler_kwargs") or {})
            self.abf = _ABF(self, ABFOptions.model_validate(options))

        def sample(self, global_steps: int, partition_id: str, batch_size: int) -> Any:
            if partition_id != "train" or not self.abf.options.enabled:
                return super().sample(global_steps, partition_id, batch_size)
            return self.abf.sample(global_steps, batch_size)

    AstraABFReplayBuffer.__module__ = __name__
    _ABF_CLASS = AstraABFReplayBuffer
    return _ABF_CLASS


def __getattr__(name: str) -> Any:
    """``training.rl.verl_abf.AstraABFReplayBuffer`` for verl's loader, built on first access (it
    imports verl's trainer, which config generation does not need)."""
    if name == ABF_SAMPLER:
        return abf_replay_buffer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
