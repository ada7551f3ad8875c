"""One RL step's batch, backend-neutral: Adaptive Batch Filling over arena rollouts.

:class:`BatchCollector` draws tasks (seeded, resumable), rolls out a group of episodes per
task through :func:`~training.rl.rollout.rollout_group`, feeds the groups to the
:class:`~training.rl.core.AdaptiveBatchFiller` until it holds ``batch_groups`` valid groups,
and returns them with their GRPO advantages and the step's statistics. The TRL backend turns
the batch into tensors; a held-out evaluation uses the same rollouts at temperature 0.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from astra_agent.arena import ArenaTask, LoadReport, load_arena_file
from astra_agent.errors import ConfigError
from training.rl.config import RLConfig
from training.rl.core import AdaptiveBatchFiller, Group, group_advantages
from training.rl.generate import TokenGenerator
from training.rl.rollout import (
    EnvFactory,
    Episode,
    GroupResult,
    RolloutSettings,
    TaskSampler,
    rollout_group,
)

log = logging.getLogger(__name__)


def load_tasks(paths: list[Any], *, what: str = "training") -> tuple[list[ArenaTask], list[str]]:
    """The tasks of every file; records that fail to load are skipped, each with its reason
    (returned). No task at all is a ConfigError."""
    tasks: list[ArenaTask] = []
    skipped: list[str] = []
    for p in paths:
        report: LoadReport = load_arena_file(p)
        bad = {e.index for e in report.errors}
        skipped += [f"{p}: {e}" for e in report.errors]
        tasks += [t for t in report.tasks if t.index not in bad]
    if skipped:
        log.warning("%d %s record problem(s); first: %s", len(skipped), what, skipped[0])
    if not tasks:
        raise ConfigError(
            f"no loadable {what} task in {', '.join(map(str, paths))}",
            hint="check the records with `astra-eval arenas validate FILE`",
        )
    return tasks, skipped


@dataclass
class StepBatch:
    """The groups a step trains on (group-major episodes), their advantages, statistics."""

    step: int
    groups: list[GroupResult]
    advantages: list[float]
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def episodes(self) -> list[Episode]:
        return [e for g in self.groups for e in g.episodes]


def _episode_stats(episodes: list[Episode]) -> dict[str, Any]:
    n = max(len(episodes), 1)
    tokens = [e.trajectory.tokens for e in episodes if e.trajectory.tokens is not None]
    checked = [t for t in tokens if t.rerender_match is not None]
    return {
        "reward_mean": sum(e.score for e in episodes) / n,
        "solved": sum(1 for e in episodes if e.reward and e.reward.fully_solved) / n,
        "episode_errors": sum(1 for e in episodes if e.error),
        "sampled_tokens": sum(t.sampled_tokens for t in tokens),
        "response_tokens": sum(len(t.response_ids) for t in tokens),
        "prompt_tokens": sum(len(t.prompt_ids) for t in tokens),
        "rerender_mismatches": sum(1 for t in checked if not t.rerender_match),
        "rerender_checked": len(checked),
        "model_s": sum(e.trajectory.timings.model_s for e in episodes),
        "tools_s": sum(e.trajectory.timings.tools_s for e in episodes),
        "turns_mean": sum(e.trajectory.steps for e in episodes) / n,
    }


class BatchCollector:
    """Rolls out and fills one step's batch at a time (see the module's docstring)."""

    def __init__(
        self,
        cfg: RLConfig,
        tasks: list[ArenaTask],
        tokenizer: Any,
        environment: EnvFactory,
        settings: RolloutSettings,
    ) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.environment = environment
        self.settings = settings
        self.sampler = TaskSampler(tasks, cfg.seed)
        a = cfg.abf
        self.filler = AdaptiveBatchFiller(
            cfg.batch_groups,
            delta=a.delta,
            max_age=a.max_age,
            max_flat_rounds=a.max_flat_rounds,
        )
        self.limiter = asyncio.Semaphore(cfg.rollout.concurrency)

    async def _round(
        self, generator: TokenGenerator, n: int, step: int, seed: int
    ) -> list[GroupResult]:
        tasks = [self.sampler.next() for _ in range(n)]
        return list(
            await asyncio.gather(
                *(
                    rollout_group(
                        t,
                        self.cfg.group_size,
                        generator,
                        self.tokenizer,
                        self.environment,
                        self.settings,
                        seed=seed + k,
                        step=step,
                        limiter=self.limiter,
                    )
                    for k, t in enumerate(tasks)
                )
            )
        )

    async def collect(self, generator: TokenGenerator, step: int) -> StepBatch:
        """The batch of ``step``: with ABF, rounds until ``batch_groups`` valid groups are
        held (BatchFillingStalled after too many flat rounds); without, one round."""
        t0 = time.monotonic()
        stats = self.filler.begin(step)
        sampled: list[GroupResult] = []
        seed = self.cfg.seed * 1_000_003
        if not self.cfg.abf.enabled:
            chosen = await self._round(generator, self.cfg.batch_groups, step, seed)
            sampled = chosen
            stats.sampled = len(chosen)
        else:
            while self.filler.needed:
                n = math.ceil(self.filler.needed * self.cfg.abf.oversample)
                results = await self._round(generator, n, step, seed + 7919 * stats.rounds)
                sampled += results
                self.filler.add([Group(r.task.task_id, r.rewards, r, step) for r in results])
            chosen = [g.payload for g in self.filler.take()]
        episodes = [e for g in chosen for e in g.episodes]
        labels = [i for i, g in enumerate(chosen) for _ in g.episodes]
        adv = group_advantages(
            [e.score for e in episodes],
            labels,
            eps=self.cfg.advantage_eps,
            scale=self.cfg.advantage_scale,
        )
        out = _episode_stats(episodes)
        sampled_eps = [e for g in sampled for e in g.episodes]
        out["reward_mean_sampled"] = (
            sum(e.score for e in sampled_eps) / len(sampled_eps) if sampled_eps else 0.0
        )
        out["abf"] = stats.as_dict()
        out["rollout_s"] = round(time.monotonic() - t0, 3)
        return StepBatch(step, chosen, adv, out)

    async def evaluate(self, generator: TokenGenerator, tasks: list[ArenaTask]) -> dict[str, float]:
        """Held-out tasks, once each at temperature 0, with the training reward."""
        greedy = replace(self.settings, sampling=replace(self.settings.sampling, temperature=0.0))
        results = await asyncio.gather(
            *(
                rollout_group(
                    t,
                    1,
                    generator,
                    self.tokenizer,
                    self.environment,
                    greedy,
                    seed=0,
                    step=0,
                    limiter=self.limiter,
                )
                for t in tasks
            )
        )
        eps = [e for r in results for e in r.episodes]
        n = max(len(eps), 1)
        return {
            "eval_reward": sum(e.score for e in eps) / n,
            "eval_solved": sum(1 for e in eps if e.reward and e.reward.fully_solved) / n,
            "eval_tasks": len(eps),
        }


ProgressHook = Callable[[int, int, dict[str, Any]], None]
