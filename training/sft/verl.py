"""``backend: verl``: verl 0.9.1's SFT trainer (FSDP) on one node (torchrun) or several (Ray).

``run_verl(cfg)`` maps an ``SFTConfig`` to verl Hydra overrides, validates them against verl's
own config schema offline (Hydra compose in struct mode: an unknown key fails; the optim,
engine, checkpoint and profiler sections are built as verl's dataclasses), then writes
``OUTPUT_DIR/verl/``: ``overrides.txt`` (one override a line), ``config.yaml`` (the composed
config, for reading) and ``launch.sh`` (the launch line, shell-quoted). With ``verl.run: true``
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

import json
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from astra_agent.config import check_writable
from astra_agent.errors import AstraError, ConfigError
from training.sft.common import check_model, check_train_files
from training.sft.config import SFTConfig

log = logging.getLogger(__name__)

DATASET_PATH = "pkg://training.sft.verl_dataset"
DATASET_NAME = "AstraSFTDataset"
CONFIG_NAME = "sft_trainer_engine"
SCHEDULERS = ("cosine", "constant")  # what verl's FSDP engine implements (transformer_impl.py)


@dataclass(frozen=True)
class VerlJob:
    """What ``run_verl`` wrote (and, with ``run: true``, produced)."""

    workdir: Path  # OUTPUT_DIR/verl
    overrides_file: Path
    config_file: Path
    launch_script: Path
    command: tuple[str, ...]  # the launch line, argv
    env: tuple[tuple[str, str], ...]  # variables launch.sh exports
    checkpoint_dir: Path  # trainer.default_local_dir
    metrics_file: Path  # verl's file logger (JSONL)
    ran: bool = False
    final: Path | None = None  # the converted checkpoint, when run and converted


# --------------------------------------------------------------------------- overrides


_PLAIN = re.compile(r"[\w./-]+")
_NOT_A_STRING = re.compile(r"[-+]?(\d[\d_]*\.?\d*(e[-+]?\d+)?|\.\d+|inf|nan|null|true|false)", re.I)


def hq(value: str) -> str:
    """``value`` as a Hydra string: bare when the override grammar reads it back as that very
    string, else quoted (so any path survives: spaces, '=', ',', quotes)."""
    if _PLAIN.fullmatch(value) and not _NOT_A_STRING.fullmatch(value):
        return value
    # Hydra unescapes backslashes only before a quote (or the closing one); `\${` stays literal
    body = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    return "'" + body.replace("${", "\\${") + "'"


def hlist(paths: Sequence[Path]) -> str:
    return "[" + ",".join(hq(str(p.absolute())) for p in paths) + "]"


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
    world = v.nnodes * v.gpus_per_node
    if world % v.ulysses_sequence_parallel_size:
        raise ConfigError(
            f"verl.ulysses_sequence_parallel_size={v.ulysses_sequence_parallel_size} does not "
            f"divide the {world} GPUs (nnodes × gpus_per_node)"
        )
    dp = world // v.ulysses_sequence_parallel_size
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
    if cfg.lr_scheduler not in SCHEDULERS:
        raise ConfigError(
            f"lr_scheduler {cfg.lr_scheduler!r} is not implemented by verl's FSDP engine",
            hint=f"use one of: {', '.join(SCHEDULERS)}",
        )


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
        f"trainer.default_local_dir={hq(str(out / 'checkpoints'))}",
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
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            composed = compose(config_name=CONFIG_NAME, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(
            f"verl rejects the generated config: {first}",
            hint="a key verl 0.9.1 does not know (check verl.overrides), or a bad value",
        ) from None
    _check_sections(composed, ["optim", "engine", "checkpoint", "profiler"])
    if check_model:
        check_model_path(composed)
    return composed


def _check_sections(composed: Any, names: Sequence[str]) -> None:
    from verl.utils.config import omega_conf_to_dataclass

    for name in names:
        try:
            omega_conf_to_dataclass(composed[name])
        except Exception as exc:  # verl raises what its dataclasses raise
            raise ConfigError(f"verl rejects its {name!r} section: {exc}") from None


def check_model_path(composed: Any) -> None:
    """verl's HFModelConfig on ``model``: the path must be an HF checkpoint with a tokenizer."""
    path = Path(str(composed.model.path))
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model {path} is not a checkpoint (no config.json)",
            hint="point `model:` at an HF checkpoint dir (weights, config.json, tokenizer)",
        )
    _check_sections(composed, ["model"])


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
    runtime_env = json.dumps({"env_vars": env}, sort_keys=True)
    return [
        "ray",
        "job",
        "submit",
        f"--address={v.ray_address}",
        f"--runtime-env-json={runtime_env}",
        "--",
        "python3",
        "-m",
        "verl.trainer.sft_trainer_ray",
        *overrides,
    ]


def launch_env(cfg: SFTConfig, workdir: Path) -> dict[str, str]:
    env = {"VERL_FILE_LOGGER_PATH": str(workdir / "metrics.jsonl")}
    if cfg.verl.device == "cpu":
        from training.verl_cpu import cpu_env

        env.update(cpu_env())
    if "tensorboard" in cfg.report_to:
        env["TENSORBOARD_DIR"] = str(Path(cfg.output_dir).absolute() / "tensorboard")
    return env


def render_launch_script(command: Sequence[str], env: dict[str, str]) -> str:
    lines = [
        "#!/usr/bin/env bash",
        "# Written by `astra-train sft` (backend: verl); run it as is, or edit and run.",
        "set -euo pipefail",
        *(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
        "exec " + " \\\n    ".join(shlex.quote(c) for c in command),
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- run


def _check_can_run(cfg: SFTConfig) -> None:
    """Fail before writing anything if this machine cannot start the launch line."""
    v = cfg.verl
    if v.launcher == "ray":
        if shutil.which("ray") is None:
            raise ConfigError("verl.run with the Ray launcher needs the `ray` CLI on PATH")
        return  # the GPUs are the cluster's; Ray's resource pool checks them
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if v.device == "cpu" and have:
        raise ConfigError(
            f"verl.device: cpu is for CPU tests and CI, and this machine has {have} CUDA GPU(s)",
            hint="set verl.device: cuda",
        )
    if v.device == "cuda" and have < v.gpus_per_node:
        raise ConfigError(
            f"verl.run needs {v.gpus_per_node} CUDA GPU(s) here, found {have}: verl's SFT "
            "trainer runs on cuda/npu only (its engine, nccl)",
            hint="set verl.run: false to only write the config and launch.sh, or use "
            "backend: trl on this machine (or verl.device: cpu, for tests)",
        )
    if shutil.which("torchrun") is None:
        raise ConfigError("verl.run needs `torchrun` on PATH (torch's launcher)")


def _write_workdir(workdir: Path, files: dict[str, str]) -> None:
    """Write ``files`` into a temporary sibling, then rename it over ``workdir``."""
    tmp = workdir.with_name(f".{workdir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, text in files.items():
        (tmp / name).write_text(text, encoding="utf-8")
    (tmp / "launch.sh").chmod(0o755)
    old = workdir.with_name(f".{workdir.name}.old-{os.getpid()}")
    if workdir.exists():
        workdir.rename(old)
    tmp.rename(workdir)
    shutil.rmtree(old, ignore_errors=True)


def _check_resume(cfg: SFTConfig, workdir: Path) -> None:
    """Resuming into OUTPUT_DIR must be for the same config (data, model, schedule, batch)."""
    ckpt = Path(cfg.output_dir) / "checkpoints" / "latest_checkpointed_iteration.txt"
    old = workdir / "fingerprint.json"
    if not (cfg.resume and ckpt.is_file() and old.is_file()):
        return
    if json.loads(old.read_text()) != cfg.fingerprint():
        raise ConfigError(
            f"{cfg.output_dir} holds checkpoints of a different config",
            hint="use a new output_dir, or set resume: false to start over",
        )


def prepare_verl(cfg: SFTConfig) -> VerlJob:
    """Validate, then write OUTPUT_DIR/verl (overrides, config.yaml, launch.sh)."""
    from omegaconf import OmegaConf

    out = Path(cfg.output_dir).absolute()
    workdir = out / "verl"
    overrides = verl_overrides(cfg)
    model_here = cfg.verl.run or Path(cfg.model).exists()  # else: a path on the cluster
    composed = compose_verl_config(overrides, check_model=model_here)
    if not model_here:
        log.warning("model %s is not on this machine: not checked", cfg.model)
    if cfg.verl.run:
        _check_can_run(cfg)
        check_train_files(list(cfg.train_files))
        check_model(Path(cfg.model))
    _check_resume(cfg, workdir)
    check_writable(workdir, "output dir", kind="dir")
    env = launch_env(cfg, workdir)
    command = launch_command(cfg, overrides, env)
    _write_workdir(
        workdir,
        {
            "overrides.txt": "\n".join(overrides) + "\n",
            "config.yaml": OmegaConf.to_yaml(composed),
            "launch.sh": render_launch_script(command, env),
            "fingerprint.json": json.dumps(cfg.fingerprint(), indent=2, sort_keys=True) + "\n",
        },
    )
    return VerlJob(
        workdir=workdir,
        overrides_file=workdir / "overrides.txt",
        config_file=workdir / "config.yaml",
        launch_script=workdir / "launch.sh",
        command=tuple(command),
        env=tuple(env.items()),
        checkpoint_dir=out / "checkpoints",
        metrics_file=workdir / "metrics.jsonl",
    )


def stream(script: Path, echo: Callable[[str], None], cwd: Path | None = None) -> int:
    with subprocess.Popen(
        ["bash", str(script)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            echo(line.rstrip("\n"))
        return proc.wait()


def run_verl(cfg: SFTConfig, *, echo: Callable[[str], None] | None = None) -> VerlJob:
    """Write the verl job; with ``verl.run: true`` also run it and convert its checkpoint."""
    job = prepare_verl(cfg)
    log.info("verl job written to %s (launch: %s)", job.workdir, job.launch_script)
    if not cfg.verl.run:
        return job
    # cwd: Hydra (verl's entry point) writes its outputs/DATE/TIME/ logs into the cwd
    echo = echo or (lambda s: print(s, file=sys.stderr, flush=True))
    rc = stream(job.launch_script, echo, cwd=job.workdir)
    if rc != 0:
        raise AstraError(
            f"verl's SFT trainer exited with status {rc}",
            hint=f"its output is above; the launch line is {job.launch_script}",
        )
    job = replace(job, ran=True)
    if not cfg.convert.enabled:
        return job
    from serving.convert import convert_checkpoint

    dst = cfg.convert.out or Path(cfg.output_dir) / "final-bf16"
    result = convert_checkpoint(job.checkpoint_dir, dst, dtype=cfg.convert.dtype, overwrite=True)
    return replace(job, final=result.dst)
