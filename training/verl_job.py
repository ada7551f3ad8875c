"""The verl job layer shared by ``astra-train sft`` and ``astra-train rl`` with ``backend: verl``.

Both write ``OUTPUT_DIR/verl/`` the same way and run it the same way:

* one ``verl`` options base (:class:`VerlJobOptions`) and one job type (:class:`VerlJob`),
  which each backend extends with what only it has;
* Hydra values that survive verl's override grammar (:func:`hq`, :func:`hlist`);
* the job directory, written whole into a temporary sibling and renamed over the old one
  (:func:`write_job_dir`): overrides, the composed config, ``launch.sh``, the fingerprint, and
  (RL) the data;
* the run directory opened as a TRL run opens it (:func:`begin_run`: a
  :class:`~training.run.TrainingRun`), and verl's checkpoints resumed only under the config
  they were made with (:func:`check_resume`, ``verl/fingerprint.json``: :func:`job_claim`);
* composing the overrides with verl's own Hydra defaults, offline, in struct mode
  (:func:`compose`: an unknown key or a bad value is a ConfigError), and building sections into
  verl's dataclasses (:func:`check_sections`);
* what every launch line exports (:func:`launch_env`): a metrics file of its own outside the
  job directory (:func:`launch_metrics_file`), our packages on ``PYTHONPATH``, and the modules
  verl imports in each process (``training.verl_compat`` always, ``training.verl_cpu`` on CPU);
* ``launch.sh`` (:func:`render_launch_script`) and running it (:func:`stream`): from the job
  directory (Hydra writes ``outputs/`` into the working directory), in its own process group,
  with SIGTERM sent to it should this process die however it dies (``kill -9`` included: verl's
  driver then takes its local Ray and, through it, the vLLM servers with it), and the whole group
  stopped on Ctrl-C or SIGTERM of this process;
* ``verl.device: cpu`` (:func:`check_device`): CPU tests and CI only (``training.verl_cpu``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.claim import Claim, Refusal, sorted_lines
from astra_agent.config import check_writable
from astra_agent.errors import AstraError, ConfigError
from astra_agent.procs import dies_with, stop_group
from astra_agent.runio import building_dir
from training.run import (
    VERL_CHECKPOINTS,
    VERL_METRICS,
    TrainingConfig,
    TrainingRun,
    converted_dir,
    run_claim,
    write_run_file,
)

JOB_DIR = "verl"  # the job directory in OUTPUT_DIR


class VerlJobOptions(BaseModel):
    """The ``verl`` section every verl job takes; SFT's and RL's add their trainer's own."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    nnodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(8, ge=1)
    device: Literal["cuda", "cpu"] = "cuda"  # each backend says what cpu means for it
    ulysses_sequence_parallel_size: int = Field(1, ge=1)
    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"
    ray_address: str = "http://127.0.0.1:8265"
    run: bool = Field(False, description="run the launch line (else only write it)")
    overrides: list[str] = Field(
        default_factory=list, description="extra verl Hydra overrides, key=value"
    )


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


# What the generated configs, our plugins and the CPU path were written and tested against.
PINNED = {"verl": "0.9.1", "TransferQueue": "0.1.11"}
INSTALL_HINT = "pip install 'verl[verl-core]==0.9.1' 'TransferQueue==0.1.11' (or: make setup)"


def check_installed(*names: str) -> None:
    """Each of ``names`` (keys of :data:`PINNED`) installed at its pinned version, else one
    ConfigError naming what to install."""
    from importlib.metadata import PackageNotFoundError, version

    wrong = []
    for name in names:
        try:
            have = version(name)
        except PackageNotFoundError:
            have = None
        if have != PINNED[name]:
            wrong.append(f"{name} {have}" if have else f"{name} not installed")
    if wrong:
        raise ConfigError(
            f"backend: verl needs {', '.join(f'{n}=={PINNED[n]}' for n in names)}; found: "
            f"{', '.join(wrong)}",
            hint=INSTALL_HINT,
        )


def check_sections(composed: Any, names: Sequence[str]) -> None:
    """Build each section ``names`` (dotted paths) as verl builds it, into its dataclass: what
    verl would refuse at start-up is a ConfigError now."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    for name in names:
        try:
            omega_conf_to_dataclass(OmegaConf.select(composed, name))
        except Exception as exc:  # verl raises what its dataclasses raise
            why = " ".join(str(exc).split())
            raise ConfigError(f"verl rejects its {name!r} section: {why}") from None


def compose(config_name: str, overrides: Sequence[str]) -> Any:
    """``overrides`` composed with verl's ``config_name`` defaults, offline, in struct mode."""
    check_installed("verl")
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(
            f"verl rejects the generated config: {first}",
            hint="a key verl 0.9.1 does not know (check verl.overrides), or a bad value",
        ) from None


def write_job_dir(
    workdir: Path,
    texts: dict[str, str],
    tables: dict[str, list[dict[str, Any]]] | None = None,
) -> None:
    """Write ``texts`` and parquet ``tables`` (relative paths) into a temporary sibling, then
    rename it over ``workdir``: a job directory is whole or absent."""
    with building_dir(workdir) as tmp:
        for name, text in texts.items():
            (tmp / name).write_text(text, encoding="utf-8")
        if tables:
            import pyarrow as pa
            import pyarrow.parquet as pq

            for name, rows in tables.items():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(pa.Table.from_pylist(rows), tmp / name)
        if (tmp / "launch.sh").exists():
            (tmp / "launch.sh").chmod(0o755)


FINGERPRINT = "fingerprint.json"  # in the job directory
_OTHER_CHECKPOINTS = Refusal(
    "{dir} holds checkpoints of a different config: {differences}",
    hint="use a new output_dir, or set resume: false to start over",
)


def job_claim(cfg: TrainingConfig) -> Claim:
    """``OUTPUT_DIR/verl/fingerprint.json``: the config verl's checkpoints in
    ``OUTPUT_DIR/checkpoints`` are made under (the job directory writes its :meth:`~Claim.text`
    with the rest, whole)."""
    file = f"{JOB_DIR}/{FINGERPRINT}"
    return Claim(
        Path(cfg.output_dir), file, cfg.fingerprint(), _OTHER_CHECKPOINTS, dumps=sorted_lines
    )


def check_resume(cfg: TrainingConfig) -> None:
    """Resuming verl's checkpoints in ``OUTPUT_DIR`` must be under the config they were made
    with (refused with the differences named)."""
    latest = Path(cfg.output_dir) / VERL_CHECKPOINTS / "latest_checkpointed_iteration.txt"
    if cfg.resume and latest.is_file():
        job_claim(cfg).check()


def begin_run(cfg: TrainingConfig, *, adopt_unsaved: bool = False) -> None:
    """A verl job's run directory, opened and begun as a TRL run's is (:class:`TrainingRun`:
    a run of another config refused with the differences named, the run file written, an
    earlier run set aside on a start over), verl's checkpoints there resumed only under their
    config (:func:`check_resume`), and the job directory writable. Called once the job is
    valid, before anything else is written into the directory. A verl run written before verl
    runs had a run file is this config's where its ``fingerprint.json`` says so: the run file
    is written for it."""
    if not run_claim(cfg).path.is_file() and job_claim(cfg).check():
        write_run_file(cfg)
    run = TrainingRun.open(cfg, adopt_unsaved=adopt_unsaved)
    check_resume(cfg)
    check_writable(Path(cfg.output_dir) / JOB_DIR, "output dir", kind="dir")
    run.begin()


def check_device(device: str, gpus_wanted: int, trainer: str) -> None:
    """Before ``verl.run``: this machine can run the job on ``device``."""
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "cpu" and have:
        raise ConfigError(
            f"verl.device: cpu is for CPU tests and CI, and this machine has {have} CUDA GPU(s)",
            hint="set verl.device: cuda",
        )
    if device == "cuda" and have < gpus_wanted:
        raise ConfigError(
            f"verl.run needs {gpus_wanted} CUDA GPU(s) here, found {have}: verl's {trainer} "
            "runs on cuda/npu only",
            hint="set verl.run: false to only write the config and launch.sh, or use "
            "backend: trl on this machine (or verl.device: cpu, for tests)",
        )


def data_parallel_ranks(nnodes: int, gpus_per_node: int, ulysses: int) -> int:
    """The data-parallel ranks of a job (its GPUs over the ulysses size, which must divide
    them)."""
    world = nnodes * gpus_per_node
    if world % ulysses:
        raise ConfigError(
            f"verl.ulysses_sequence_parallel_size={ulysses} does not "
            f"divide the {world} GPUs (nnodes × gpus_per_node)"
        )
    return world // ulysses


def check_scheduler(name: str, schedulers: Sequence[str]) -> None:
    """``lr_scheduler`` must be one that verl's FSDP engine implements."""
    if name not in schedulers:
        raise ConfigError(
            f"lr_scheduler {name!r} is not implemented by verl's FSDP engine",
            hint=f"use one of: {', '.join(schedulers)}",
        )


def ray_job_command(
    address: str, env: dict[str, str], module: str, overrides: Sequence[str]
) -> list[str]:
    """``ray job submit`` to the cluster at ``address``: ``python3 -m MODULE OVERRIDES``,
    with ``env`` set on its workers."""
    runtime_env = json.dumps({"env_vars": env}, sort_keys=True)
    return [
        "ray",
        "job",
        "submit",
        f"--address={address}",
        f"--runtime-env-json={runtime_env}",
        "--",
        "python3",
        "-m",
        module,
        *overrides,
    ]


def launch_metrics_file(output_dir: Path) -> Path:
    """Where a launch's metrics go: ``OUTPUT_DIR/verl-metrics/<UTC time>-<n>.jsonl`` (the folder
    made, the file left to verl). verl's file logger truncates its file at every start, and the
    job directory is rewritten at every launch, so each launch logs to a file of its own and a
    resumed run keeps the earlier launches' steps (``eval.rundir`` reads them in name order)."""
    import time

    folder = Path(output_dir).absolute() / VERL_METRICS
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    n = 1
    while (folder / f"{stamp}-{n:03d}.jsonl").exists():  # two launches in one second
        n += 1
    return folder / f"{stamp}-{n:03d}.jsonl"


def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def launch_env(output_dir: Path, device: str, **extra: str) -> dict[str, str]:
    """What every verl launch line exports: verl's file logger (this launch's metrics file),
    our packages on the workers' import path, ``training.verl_compat`` (and, on CPU, the
    ``training.verl_cpu`` platform and its variables) for verl to import in each process,
    then ``extra``."""
    env = {
        "VERL_FILE_LOGGER_PATH": str(launch_metrics_file(output_dir)),
        "PYTHONPATH": str(repo_root()),
    }
    modules = ["training.verl_compat"]
    if device == "cpu":
        from training.verl_cpu import cpu_env

        cpu = cpu_env()
        modules.append(cpu.pop("VERL_USE_EXTERNAL_MODULES"))
        env.update(cpu)
    env["VERL_USE_EXTERNAL_MODULES"] = ",".join(modules)
    return {**env, **extra}


def render_launch_script(command: Sequence[str], env: dict[str, str], who: str) -> str:
    lines = [
        "#!/usr/bin/env bash",
        f"# Written by `{who}` (backend: verl); run it as is, or edit and run.",
        "set -euo pipefail",
        *(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
        "exec " + " \\\n    ".join(shlex.quote(c) for c in command),
    ]
    return "\n".join(lines) + "\n"


def stream(script: Path, echo: Callable[[str], None], cwd: Path | None = None) -> int:
    """Run ``script`` (from ``cwd``), echoing its output line by line; its exit status. The
    script's process group is stopped if this one is interrupted (Ctrl-C, SIGTERM) and gets
    SIGTERM if this process dies (see the module docstring)."""
    with subprocess.Popen(
        ["bash", str(script)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        preexec_fn=dies_with(os.getpid()),
    ) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                echo(line.rstrip("\n"))
            return proc.wait()
        except BaseException:
            # long enough for training.verl_launch to stop what is below it (up to ≈30 s)
            stop_group(proc, grace_s=45.0)
            raise


@dataclass(frozen=True)
class VerlJob:
    """What a verl backend's ``run_verl`` wrote (and, with ``verl.run: true``, ran); a
    backend's job adds what only it writes (RL: its data and agent loop file)."""

    workdir: Path  # OUTPUT_DIR/verl
    overrides_file: Path
    config_file: Path  # the composed config, for reading
    launch_script: Path
    command: tuple[str, ...]  # the launch line, argv
    env: tuple[tuple[str, str], ...]  # variables launch.sh exports
    checkpoint_dir: Path  # trainer.default_local_dir
    metrics_file: Path  # verl's file logger (JSONL)
    ran: bool = False
    final: Path | None = None  # the converted checkpoint, when run and converted


J = TypeVar("J", bound=VerlJob)


def run_job(
    job: J,
    cfg: TrainingConfig,
    trainer: str,
    echo: Callable[[str], None] | None = None,
) -> J:
    """Run a written job's launch script (``job.launch_script``, from ``job.workdir``: Hydra,
    verl's entry point, writes its ``outputs/DATE/TIME/`` logs into the cwd), echoing its
    output; then, unless ``cfg.convert.enabled`` is off, convert its newest checkpoint
    (``job.checkpoint_dir``: verl FSDP → verl's model merger → bf16) into ``cfg.convert.out``
    or ``OUTPUT_DIR/final-bf16``. The job comes back with ``ran`` and ``final`` set."""
    echo = echo or (lambda s: print(s, file=sys.stderr, flush=True))
    script = job.launch_script
    rc = stream(script, echo, cwd=job.workdir)
    if rc != 0:
        raise AstraError(
            f"verl's {trainer} exited with status {rc}",
            hint=f"its output is above; the launch line is {script}",
        )
    job = replace(job, ran=True)
    if not cfg.convert.enabled:
        return job
    from serving.convert import convert_checkpoint

    dst = converted_dir(cfg)
    result = convert_checkpoint(job.checkpoint_dir, dst, dtype=cfg.convert.dtype, overwrite=True)
    return replace(job, final=result.dst)
