"""``backend: verl``: verl 0.9.1's PPO trainer (GRPO, FSDP actor, vLLM/SGLang rollouts) with our
agent loop, reward and Adaptive Batch Filling, on one node or a Ray cluster.

``run_verl(cfg)`` writes ``OUTPUT_DIR/verl/``:

* ``data/train.parquet`` (and ``data/heldout.parquet``): the arena records as verl's RL dataset
  rows (:func:`verl_row`). verl's ``RLHFDataset`` hands every column of a row to the agent loop
  as keyword arguments; the whole ASTRA-RL record rides in ``extra_info`` as JSON strings, so
  parquet's struct unification (which adds other rows' keys as nulls) cannot alter it.
* ``agent_loops.yaml``: our agent loop (``training.rl.verl_agent_loop.ArenaAgentLoop``,
  ``astra_arena``) for ``actor_rollout_ref.rollout.agent.agent_loop_config_path``, with this
  config in it, so that rollouts on the cluster use the settings the TRL backend uses.
* ``overrides.txt`` (:func:`build_overrides`, one a line), ``config.yaml`` (composed, for
  reading) and ``launch.sh`` (``python -m verl.trainer.main_ppo``, or ``ray job submit`` for
  several nodes).

and ``fingerprint.json``, once the run directory is opened and begun as the TRL backend's
(``training.verl_job.begin_run``: a run of another config refused, one that saved nothing
taken over, the run file ``OUTPUT_DIR/astra-rl.json``), so that the run directory reads as an
``astra-train rl`` run. With ``verl.run: true`` it also runs ``launch.sh``.

The overrides are checked offline against verl's own schema: Hydra compose of ``ppo_trainer``
in struct mode (an unknown key fails), verl's dataclasses for the algorithm and rollout
sections, and ``verl.utils.config.validate_config`` (what ``main_ppo`` runs first: batch sizes
against GPUs, micro batches). Any failure is a ConfigError naming it.

The reward is the agent loop's: it returns ``reward_score`` (ASTRA's F1, computed on the
episode it ran), and verl's agent-loop worker then skips its reward workers; the custom reward
function we configure (:func:`reward_from_agent_loop`) only fails loudly should a sample ever
reach it without a score.

Adaptive Batch Filling plugs in as verl's V1 replay-buffer sampler,
``trainer.v1.sampler.custom_sampler`` = ``AstraABFReplayBuffer`` (built lazily from verl's
``ReplayBuffer``: see :mod:`training.rl.verl_abf` for why this plug point).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astra_agent.arena import ArenaTask
from astra_agent.errors import AstraError, ConfigError
from training.rl.config import RLConfig
from training.rl.verl_abf import ABF_SAMPLER, abf_sampler_kwargs
from training.run import VERL_CHECKPOINTS
from training.verl_job import (
    FINGERPRINT,
    JOB_DIR,
    VerlJob,
    begin_run,
    check_device,
    check_installed,
    check_scheduler,
    check_sections,
    compose,
    data_parallel_ranks,
    hlist,
    hq,
    job_claim,
    launch_env,
    ray_job_command,
    render_launch_script,
    run_job,
    write_job_dir,
)

log = logging.getLogger(__name__)

AGENT_NAME = "astra_arena"  # the agent loop's name (agent_loops.yaml, the rows' agent_name)
DATA_SOURCE = "astra_arena"
AGENT_LOOP_TARGET = "training.rl.verl_agent_loop.ArenaAgentLoop"
CONFIG_NAME = "ppo_trainer"
SCHEDULERS = ("constant", "cosine")  # what verl's FSDP engine implements
VERL_GRPO_EPS = 1e-6  # verl's compute_grpo_outcome_advantage: not configurable
RECORD_FIELDS = ("prompt", "tool_schema", "tool_dict", "sub_qa_dict")


@dataclass(frozen=True)
class VerlRLData:
    """verl's RL parquet files written from the arena records, and what was skipped."""

    train: Path
    heldout: Path | None
    train_rows: int
    heldout_rows: int
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class VerlRLJob(VerlJob):
    """The verl job of ``astra-train rl``: also its data and its agent loop file."""

    data: VerlRLData
    agent_loop_file: Path


# --------------------------------------------------------------------------- data


def _text(value: Any) -> str:
    """A record field as the JSON string the ASTRA-RL format stores (decoded ones re-encoded)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def verl_row(task: ArenaTask, index: int, split: str) -> dict[str, Any]:
    """One row of verl's RL dataset. ``prompt`` (chat messages, for verl's ``raw_prompt``),
    ``data_source``, ``agent_name`` (picks our agent loop per sample) and ``reward_model``
    are what verl reads; ``extra_info`` carries the record itself (``index``: verl's sample
    index), parsed again by the agent loop with ``astra_agent.arena.parse_record``."""
    raw = task.raw
    messages = [
        {"role": str(m["role"]), "content": str(m.get("content") or "")} for m in task.prompt
    ]
    extra = {"index": index, "split": split, "task_id": task.task_id, "domain": task.domain}
    extra.update({name: _text(raw[name]) for name in RECORD_FIELDS})
    return {
        "data_source": DATA_SOURCE,
        "agent_name": AGENT_NAME,
        "prompt": messages,
        "ability": "tool_use",
        "reward_model": {"style": "agent_loop", "ground_truth": json.dumps(task.sub_qa)},
        "extra_info": extra,
    }


@dataclass(frozen=True)
class _Rows:
    train: list[dict[str, Any]]
    heldout: list[dict[str, Any]] | None
    skipped: tuple[str, ...]


def arena_rows(cfg: RLConfig) -> _Rows:
    """The train (and held-out) records as verl rows; records that fail to load are skipped,
    each with its reason (logged, kept)."""
    from training.rl.batch import load_tasks

    train, skipped = load_tasks(list(cfg.train_files))
    if len(train) < cfg.batch_groups:
        raise ConfigError(
            f"{len(train)} loadable training task(s), fewer than batch_groups={cfg.batch_groups}",
            hint="verl counts an epoch as tasks // batch_groups steps: lower batch_groups",
        )
    heldout = None
    if cfg.heldout_files:
        tasks, bad = load_tasks(list(cfg.heldout_files), what="held-out")
        skipped, heldout = skipped + bad, [verl_row(t, i, "heldout") for i, t in enumerate(tasks)]
    return _Rows([verl_row(t, i, "train") for i, t in enumerate(train)], heldout, tuple(skipped))


def _data_files(rows: _Rows, data_dir: Path) -> VerlRLData:
    heldout = data_dir / "heldout.parquet" if rows.heldout is not None else None
    n_heldout = len(rows.heldout or [])
    return VerlRLData(data_dir / "train.parquet", heldout, len(rows.train), n_heldout, rows.skipped)


# --------------------------------------------------------------------------- overrides


def _check_settings(cfg: RLConfig) -> None:
    """What verl cannot honour, refused up front with the reason."""
    v = cfg.verl
    dp = data_parallel_ranks(v.nnodes, v.gpus_per_node, v.ulysses_sequence_parallel_size)
    sequences = cfg.batch_groups * cfg.group_size
    if sequences % dp:
        raise ConfigError(
            f"batch_groups × group_size = {sequences} sequences do not split over the {dp} "
            "data-parallel ranks (GPUs / ulysses size): verl would pad the batch with "
            f"{math.lcm(dp, sequences) - sequences} empty sequences each step",
            hint=f"make batch_groups × group_size a multiple of {dp}",
        )
    if v.gpus_per_node % v.tensor_model_parallel_size:
        raise ConfigError(
            f"verl.tensor_model_parallel_size={v.tensor_model_parallel_size} does not divide "
            f"gpus_per_node={v.gpus_per_node} (a rollout replica lives on one node)"
        )
    check_scheduler(cfg.lr_scheduler, SCHEDULERS)
    if not math.isclose(cfg.advantage_eps, VERL_GRPO_EPS):
        raise ConfigError(
            f"advantage_eps={cfg.advantage_eps:g}: verl's GRPO estimator fixes ε at 1e-6",
            hint="set advantage_eps: 1.0e-6 for backend: verl",
        )


def _total_epochs(cfg: RLConfig, train_rows: int) -> int:
    """Epochs that cover ``cfg.steps`` (verl stops at whichever of the two comes first)."""
    return math.ceil(cfg.steps / max(1, train_rows // cfg.batch_groups))


def _algorithm(cfg: RLConfig) -> list[str]:
    """GRPO without any KL term; ABF is the sampler's, so verl's own group filter stays off."""
    return [
        "algorithm.adv_estimator=grpo",
        f"algorithm.norm_adv_by_std_in_grpo={cfg.advantage_scale == 'std'}",
        "algorithm.use_kl_in_reward=false",
        "algorithm.filter_groups.enable=false",
        "critic.enable=false",
    ]


def _actor(cfg: RLConfig) -> list[str]:
    """The policy update: one optimizer step per batch (batch = mini-batch), token-mean loss,
    no KL or entropy term, the clip range of the config; micro-batches by token budget (one
    sequence of the longest length fits, split over the Ulysses group)."""
    v = cfg.verl
    a = "actor_rollout_ref.actor"
    seq = cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
    budget = v.ppo_micro_batch_size_per_gpu * math.ceil(seq / v.ulysses_sequence_parallel_size)
    return [
        f"{a}.strategy={v.strategy}",
        f"{a}.ppo_mini_batch_size={cfg.batch_groups}",
        f"{a}.ppo_epochs=1",
        f"{a}.use_dynamic_bsz=true",
        f"{a}.ppo_max_token_len_per_gpu={budget}",
        f"{a}.ulysses_sequence_parallel_size={v.ulysses_sequence_parallel_size}",
        f"{a}.use_kl_loss=false",
        f"{a}.entropy_coeff=0",
        f"{a}.loss_agg_mode=token-mean",
        f"{a}.clip_ratio_low={cfg.clip_low}",
        f"{a}.clip_ratio_high={cfg.clip_high}",
        f"{a}.data_loader_seed={cfg.seed}",
        f"{a}.optim.lr={cfg.learning_rate}",
        f"{a}.optim.lr_scheduler_type={cfg.lr_scheduler}",
        f"{a}.optim.lr_warmup_steps={cfg.warmup_steps}",
        f"{a}.optim.weight_decay={cfg.weight_decay}",
        f"{a}.optim.clip_grad={cfg.max_grad_norm}",
        f"{a}.fsdp_config.param_offload={v.param_offload}",
        f"{a}.fsdp_config.optimizer_offload={v.optimizer_offload}",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={budget}",
        f"actor_rollout_ref.model.path={hq(str(Path(cfg.model).absolute()))}",
    ]


def _rollout(cfg: RLConfig, agent_loops: Path) -> list[str]:
    """vLLM/SGLang servers driven by our agent loop: ``group_size`` rollouts per prompt,
    multi-turn up to ``max_turns`` model calls, the sampler's log-probs kept; held-out
    evaluation greedy, one rollout per task."""
    v, r = cfg.verl, cfg.rollout
    p = "actor_rollout_ref.rollout"
    return [
        f"{p}.name={v.rollout_name}",
        "actor_rollout_ref.rollout.mode=async",
        f"{p}.n={cfg.group_size}",
        f"{p}.temperature={r.temperature}",
        f"{p}.top_p={r.top_p}",
        f"{p}.top_k={r.top_k}",
        f"{p}.seed={cfg.seed}",
        f"{p}.tensor_model_parallel_size={v.tensor_model_parallel_size}",
        f"{p}.gpu_memory_utilization={v.gpu_memory_utilization}",
        f"{p}.max_model_len={r.max_prompt_tokens + r.max_response_tokens}",
        f"{p}.calculate_log_probs=true",
        f"{p}.multi_turn.enable=true",
        f"{p}.multi_turn.max_assistant_turns={r.max_turns}",
        f"{p}.multi_turn.format=hermes",
        f"{p}.agent.agent_loop_config_path={hq(str(agent_loops))}",
        f"{p}.agent.default_agent_loop={AGENT_NAME}",
        f"{p}.val_kwargs.temperature=0",
        f"{p}.val_kwargs.n=1",
        f"{p}.val_kwargs.do_sample=false",
    ]


def _data(cfg: RLConfig, data: VerlRLData) -> list[str]:
    """Our parquet; one prompt per dataloader fetch (``gen_batch_size=1``) so that ABF can
    refill exactly the prompts it is missing; lengths bound the whole multi-turn episode."""
    val = data.heldout or data.train  # verl always builds a validation set; unused without
    return [
        f"data.train_files={hlist([data.train])}",
        f"data.val_files={hlist([val])}",
        f"data.train_batch_size={cfg.batch_groups}",
        "data.gen_batch_size=1",
        f"data.max_prompt_length={cfg.rollout.max_prompt_tokens}",
        f"data.max_response_length={cfg.rollout.max_response_tokens}",
        "data.filter_overlong_prompts=false",  # the policy checks the prompt with its tools
        "data.return_raw_chat=true",
        "data.shuffle=true",
        f"data.seed={cfg.seed}",
        "reward.custom_reward_function.path=pkg://training.rl.verl",
        "reward.custom_reward_function.name=reward_from_agent_loop",
    ]


def _trainer(cfg: RLConfig, data: VerlRLData) -> list[str]:
    out = Path(cfg.output_dir).absolute()
    evaluate = data.heldout is not None and cfg.eval_every > 0
    return [
        "trainer.use_v1=true",
        "trainer.v1.trainer_mode=sync",
        f"trainer.total_training_steps={cfg.steps}",
        f"trainer.total_epochs={_total_epochs(cfg, data.train_rows)}",
        f"trainer.default_local_dir={hq(str(out / VERL_CHECKPOINTS))}",
        f"trainer.save_freq={cfg.save_steps}",
        f"trainer.max_actor_ckpt_to_keep={cfg.save_total_limit}",
        f"trainer.resume_mode={'auto' if cfg.resume else 'disable'}",
        f"trainer.test_freq={cfg.eval_every if evaluate else -1}",
        f"trainer.val_before_train={evaluate}",
        "trainer.project_name=astra-rl",
        f"trainer.experiment_name={hq(out.name)}",
        "trainer.logger=[console,file]",
        f"trainer.nnodes={cfg.verl.nnodes}",
        f"trainer.n_gpus_per_node={cfg.verl.gpus_per_node}",
    ]


def _sampler(cfg: RLConfig) -> list[str]:
    """ABF as verl's replay-buffer sampler; its options as ``sampler_kwargs`` (added keys)."""
    s = "trainer.v1.sampler"
    kwargs = [f"+{s}.sampler_kwargs.{k}={v}" for k, v in abf_sampler_kwargs(cfg).items()]
    return [
        f"{s}.custom_sampler.path=pkg://training.rl.verl_abf",
        f"{s}.custom_sampler.name={ABF_SAMPLER}",
        *kwargs,
    ]


def build_overrides(cfg: RLConfig, data: VerlRLData, agent_loops: Path) -> list[str]:
    """The full verl config as Hydra overrides of ``ppo_trainer``; ``verl.overrides`` last."""
    _check_settings(cfg)
    return [
        *_algorithm(cfg),
        *_actor(cfg),
        *_rollout(cfg, agent_loops),
        *_data(cfg, data),
        *_trainer(cfg, data),
        *_sampler(cfg),
        *(_cpu_overrides(cfg) if cfg.verl.device == "cpu" else []),
        *cfg.verl.overrides,
    ]


def _cpu_overrides(cfg: RLConfig) -> list[str]:
    from training.verl_cpu import rl_cpu_overrides

    return rl_cpu_overrides(cfg.verl.gpus_per_node)


# --------------------------------------------------------------------------- validation


def compose_verl_config(overrides: Sequence[str], *, check_model: bool = True) -> Any:
    """Compose ``overrides`` with verl's ``ppo_trainer`` defaults, offline and in struct mode,
    build the sections verl turns into dataclasses and run verl's own ``validate_config``.
    Unknown keys and bad values raise ConfigError naming them. ``check_model=False`` skips
    ``actor_rollout_ref.model`` (HFModelConfig loads the checkpoint; a recipe's placeholder
    path cannot pass)."""
    composed = compose(CONFIG_NAME, overrides)
    check_sections(composed, ["algorithm", "actor_rollout_ref.actor", "actor_rollout_ref.rollout"])
    _validate(composed)
    if check_model:
        check_sections(composed, ["actor_rollout_ref.model"])
    return composed


def _validate(composed: Any) -> None:
    """``main_ppo``'s first check: batch sizes against the GPUs, micro batches, sampling."""
    import warnings

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            validate_config(
                composed,
                use_reference_policy=need_reference_policy(composed),
                use_critic=need_critic(composed),
            )
    except Exception as exc:  # asserts, ValueErrors, Hydra's instantiation errors
        raise ConfigError(
            f"verl's validate_config rejects the config: {' '.join(str(exc).split())}",
            hint="batch_groups × group_size must split evenly over the GPUs",
        ) from None


# --------------------------------------------------------------------------- agent loop file


def agent_loop_yaml(cfg: RLConfig) -> str:
    """``agent_loops.yaml``: our agent loop under its name, with this config (JSON) as its
    ``astra_config`` argument; verl's workers instantiate it with Hydra."""
    from omegaconf import OmegaConf

    entry = {
        "name": AGENT_NAME,
        "_target_": AGENT_LOOP_TARGET,
        "astra_config": cfg.model_dump_json(),
    }
    return OmegaConf.to_yaml(OmegaConf.create([entry]))


# --------------------------------------------------------------------------- launch


def rl_launch_env(cfg: RLConfig) -> dict[str, str]:
    """The launch env every verl job exports (``training.verl_job.launch_env``), and where the
    launch supervisor records what it stopped when the trainer ended (``training.verl_launch``)."""
    log_file = str(Path(cfg.output_dir).absolute() / "verl-launch.log")
    return launch_env(cfg.output_dir, cfg.verl.device, ASTRA_LAUNCH_LOG=log_file)


def launch_command(cfg: RLConfig, overrides: Sequence[str], env: dict[str, str]) -> list[str]:
    """One node: ``main_ppo`` with this Python (it starts a local Ray); several: a Ray job."""
    if cfg.verl.nnodes == 1:  # under our supervisor: nothing verl starts outlives the run
        launch = [sys.executable, "-m", "training.verl_launch"]
        return [*launch, sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    return ray_job_command(cfg.verl.ray_address, env, "verl.trainer.main_ppo", overrides)


def _check_can_run(cfg: RLConfig) -> None:
    """Fail before writing anything if this machine cannot start the launch line."""
    v = cfg.verl
    if v.device == "cpu" and v.nnodes > 1:
        raise ConfigError("verl.device: cpu runs on one node", hint="set verl.nnodes: 1")
    if v.nnodes > 1:
        if shutil.which("ray") is None:
            raise ConfigError("verl.run on several nodes needs the `ray` CLI on PATH")
        return
    check_device(v.device, v.gpus_per_node, "PPO trainer (FSDP engine, vLLM/SGLang servers)")


def prepare_verl(cfg: RLConfig) -> VerlRLJob:
    """Validate everything, then write OUTPUT_DIR/verl (data, agent loop, overrides, composed
    config, launch.sh) in one rename: nothing is written for a config verl would refuse."""
    from omegaconf import OmegaConf

    out = Path(cfg.output_dir).absolute()
    workdir = out / JOB_DIR
    check_installed("verl", "TransferQueue")  # verl's V1 trainer keeps its rollouts there
    _check_settings(cfg)
    if cfg.verl.run:
        _check_can_run(cfg)
    rows = arena_rows(cfg)
    data = _data_files(rows, workdir / "data")
    agent_loops = workdir / "agent_loops.yaml"
    overrides = build_overrides(cfg, data, agent_loops)
    model_here = cfg.verl.run or Path(cfg.model).exists()  # else: a path on the cluster
    composed = compose_verl_config(overrides, check_model=model_here)
    if not model_here:
        log.warning("model %s is not on this machine: not checked", cfg.model)
    begin_run(cfg, adopt_unsaved=True)
    env = rl_launch_env(cfg)
    command = launch_command(cfg, overrides, env)
    launch = render_launch_script(command, env, "astra-train rl")
    texts = {
        "overrides.txt": "\n".join(overrides) + "\n",
        "config.yaml": OmegaConf.to_yaml(composed),
        "agent_loops.yaml": agent_loop_yaml(cfg),
        "launch.sh": launch,
        FINGERPRINT: job_claim(cfg).text(),
    }
    tables = {"data/train.parquet": rows.train}
    if rows.heldout is not None:
        tables["data/heldout.parquet"] = rows.heldout
    write_job_dir(workdir, texts, tables)
    return VerlRLJob(
        workdir=workdir,
        data=data,
        overrides_file=workdir / "overrides.txt",
        config_file=workdir / "config.yaml",
        agent_loop_file=agent_loops,
        launch_script=workdir / "launch.sh",
        command=tuple(command),
        env=tuple(env.items()),
        checkpoint_dir=out / VERL_CHECKPOINTS,
        metrics_file=Path(env["VERL_FILE_LOGGER_PATH"]),
    )


def run_verl(cfg: RLConfig, *, echo: Callable[[str], None] | None = None) -> VerlRLJob:
    """Write the verl job; with ``verl.run: true`` also run it and convert its newest checkpoint
    (verl FSDP → verl's model merger → bf16) into ``OUTPUT_DIR/final-bf16``."""
    job = prepare_verl(cfg)
    log.info("verl job written to %s (launch: %s)", job.workdir, job.launch_script)
    if not cfg.verl.run:
        return job
    return run_job(job, cfg, "PPO trainer", echo)


# --------------------------------------------------------------------------- reward guard


def reward_from_agent_loop(
    data_source: str, solution_str: str, ground_truth: Any, **_: Any
) -> float:
    """verl's ``custom_reward_function``: never meant to run. Our agent loop returns
    ``reward_score``, so verl's worker skips its reward workers; a sample that reaches this
    function came from another agent loop, and scoring it with anything would be silent."""
    raise AstraError(
        f"a sample of data source {data_source!r} reached verl's reward function without a "
        "reward: only the astra_arena agent loop scores arena episodes",
        hint=f"the rows' agent_name must be {AGENT_NAME!r} (astra-train rl writes it)",
    )
