"""One RL step's batch, backend-neutral: Adaptive Batch Filling over arena rollouts.

:class:`BatchCollector` draws tasks (seeded, resumable), rolls out a group of episodes per
task through :func:`~training.rl.rollout.rollout_group`, feeds the groups to the
:class:`~training.rl.core.AdaptiveBatchFiller` until it holds ``batch_groups`` valid groups,
and returns them with their GRPO advantages and the step's statistics. The TRL backend turns
the batch into tensors; a held-out evaluation uses the same rollouts at temperature 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from astra_agent.arena import ArenaTask, LoadReport, Reward, load_arena_file, parse_record
from astra_agent.errors import AstraError, ConfigError
from astra_agent.runio import scrub_surrogates
from training.metrics import ABFStats, Heldout, RLStep, Rollouts
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


def _scrub(task: ArenaTask) -> bool:
    """Lone surrogates in what the model reads or is scored on become U+FFFD
    (:func:`~astra_agent.runio.scrub_surrogates`, as the sandbox does with tool output). True
    if the task held any."""
    prompt, sub_qa = scrub_surrogates(task.prompt), scrub_surrogates(task.sub_qa)
    tools = [
        replace(
            t,
            description=scrub_surrogates(t.description),
            parameters=scrub_surrogates(t.parameters),
        )
        for t in task.tools
    ]
    if (prompt, tools, sub_qa) == (task.prompt, task.tools, task.sub_qa):
        return False
    task.prompt, task.tools, task.sub_qa = prompt, tools, sub_qa
    return True


def _read_jsonl_tasks(path: Path) -> tuple[list[ArenaTask], list[str]]:
    """The tasks of a JSONL file, one record a line; a line that is not UTF-8 or not JSON, or
    a record that fails to load, is skipped with its reason (``FILE:LINE: why``). Lines end at
    ``\n`` only: JSON may hold U+2028, U+0085 and the like raw inside a string, and
    ``str.splitlines`` would cut such a record in two. A record's index is its place among the
    file's non-blank lines, as in :func:`astra_agent.arena.load_arena_file` (it seeds the
    episodes and names a task without a ``task_id``)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    tasks: list[ArenaTask] = []
    skipped: list[str] = []
    index = 0
    for n, raw_line in enumerate(data.split(b"\n"), 1):
        if not raw_line.strip():
            continue
        i, index = index, index + 1
        where = f"{path}:{n}"
        try:
            line = raw_line.decode("utf-8")
            raw = json.loads(line.removeprefix("\ufeff") if n == 1 else line)
        except UnicodeDecodeError as exc:
            skipped.append(f"{where}: not UTF-8 text (byte {exc.start}: {exc.reason})")
            continue
        except (ValueError, RecursionError) as exc:  # huge integers and deep nesting too
            skipped.append(f"{where}: not a JSON record: {str(exc)[:200]}")
            continue
        if not isinstance(raw, dict):
            skipped.append(f"{where}: record {i}: not a JSON object")
            continue
        task, problems = parse_record(raw, i)
        errors = [p for p in problems if p.severity == "error"]
        if task is None or errors:
            why = "; ".join(map(str, errors)) or f"record {i}: not loaded"
            skipped.append(f"{where}: {why}")
            continue
        tasks.append(task)
    return tasks, skipped


def _load_file(path: Path) -> tuple[list[ArenaTask], list[str]]:
    if path.suffix != ".parquet" and path.is_file():
        return _read_jsonl_tasks(path)
    report: LoadReport = load_arena_file(path)  # parquet is read whole (or refused whole)
    why: dict[int, list[str]] = {}
    for e in report.errors:
        why.setdefault(e.index, []).append(str(e))
    tasks = [t for t in report.tasks if t.index not in why]
    return tasks, [f"{path}: {'; '.join(w)}" for w in why.values()]


def load_tasks(paths: list[Any], *, what: str = "training") -> tuple[list[ArenaTask], list[str]]:
    """The tasks of every file; records that fail to load (a line that is not JSON, a missing
    field, a tool source that does not compile) are skipped: one reason per skipped record is
    returned, and the count logged. A missing file, or no task at all, is a ConfigError."""
    tasks: list[ArenaTask] = []
    skipped: list[str] = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise ConfigError(
                f"{what} arena records not found: {path}"
                if not path.exists()
                else f"{what} arena records: {path} is not a file",
                hint="ASTRA-RL-1k records or our arena files (eval/arenas/data/*.jsonl)",
            )
        found, bad = _load_file(path)
        scrubbed = sum(_scrub(t) for t in found)
        if scrubbed:
            log.warning(
                "%s: %d task(s) hold lone surrogates (not valid Unicode): replaced with U+FFFD",
                path, scrubbed,
            )  # fmt: skip
        tasks += found
        skipped += bad
    if skipped:
        log.warning(
            "skipped %d %s record(s) that failed to load (%d task(s) loaded); first: %s",
            len(skipped), what, len(tasks), skipped[0],
        )  # fmt: skip
    if not tasks:
        first = f"; first: {skipped[0]}" if skipped else " (the files hold no records)"
        raise ConfigError(
            f"no loadable {what} task in {', '.join(map(str, paths))}: "
            f"{len(skipped)} record(s) failed to load{first}",
            hint="check the records with `astra-eval arenas validate FILE`",
        )
    return tasks, skipped


@dataclass
class StepBatch:
    """The groups a step trains on (group-major episodes), their advantages, statistics."""

    step: int
    groups: list[GroupResult]
    advantages: list[float]
    stats: Rollouts | None = None  # None: a batch put together by hand (tests), not rolled out

    @property
    def episodes(self) -> list[Episode]:
        return [e for g in self.groups for e in g.episodes]


def _rollouts(
    episodes: list[Episode], sampled: list[Episode], abf: ABFStats, rollout_s: float
) -> Rollouts:
    n = max(len(episodes), 1)
    scored = [e.reward for e in episodes if e.reward is not None]

    def part(get: Callable[[Reward], float]) -> float | None:
        return sum(get(r) for r in scored) / len(scored) if scored else None

    tokens = [e.trajectory.tokens for e in episodes if e.trajectory.tokens is not None]
    checked = [t for t in tokens if t.rerender_match is not None]
    return Rollouts(
        reward_mean=sum(e.score for e in episodes) / n,
        solved=sum(1 for e in episodes if e.reward and e.reward.fully_solved) / n,
        episode_errors=sum(1 for e in episodes if e.error),
        episode_error_reasons=dict(Counter(e.error[:160] for e in episodes if e.error)),
        sampled_tokens=sum(t.sampled_tokens for t in tokens),
        response_tokens=sum(len(t.response_ids) for t in tokens),
        prompt_tokens=sum(len(t.prompt_ids) for t in tokens),
        rerender_mismatches=sum(1 for t in checked if not t.rerender_match),
        rerender_checked=len(checked),
        model_s=sum(e.trajectory.timings.model_s for e in episodes),
        tools_s=sum(e.trajectory.timings.tools_s for e in episodes),
        turns_mean=sum(e.trajectory.steps for e in episodes) / n,
        reward_mean_sampled=sum(e.score for e in sampled) / len(sampled) if sampled else 0.0,
        abf=abf,
        rollout_s=rollout_s,
        f1_mean=part(lambda r: r.reward),
        recall_mean=part(lambda r: r.recall),
        precision_mean=part(lambda r: r.precision),
        calls_mean=part(lambda r: r.tool_calls),
    )


class RolloutFailed(AstraError):
    """Every episode of a rollout round failed before sampling anything (the engine is down,
    no prompt fits ``max_prompt_tokens``, the template breaks): a step of them would train on
    nothing, so the run stops and says why instead."""


def check_round(results: list[GroupResult], step: int) -> None:
    """RolloutFailed if no episode of ``results`` sampled a token and every one has an error."""
    eps = [e for g in results for e in g.episodes]
    if not eps or any(e.trainable or not e.error for e in eps):
        return
    why, n = Counter(str(e.error) for e in eps).most_common(1)[0]
    raise RolloutFailed(
        f"all {len(eps)} episodes rolled out for step {step} failed before sampling a token; "
        f"{'all' if n == len(eps) else n} with: {why}",
        hint="a prompt over max_prompt_tokens: raise rollout.max_prompt_tokens; an engine "
        "error: check the rollout engine (its log: OUTPUT_DIR/vllm.log)",
    )


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
            check_round(chosen, step)
            sampled = chosen
            stats.sampled = len(chosen)
        else:
            while self.filler.needed:
                n = math.ceil(self.filler.needed * self.cfg.abf.oversample)
                results = await self._round(generator, n, step, seed + 7919 * stats.rounds)
                check_round(results, step)
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
        out = _rollouts(
            episodes,
            [e for g in sampled for e in g.episodes],
            ABFStats(**stats.as_dict()),
            round(time.monotonic() - t0, 3),
        )
        for e in episodes:
            if e.error:  # the run goes on; the step's metrics count it and its reason
                log.warning("step %d: an episode of %s failed: %s", step, e.task_id, e.error)
        return StepBatch(step, chosen, adv, out)

    async def evaluate(self, generator: TokenGenerator, tasks: list[ArenaTask]) -> Heldout:
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
        return Heldout(
            eval_reward=sum(e.score for e in eps) / n,
            eval_solved=sum(1 for e in eps if e.reward and e.reward.fully_solved) / n,
            eval_tasks=len(eps),
        )


ProgressHook = Callable[[int, int, RLStep], None]
