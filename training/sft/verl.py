"""``backend: verl``: verl 0.9.1's SFT trainer (FSDP) on one node (torchrun) or several (Ray).

``run_verl(cfg)`` maps an ``SFTConfig`` to verl Hydra overrides, validates them against verl's
own config schema offline (Hydra compose in struct mode: an unknown key fails; the optim,
engine, checkpoint and profiler sections are built as verl's dataclasses), then writes
``OUTPUT_DIR/verl/``: ``overrides.txt`` (one override a line), ``config.yaml`` (the composed
config, for reading), ``launch.sh`` (the launch line, shell-quoted) and ``fingerprint.json``,
once the run directory is opened and begun as a TRL run's (``training.verl_job.begin_run``: a
run of another config refused, the run file ``OUTPUT_DIR/astra-sft.json``). With ``verl.run: true``
it runs ``launch.sh`` and converts the newest checkpoint with ``serving.convert`` (verl FSDP →
verl's model merger → bf16) into ``OUTPUT_DIR/final-bf16``.

The data reach verl through ``data.custom_cls`` = ``training.sft.verl_dataset.AstraSFTDataset``:
it tokenizes our parquet with our training template and mask, so verl trains exactly the tokens
TRL trains. verl's own ``MultiTurnSFTDataset`` cannot (see verl_dataset.py).

verl's trainer does not run on CPU as shipped (its training engine is registered for
``device=["cuda", "npu"]`` only, it initialises the process group with nccl and calls
``set_device``). ``verl.device: cpu`` (CPU tests and CI only, one node, torchrun) adds the
overrides and the environment of ``training.verl_cpu``, a verl platform plugin that makes it
run there; ``run: true`` with ``device: cuda`` and no GPUs, or ``device: cpu`` on a machine with
GPUs, fails up front.
"""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from astra_agent.errors import ConfigError
from training.run import VERL_CHECKPOINTS, check_model
from training.sft.common import check_sft_parquet, check_train_files
from training.sft.config import SFTConfig
from training.verl_job import (
    FINGERPRINT,
    JOB_DIR,
    VerlJob,
    begin_run,
    check_device,
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

DATASET_PATH = "pkg://training.sft.verl_dataset"
DATASET_NAME = "AstraSFTDataset"
CONFIG_NAME = "sft_trainer_engine"
SCHEDULERS = ("cosine", "constant")  # what verl's FSDP engine implements (transformer_impl.py)


# --------------------------------------------------------------------------- overrides


def _parquet_rows(paths: Sequence[Path]) -> int:
    import pyarrow.parquet as pq

    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ConfigError(
            f"train file not found: {', '.join(missing)}",
            hint="max_steps and fractional epochs need the parquet here to count its rows",
        )
    return sum(pq.read_metadata(p).num_rows for p in paths)


def _schedule(cfg: SFTConfig) -> list[str]:
    """trainer.total_epochs (verl wants an int) and trainer.total_training_steps."""
    if cfg.max_steps is None and float(cfg.epochs).is_integer():
        return [f"trainer.total_epochs={int(cfg.epochs)}", "trainer.total_training_steps=null"]
    per_epoch = _parquet_rows(cfg.train_files) // cfg.global_batch_size  # drop_last, as verl
    if per_epoch < 1:
        raise ConfigError(
            f"the train files hold fewer rows than one batch of {cfg.global_batch_size}",
            hint="lower global_batch_size",
        )
    steps = cfg.max_steps or max(1, math.floor(per_epoch * cfg.epochs))
    return [
        f"trainer.total_epochs={math.ceil(steps / per_epoch)}",
        f"trainer.total_training_steps={steps}",
    ]


def _check_parallelism(cfg: SFTConfig) -> None:
    v = cfg.verl
    dp = data_parallel_ranks(v.nnodes, v.gpus_per_node, v.ulysses_sequence_parallel_size)
    if cfg.global_batch_size % dp:
        raise ConfigError(
            f"global_batch_size={cfg.global_batch_size} is not a multiple of the {dp} "
            "data-parallel ranks (GPUs / ulysses size): verl gives each rank batch // dp",
            hint=f"use a multiple of {dp}, or change gpus_per_node / nnodes / ulysses",
        )
    if v.nnodes > 1 and v.launcher != "ray":
        raise ConfigError(
            f"verl.nnodes={v.nnodes} needs the Ray launcher",
            hint="set verl.launcher: ray and verl.ray_address to the cluster's dashboard",
        )
    if v.device == "cpu" and v.launcher != "torchrun":
        raise ConfigError(
            "verl.device: cpu runs with the torchrun launcher only",
            hint="verl's Ray trainers count GPUs for their resource pool; set verl.launcher: "
            "torchrun",
        )
    check_scheduler(cfg.lr_scheduler, SCHEDULERS)


def _loggers(cfg: SFTConfig) -> str:
    return "[" + ",".join(["console", "file", *cfg.report_to]) + "]"


def verl_overrides(cfg: SFTConfig) -> list[str]:
    """The Hydra overrides for ``verl.trainer.sft_trainer``; ``verl.overrides`` come last."""
    _check_parallelism(cfg)
    v = cfg.verl
    out = Path(cfg.output_dir).absolute()
    sp = v.ulysses_sequence_parallel_size
    token_budget = math.ceil(cfg.max_length * cfg.micro_batch_size / sp)  # verl multiplies by sp
    val = hlist(cfg.val_files) if cfg.val_files else "null"
    return [
        f"model.path={hq(str(Path(cfg.model).absolute()))}",
        f"data.train_files={hlist(cfg.train_files)}",
        f"data.val_files={val}",
        f"data.custom_cls.path={DATASET_PATH}",
        f"data.custom_cls.name={DATASET_NAME}",
        "data.pad_mode=no_padding",
        "data.truncation=error",
        f"data.max_length={cfg.max_length}",
        f"data.use_dynamic_bsz={cfg.packing}",
        f"data.max_token_len_per_gpu={token_budget}",
        f"data.micro_batch_size_per_gpu={cfg.micro_batch_size}",
        f"data.train_batch_size={cfg.global_batch_size}",
        f"optim.lr={cfg.learning_rate}",
        f"optim.lr_scheduler_type={cfg.lr_scheduler}",
        f"optim.lr_warmup_steps_ratio={cfg.warmup_ratio}",
        f"optim.weight_decay={cfg.weight_decay}",
        f"optim.clip_grad={cfg.max_grad_norm}",
        f"engine.strategy={v.strategy}",
        f"engine.ulysses_sequence_parallel_size={sp}",
        *_schedule(cfg),
        f"trainer.default_local_dir={hq(str(out / VERL_CHECKPOINTS))}",
        f"trainer.save_freq={cfg.save_steps}",
        f"trainer.test_freq={cfg.save_steps if cfg.val_files else -1}",
        f"trainer.max_ckpt_to_keep={cfg.save_total_limit}",
        f"trainer.resume_mode={'auto' if cfg.resume else 'disable'}",
        f"trainer.seed={cfg.seed}",
        "trainer.project_name=astra-sft",
        f"trainer.experiment_name={hq(out.name)}",
        f"trainer.logger={_loggers(cfg)}",
        f"trainer.nnodes={v.nnodes}",
        f"trainer.n_gpus_per_node={v.gpus_per_node}",
        *(_cpu_overrides() if v.device == "cpu" else []),
        *v.overrides,
    ]


def _cpu_overrides() -> list[str]:
    from training.verl_cpu import cpu_overrides

    return cpu_overrides()


# --------------------------------------------------------------------------- validation


def compose_verl_config(overrides: Sequence[str], *, check_model: bool = True) -> Any:
    """Compose ``overrides`` with verl's Hydra defaults, offline, and build the sections verl
    turns into dataclasses. Unknown keys and bad values raise ConfigError naming them.
    ``check_model=False`` skips ``model`` (HFModelConfig loads the checkpoint's config and
    tokenizer, so a recipe's placeholder path cannot pass); check it apart."""
    composed = compose(CONFIG_NAME, overrides)
    check_sections(composed, ["optim", "engine", "checkpoint", "profiler"])
    if check_model:
        check_model_path(composed)
    return composed


def check_model_path(composed: Any) -> None:
    """verl's HFModelConfig on ``model``: the path must be an HF checkpoint with a tokenizer."""
    path = Path(str(composed.model.path))
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model {path} is not a checkpoint (no config.json)",
            hint="point `model:` at an HF checkpoint dir (weights, config.json, tokenizer)",
        )
    check_sections(composed, ["model"])


# --------------------------------------------------------------------------- launch


def launch_command(cfg: SFTConfig, overrides: Sequence[str], env: dict[str, str]) -> list[str]:
    """torchrun on one node; ``ray job submit`` for a Ray cluster (one node or several)."""
    v = cfg.verl
    if v.launcher == "torchrun":
        return [
            "torchrun",
            "--standalone",
            "--nnodes=1",
            f"--nproc_per_node={v.gpus_per_node}",
            "-m",
            "verl.trainer.sft_trainer",
            *overrides,
        ]
    return ray_job_command(v.ray_address, env, "verl.trainer.sft_trainer_ray", overrides)


def sft_launch_env(cfg: SFTConfig) -> dict[str, str]:
    """The launch env every verl job exports (``training.verl_job.launch_env``), and
    TensorBoard's folder when ``report_to`` has it."""
    extra = {}
    if "tensorboard" in cfg.report_to:
        extra["TENSORBOARD_DIR"] = str(Path(cfg.output_dir).absolute() / "tensorboard")
    return launch_env(cfg.output_dir, cfg.verl.device, **extra)


# --------------------------------------------------------------------------- run


def _check_can_run(cfg: SFTConfig) -> None:
    """Fail before writing anything if this machine cannot start the launch line."""
    v = cfg.verl
    if v.launcher == "ray":
        if shutil.which("ray") is None:
            raise ConfigError("verl.run with the Ray launcher needs the `ray` CLI on PATH")
        return  # the GPUs are the cluster's; Ray's resource pool checks them
    check_device(v.device, v.gpus_per_node, "SFT trainer")
    if shutil.which("torchrun") is None:
        raise ConfigError("verl.run needs `torchrun` on PATH (torch's launcher)")


def prepare_verl(cfg: SFTConfig) -> VerlJob:
    """Validate, then write OUTPUT_DIR/verl (overrides, config.yaml, launch.sh)."""
    from omegaconf import OmegaConf

    out = Path(cfg.output_dir).absolute()
    workdir = out / JOB_DIR
    overrides = verl_overrides(cfg)
    model_here = cfg.verl.run or Path(cfg.model).exists()  # else: a path on the cluster
    composed = compose_verl_config(overrides, check_model=model_here)
    if not model_here:
        log.warning("model %s is not on this machine: not checked", cfg.model)
    if cfg.verl.run:
        _check_can_run(cfg)
        check_train_files(list(cfg.train_files))
        check_sft_parquet(list(cfg.train_files))
        check_model(Path(cfg.model))
    begin_run(cfg)
    env = sft_launch_env(cfg)
    command = launch_command(cfg, overrides, env)
    write_job_dir(
        workdir,
        {
            "overrides.txt": "\n".join(overrides) + "\n",
            "config.yaml": OmegaConf.to_yaml(composed),
            "launch.sh": render_launch_script(command, env, "astra-train sft"),
            FINGERPRINT: job_claim(cfg).text(),
        },
    )
    return VerlJob(
        workdir=workdir,
        overrides_file=workdir / "overrides.txt",
        config_file=workdir / "config.yaml",
        launch_script=workdir / "launch.sh",
        command=tuple(command),
        env=tuple(env.items()),
        checkpoint_dir=out / VERL_CHECKPOINTS,
        metrics_file=Path(env["VERL_FILE_LOGGER_PATH"]),
    )


def run_verl(cfg: SFTConfig, *, echo: Callable[[str], None] | None = None) -> VerlJob:
    """Write the verl job; with ``verl.run: true`` also run it and convert its checkpoint."""
    job = prepare_verl(cfg)
    log.info("verl job written to %s (launch: %s)", job.workdir, job.launch_script)
    if not cfg.verl.run:
        return job
    return run_job(job, cfg, "SFT trainer", echo)
