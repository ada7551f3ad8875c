"""verl's agent loop for ASTRA arenas (``astra_arena``): each sample is one episode of the one
loop (``training.rl.rollout.rollout_episode``), sampled token by token through verl's servers.

verl's agent-loop worker instantiates :class:`ArenaAgentLoop` per sample with Hydra, from the
``agent_loops.yaml`` that ``astra-train rl`` writes (which carries the run's ``RLConfig`` as
``astra_config``), and awaits ``run(sampling_params, **row)``: ``row`` holds the dataset row's
columns, our record in ``extra_info``. The loop

* parses the record (``astra_agent.arena.parse_record``), and takes an arena environment for it
  from this process's :class:`~training.rl.pool.SandboxPool` (one per worker process and event
  loop; its ``max_live`` bounds the episodes in flight at ``rollout.concurrency``);
* wraps ``server_manager.generate(request_id, prompt_ids=…, sampling_params=…) → TokenOutput``
  as a :class:`~training.rl.generate.TokenGenerator` (:class:`ServerManagerGenerator`), so the
  token policy samples exactly the ids verl trains;
* returns ``AgentLoopOutput``: the episode's prompt ids, response ids (sampled tokens mask 1,
  tool results and turn headers mask 0), the sampler's log-probs, ``reward_score`` = ASTRA's F1
  (so verl's reward workers are skipped) and ``extra_fields["reward_extra_info"]`` (recall,
  precision, tool calls, …: the same keys for every sample, as verl stacks them per key).

A record that does not parse or whose tools fail to load gets reward 0 with the reason in
``reward_extra_info["error"]``, not a crash; so does a prompt over ``max_prompt_tokens``. An
infrastructure failure (no sandbox can start, the server is gone) raises: verl marks the
group failed, and Adaptive Batch Filling drops it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import weakref
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from astra_agent.arena import ArenaTask, parse_record
from astra_agent.episode import EpisodeLimits
from astra_agent.errors import ServerError
from astra_agent.sandbox import SandboxLimits
from serving.sampling import FinishReason, Sample, Sampling
from training.rl.config import RLConfig
from training.rl.policy import encode, render, stop_token_ids
from training.rl.pool import SandboxPool
from training.rl.rollout import Episode, RolloutSettings, rollout_episode, settings_of
from training.rl.verl import AGENT_NAME, RECORD_FIELDS

log = logging.getLogger(__name__)

REWARD_KEYS = (
    "reward", "recall", "precision", "tool_calls", "solved", "solved_subquestions",
    "required", "turns", "rerender_mismatch", "error",
)  # fmt: skip
TASK_CACHE_SIZE = 256


# --------------------------------------------------------------------------- generation


def verl_sampling_params(sampling: Sampling, verl_params: dict[str, Any]) -> dict[str, Any]:
    """Our ``Sampling`` as the ``sampling_params`` of verl's servers (vLLM's and SGLang's take
    the same keys here): the per-turn budget, the end-of-turn stop ids, log-probs on; verl's
    ``repetition_penalty`` kept. A fresh dict per call: verl's server pops keys from it."""
    params = {k: verl_params[k] for k in ("repetition_penalty",) if k in verl_params}
    params.update(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_tokens=sampling.max_tokens,
        stop_token_ids=list(sampling.stop_token_ids),
        logprobs=True,
    )
    return params


def sampling_for(base: Sampling, verl_params: dict[str, Any]) -> Sampling:
    """``base`` with verl's temperature/top-p/top-k for this call (training's, or the greedy
    validation ones from ``val_kwargs``)."""
    return replace(
        base,
        temperature=float(verl_params.get("temperature", base.temperature)),
        top_p=float(verl_params.get("top_p", base.top_p)),
        top_k=int(verl_params.get("top_k", base.top_k)),
    )


class ServerManagerGenerator:
    """verl's server manager as a :class:`~training.rl.generate.TokenGenerator`. One request id
    per episode: verl routes an id's requests to the same server (its prefix cache holds the
    episode's context)."""

    def __init__(
        self, server_manager: Any, verl_params: dict[str, Any], request_id: str = ""
    ) -> None:
        self.server_manager = server_manager
        self.verl_params = dict(verl_params)
        self.request_id = request_id or uuid4().hex
        self.versions: list[int] = []  # the policy versions (verl steps) that sampled the turns

    def version_fields(self, fallback: Any) -> dict[str, Any]:
        """``min_global_steps``/``max_global_steps`` for verl's off-policy bookkeeping (its
        TransferQueue tags and step metrics need both): the versions of the weights that
        sampled this episode, or ``fallback`` (the dataloader step) if nothing was sampled."""
        low = min(self.versions) if self.versions else fallback
        high = max(self.versions) if self.versions else fallback
        return {"min_global_steps": low, "max_global_steps": high}

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Sample:
        out = await self.server_manager.generate(
            request_id=self.request_id,
            prompt_ids=list(prompt_ids),
            sampling_params=verl_sampling_params(sampling, self.verl_params),
        )
        for key in ("min_global_steps", "max_global_steps"):
            if out.extra_fields.get(key) is not None:
                self.versions.append(int(out.extra_fields[key]))
        if out.stop_reason == "aborted":
            raise ServerError("verl aborted the generation (its servers were paused)")
        ids = [int(t) for t in out.token_ids]
        if out.log_probs is None or len(out.log_probs) != len(ids):
            raise ServerError("verl's rollout server returned no log-prob per sampled token")
        finish: FinishReason = "stop" if ids and ids[-1] in sampling.stop_token_ids else "length"
        extra = {"num_preempted": out.num_preempted} if out.num_preempted is not None else {}
        return Sample(ids, [float(x) for x in out.log_probs], finish, extra)


# --------------------------------------------------------------------------- records


_TASKS: OrderedDict[str, tuple[ArenaTask | None, str | None]] = OrderedDict()


def task_of(extra_info: dict[str, Any]) -> tuple[ArenaTask | None, str | None]:
    """The arena task of a row's ``extra_info`` (as ``training.rl.verl.verl_row`` writes it),
    or None and why not. Parsed once per record and process (a group's rollouts share it)."""
    raw = {name: extra_info.get(name) for name in RECORD_FIELDS}
    raw.update(task_id=extra_info.get("task_id"), domain=extra_info.get("domain"))
    digest = hashlib.sha256(repr(sorted(raw.items())).encode("utf-8", "surrogatepass")).hexdigest()
    if digest in _TASKS:
        _TASKS.move_to_end(digest)
        return _TASKS[digest]
    task, problems = parse_record(raw, int(extra_info.get("index") or 0))
    why = None if task else "; ".join(str(p) for p in problems if p.severity == "error")
    _TASKS[digest] = (task, why)
    while len(_TASKS) > TASK_CACHE_SIZE:
        _TASKS.popitem(last=False)
    return task, why


# --------------------------------------------------------------------------- per process


@dataclass
class _Runtime:
    settings: RolloutSettings
    pool: SandboxPool


_RUNTIMES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Runtime]] = (
    weakref.WeakKeyDictionary()
)


def _settings(
    astra_config: str | None, rollout: Any, tokenizer: Any
) -> tuple[RolloutSettings, Any]:
    """Rollout settings and sandbox options: the run's config, else verl's rollout section."""
    if astra_config:
        cfg = RLConfig.model_validate_json(astra_config)
        settings, sandbox = (
            settings_of(cfg, tokenizer),
            (cfg.sandbox, cfg.unsafe_no_sandbox, cfg.rollout.concurrency),
        )
    else:
        turns = rollout.multi_turn.max_assistant_turns or 32
        sampling = Sampling(
            max_tokens=rollout.response_length, stop_token_ids=stop_token_ids(tokenizer)
        )
        settings = RolloutSettings(EpisodeLimits(max_steps=turns), sampling, 0, 0)
        sandbox = (SandboxLimits(), False, 64)
    bounded = replace(  # what verl's tensors hold
        settings,
        max_prompt_tokens=min(
            settings.max_prompt_tokens or rollout.prompt_length, rollout.prompt_length
        ),
        max_response_tokens=min(
            settings.max_response_tokens or rollout.response_length, rollout.response_length
        ),
    )
    return bounded, sandbox


def runtime(astra_config: str | None, rollout: Any, tokenizer: Any) -> _Runtime:
    """This event loop's settings and sandbox pool (created on first use)."""
    per_loop = _RUNTIMES.setdefault(asyncio.get_running_loop(), {})
    key = astra_config or ""
    if key not in per_loop:
        settings, (limits, unsafe, concurrency) = _settings(astra_config, rollout, tokenizer)
        pool = SandboxPool(
            limits, max_idle=concurrency, max_live=concurrency, unsafe_no_sandbox=unsafe
        )
        per_loop[key] = _Runtime(settings, pool)
    return per_loop[key]


async def close_runtimes() -> None:
    """Close this event loop's sandbox pools (verl's workers never need to: sandboxes die with
    their process; tests and embedders call it)."""
    for rt in _RUNTIMES.pop(asyncio.get_running_loop(), {}).values():
        await rt.pool.aclose()


# --------------------------------------------------------------------------- outputs


def reward_extra_info(episode: Episode | None, error: str | None) -> dict[str, Any]:
    """The per-sample reward details verl logs (``REWARD_KEYS``, always all of them)."""
    r = episode.reward if episode is not None else None
    tokens = episode.trajectory.tokens if episode is not None else None
    return {
        "reward": r.reward if r else 0.0,
        "recall": r.recall if r else 0.0,
        "precision": r.precision if r else 0.0,
        "tool_calls": r.tool_calls if r else 0,
        "solved": float(r.fully_solved) if r else 0.0,
        "solved_subquestions": len(r.solved) if r else 0,
        "required": r.required if r else 0,
        "turns": episode.trajectory.steps if episode is not None else 0,
        "rerender_mismatch": int(tokens is not None and tokens.rerender_match is False),
        "error": error or "",
    }


def _pad_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)


def failed_output(
    prompt_ids: list[int], prompt_length: int, tokenizer: Any, error: str, **extra: Any
) -> AgentLoopOutput:
    """A sample with reward 0 and nothing to train: the prompt (its last ``prompt_length``
    ids) and one masked pad token (verl puts the score on the last response token)."""
    info = reward_extra_info(extra.pop("episode", None), error)
    return AgentLoopOutput(
        prompt_ids=prompt_ids[-prompt_length:],
        response_ids=[_pad_id(tokenizer)],
        response_mask=[0],
        response_logprobs=[0.0],
        reward_score=0.0,
        num_turns=int(extra.pop("num_turns", 1)),
        metrics=AgentLoopMetrics(),
        extra_fields={"reward_extra_info": info, **extra},
    )


def episode_output(
    episode: Episode, prompt_length: int, response_length: int, tokenizer: Any
) -> AgentLoopOutput:
    """The episode's tokens as verl's output (the response cut at ``response_length``: a
    last tool result may run past it). No sampled token, or a prompt over ``prompt_length``,
    is a :func:`failed_output`."""
    traj, tokens = episode.trajectory, episode.trajectory.tokens
    extra = {"task_id": episode.task_id, "termination": traj.termination}
    if tokens is None or not tokens.sampled_tokens or len(tokens.prompt_ids) > prompt_length:
        why = episode.error or traj.termination_detail or f"no token sampled ({traj.termination})"
        ids = tokens.prompt_ids if tokens is not None else []
        return failed_output(ids, prompt_length, tokenizer, why, episode=episode, **extra)
    cut = len(tokens.response_ids) > response_length
    return AgentLoopOutput(
        prompt_ids=list(tokens.prompt_ids),
        response_ids=tokens.response_ids[:response_length],
        response_mask=tokens.response_mask[:response_length],
        response_logprobs=tokens.logprobs[:response_length],
        reward_score=episode.score,
        num_turns=len(traj.messages),
        metrics=AgentLoopMetrics(
            generate_sequences=traj.timings.model_s, tool_calls=traj.timings.tools_s
        ),
        extra_fields={
            "reward_extra_info": reward_extra_info(episode, episode.error),
            "response_truncated": cut,
            **extra,
        },
    )


# --------------------------------------------------------------------------- the agent loop


@register(AGENT_NAME)
class ArenaAgentLoop(AgentLoopBase):
    """One arena episode per sample (see the module's docstring). ``astra_config``: the run's
    ``RLConfig`` as JSON (``agent_loops.yaml``); without it, verl's rollout section bounds the
    episode and sandboxes get default limits."""

    def __init__(self, *args: Any, astra_config: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.astra_config = astra_config

    def _prompt_ids(self, kwargs: dict[str, Any], task: ArenaTask | None) -> list[int]:
        messages = list(task.prompt) if task else list(kwargs.get("raw_prompt") or [])
        tools = [t.to_openai() for t in task.tools] if task else None
        return encode(
            self.tokenizer, render(self.tokenizer, messages, tools, generation_prompt=True)
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        generator = ServerManagerGenerator(self.server_manager, sampling_params)
        out = await self._episode(generator, sampling_params, kwargs)
        step = kwargs.get("global_steps")
        out.extra_fields.update(generator.version_fields(int(step) if step is not None else 0))
        return out

    async def _episode(
        self, generator: ServerManagerGenerator, sampling_params: dict[str, Any], kwargs: Any
    ) -> AgentLoopOutput:
        rt = runtime(self.astra_config, self.rollout_config, self.tokenizer)
        prompt_length = int(self.rollout_config.prompt_length)
        task, why = task_of(dict(kwargs.get("extra_info") or {}))
        if task is None:
            log.warning("sample skipped (reward 0): %s", why)
            return failed_output(
                self._prompt_ids(kwargs, None), prompt_length, self.tokenizer, why or ""
            )
        async with rt.pool.environment(task) as env:
            if env.sandbox.load_errors:
                errors = "; ".join(f"{k}: {v}" for k, v in sorted(env.sandbox.load_errors.items()))
                why = f"tools failed to load: {errors}"
                log.warning("task %s skipped (reward 0): %s", task.task_id, why)
                ids = self._prompt_ids(kwargs, task)
                return failed_output(ids, prompt_length, self.tokenizer, why, task_id=task.task_id)
            settings = replace(
                rt.settings, sampling=sampling_for(rt.settings.sampling, sampling_params)
            )
            episode = await rollout_episode(task, generator, self.tokenizer, env, settings)
        return episode_output(
            episode, prompt_length, int(self.rollout_config.response_length), self.tokenizer
        )
