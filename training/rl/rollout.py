"""Arena rollouts for RL: the one episode loop with a token-level policy, and the reward.

:func:`rollout_episode` is what both backends run per sample (TRL's trainer here, verl's
agent loop on a cluster): ``run_episode`` with a :class:`~training.rl.policy.TokenPolicy` over
any token generator, in an arena ``Environment``; the trajectory carries the episode's tokens
(``trajectory.tokens``) and the reward is ASTRA's F1 over sub-questions
(``astra_agent.arena.trajectory_reward``). A reward that cannot be computed is an error on the
episode, never a crash of the step. :func:`rollout_group` runs one prompt's group.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from astra_agent.arena import ArenaTask, Reward, trajectory_reward
from astra_agent.environment import Environment
from astra_agent.episode import EpisodeLimits, run_episode
from astra_agent.trajectory import Trajectory
from serving.sampling import Sampling
from training.rl.config import RLConfig
from training.rl.generate import TokenGenerator
from training.rl.policy import TokenPolicy

Objective = Literal["f1", "recall", "precision"]
log = logging.getLogger(__name__)

RewardFn = Callable[[ArenaTask, Trajectory], Reward]
EnvFactory = Callable[[ArenaTask], AbstractAsyncContextManager[Environment]]


@dataclass(frozen=True)
class RolloutSettings:
    """Everything an episode's rollout needs besides the task, the generator and the env."""

    limits: EpisodeLimits
    sampling: Sampling
    max_prompt_tokens: int
    max_response_tokens: int
    objective: Objective = "f1"  # which part of the reward trains (RLConfig.reward)


def settings_of(cfg: RLConfig, tokenizer: Any = None) -> RolloutSettings:
    """The rollout settings of a config (``tokenizer``: for the stop tokens; optional)."""
    r = cfg.rollout
    sampling = Sampling(
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_tokens=r.max_tokens_per_turn,
    )
    if tokenizer is not None:
        from training.rl.policy import stop_token_ids

        sampling = replace(sampling, stop_token_ids=stop_token_ids(tokenizer))
    limits = EpisodeLimits(
        max_steps=r.max_turns,
        tool_timeout_s=r.tool_timeout_s,
        max_tool_output_chars=r.max_tool_output_chars,
    )
    return RolloutSettings(
        limits, sampling, r.max_prompt_tokens, r.max_response_tokens, objective=cfg.reward
    )


@dataclass
class Episode:
    """One rollout: its trajectory (``trajectory.tokens`` set), reward, or why it has none."""

    task_id: str
    trajectory: Trajectory
    reward: Reward | None
    error: str | None = None
    objective: Objective = "f1"

    @property
    def score(self) -> float:
        """The reward used for training: ASTRA's F1 (``objective`` "f1"), or its recall or
        precision alone (the paper's ablation); 0.0 when it could not be computed."""
        if self.reward is None:
            return 0.0
        return (
            self.reward.reward if self.objective == "f1" else getattr(self.reward, self.objective)
        )

    @property
    def trainable(self) -> bool:
        """Has sampled tokens to train on."""
        t = self.trajectory.tokens
        return t is not None and t.sampled_tokens > 0


def episode_seed(base: int, *parts: object) -> int:
    """A deterministic 31-bit seed from the run's seed and the episode's coordinates."""
    text = ":".join(str(p) for p in (base, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") >> 1


async def rollout_episode(
    task: ArenaTask,
    generator: TokenGenerator,
    tokenizer: Any,
    env: Environment,
    settings: RolloutSettings,
    *,
    reward_fn: RewardFn = trajectory_reward,
    seed: int | None = None,
) -> Episode:
    """One episode of ``task`` sampled token by token; never raises for model, tool or
    reward failures (they are in the episode)."""
    sampling = settings.sampling if seed is None else replace(settings.sampling, seed=seed)
    policy = TokenPolicy(
        generator,
        tokenizer,
        sampling=sampling,
        max_prompt_tokens=settings.max_prompt_tokens,
        max_response_tokens=settings.max_response_tokens,
    )
    traj = await run_episode(
        policy, env, list(task.prompt), limits=settings.limits, tools=list(task.tools)
    )
    traj.tokens = policy.record(traj.messages, traj.tools)
    traj.metadata.update(task_id=task.task_id, domain=task.domain)
    try:
        reward: Reward | None = reward_fn(task, traj)
        error = None
    except Exception as exc:  # a broken reward function must not end the step
        log.warning("reward of %s failed: %s: %s", task.task_id, type(exc).__name__, exc)
        reward, error = None, f"reward failed: {type(exc).__name__}: {exc}"
    if error is None and traj.termination == "model_error":
        error = f"model error: {traj.termination_detail}"
    return Episode(task.task_id, traj, reward, error, objective=settings.objective)


@dataclass
class GroupResult:
    """One prompt's group of rollouts, and the wall time it took."""

    task: ArenaTask
    episodes: list[Episode]
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rewards(self) -> list[float]:
        return [e.score for e in self.episodes]


async def rollout_group(
    task: ArenaTask,
    size: int,
    generator: TokenGenerator,
    tokenizer: Any,
    environment: EnvFactory,
    settings: RolloutSettings,
    *,
    seed: int,
    step: int,
    limiter: asyncio.Semaphore | None = None,
    reward_fn: RewardFn = trajectory_reward,
) -> GroupResult:
    """``size`` episodes of ``task``, concurrently (bounded by ``limiter``), each in an
    environment of its own from ``environment(task)`` (a pool's, or a fresh one)."""
    t0 = time.monotonic()

    async def one(k: int) -> Episode:
        async with _maybe(limiter), environment(task) as env:
            s = episode_seed(seed, step, task.task_id, task.index, k)
            return await rollout_episode(
                task, generator, tokenizer, env, settings, reward_fn=reward_fn, seed=s
            )

    episodes = await asyncio.gather(*(one(k) for k in range(size)))
    return GroupResult(task, list(episodes), time.monotonic() - t0)


class _Null:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


def _maybe(sem: asyncio.Semaphore | None) -> Any:
    return sem if sem is not None else _Null()


class TaskSampler:
    """The tasks in a seeded order, reshuffled after each pass, forever; its position is
    part of a checkpoint so that a resumed run draws the same tasks."""

    def __init__(self, tasks: list[ArenaTask], seed: int) -> None:
        if not tasks:
            raise ValueError("no tasks to sample")
        self.tasks = list(tasks)
        self.seed = seed
        self.drawn = 0
        self._order: list[ArenaTask] = []

    def _epoch(self, n: int) -> list[ArenaTask]:
        import random

        order = list(self.tasks)
        random.Random(f"{self.seed}:{n}").shuffle(order)
        return order

    def next(self) -> ArenaTask:
        epoch, pos = divmod(self.drawn, len(self.tasks))
        if pos == 0 or not self._order:
            self._order = self._epoch(epoch)
        self.drawn += 1
        return self._order[pos]

    def state(self) -> dict[str, int]:
        return {"drawn": self.drawn}

    def load(self, state: dict[str, int]) -> None:
        self.drawn = int(state.get("drawn", 0))
        self._order = []
