"""A training run in its output directory, shared by ``astra-train sft`` and ``rl`` (every
backend): the checks before anything is written, the checkpoint to resume from, the run file,
the metrics, setting an earlier run aside, a finished run's rerun, and the final save and
conversion. A backend opens one :class:`TrainingRun` (reading only), loads what it needs, then
:meth:`~TrainingRun.begin` writes the run directory.

The output directory of a run holds the run file (``astra-sft.json`` / ``astra-rl.json``: the
config's fingerprint, what must match to resume, the directory's :class:`~astra_agent.claim.Claim`;
the config class names it, ``RUN_FILE``), ``checkpoint-N/`` (complete once ``trainer_state.json``
is in it: the trainer writes it last), ``metrics.jsonl`` (one line per logging step, each
appended whole: :mod:`training.metrics`) and ``final/``; a verl run has verl's ``checkpoints/``
and ``verl-metrics/`` instead of the checkpoints and metrics, and its job in ``verl/``
(:mod:`training.verl_job`).

The fingerprint does not hold where the run directory is (a moved or copied one resumes), and
its input files (model, data) are matched by content, not by path: each is recorded with the
SHA-256 of its bytes (a directory: of its files' names and bytes), so an input that moved with
the same content still matches, and one changed in place is refused. The digests are kept in
the run file with each file's size and modification time, so that an input still where it
was, unchanged by those, is not read again on every resume.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.claim import Claim, Refusal, sorted_lines
from astra_agent.errors import CheckpointError, ConfigError
from astra_agent.runio import building_dir, config_differences, file_sha256
from training.metrics import METRICS_FILE, MetricsLog, StepRecord

FINAL_DIR = "final"
CONVERTED_DIR = "final-bf16"
VERL_CHECKPOINTS = "checkpoints"  # verl's trainer.default_local_dir
VERL_METRICS = "verl-metrics"  # a JSONL file of verl's file logger per launch
log = logging.getLogger(__name__)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
S = TypeVar("S", bound=StepRecord)


class ConvertOptions(BaseModel):
    """After training: the checkpoint converted for serving (``astra-serve convert``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = True
    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    out: Path | None = None  # default: OUTPUT_DIR/final-bf16


class TrainingConfig(BaseModel):
    """What ``astra-train sft`` and ``rl`` configs share for their run directory: the model to
    start from, the run directory, whether to resume and the conversion after training; the
    fields that name input files (``INPUTS``: a run is resumed by their content, not their
    paths), the run file and the command that writes it, and the fingerprint, what must match
    to resume: every field but ``UNSHAPING``'s (dotted paths: where the run directory is, how
    often it saves, how fast it runs: what does not shape the trained model), so that a moved
    or copied run directory, or one resumed with more threads, resumes."""

    model: Path = Field(description="HF checkpoint to start from")
    output_dir: Path = Field(description="run directory")
    resume: bool = Field(True, description="continue from the newest complete checkpoint")
    convert: ConvertOptions = Field(default_factory=ConvertOptions)

    INPUTS: ClassVar[tuple[str, ...]] = ()
    RUN_FILE: ClassVar[str] = ""
    COMMAND: ClassVar[str] = ""
    UNSHAPING: ClassVar[tuple[str, ...]] = ()

    def fingerprint(self) -> dict[str, Any]:
        keep = self.model_dump(mode="json")
        for path in self.UNSHAPING:
            *parents, name = path.split(".")
            section = keep
            for part in parents:
                section = section[part]
            del section[name]
        return keep


def check_model(path: Path) -> None:
    """``path`` must be a Hugging Face checkpoint with weights (a CheckpointError otherwise)."""
    from serving.checkpoint import open_hf_checkpoint

    open_hf_checkpoint(Path(path))


# ------------------------------------------------------------------ the run directory


class InputDigests:
    """SHA-256 digests of input files and directories, reusing those of ``memo`` (``{absolute
    path: [size, mtime_ns, sha256]}``) for files whose size and modification time are
    unchanged; ``seen`` is the memo of every file digested."""

    def __init__(self, memo: Any = None) -> None:
        self.memo: dict[str, Any] = dict(memo) if isinstance(memo, Mapping) else {}
        self.seen: dict[str, list[Any]] = {}

    _process: ClassVar[dict[tuple[str, int, int], str]] = {}  # digested by this process

    def file(self, path: Path) -> str:
        st = path.stat()
        key = str(path.resolve())
        old = self.memo.get(key)
        known = (key, st.st_size, st.st_mtime_ns)
        if isinstance(old, list) and len(old) == 3 and old[:2] == [st.st_size, st.st_mtime_ns]:
            sha = str(old[2])
        elif known in self._process:
            sha = self._process[known]
        else:
            sha = self._process[known] = file_sha256(path)
        self.seen[key] = [st.st_size, st.st_mtime_ns, sha]
        return sha

    def of(self, path: Path) -> str | None:
        """A file's digest; a directory's: of its files' names and digests (hidden ones, such
        as a download cache, left out); None where nothing is."""
        p = Path(path)
        if p.is_file():
            return self.file(p)
        if not p.is_dir():
            return None
        h = hashlib.sha256()
        for f in sorted(p.rglob("*")):
            rel = f.relative_to(p)
            if f.is_file() and not any(part.startswith(".") for part in rel.parts):
                h.update(f"{rel.as_posix()}\0{self.file(f)}\n".encode())
        return h.hexdigest()


def _known(old: Any, new: Any) -> Any:
    """``old`` without the keys ``new`` does not have (at every depth): what an older version
    fingerprinted and this one no longer does (where the run directory is, torch threads)
    does not stand in the way of a resume."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        return {k: _known(v, new[k]) for k, v in old.items() if k in new}
    return old


def _inputs(cfg: TrainingConfig, digests: InputDigests) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in cfg.INPUTS:
        value = getattr(cfg, name)
        if isinstance(value, list):
            out[name] = [digests.of(Path(v)) for v in value]
        else:
            out[name] = digests.of(Path(value))
    return out


def _without(fingerprint: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in fingerprint.items() if k not in names}


_OTHER_CONFIG = Refusal(
    "{dir} holds a run of a different config: {differences}",
    hint="use the same config to resume, or pick a new --output-dir",
    corrupt_hint="pick a new --output-dir",
)


def run_claim(cfg: TrainingConfig, run_name: str | None = None) -> Claim:
    """``output_dir`` claimed by the config's fingerprint in its run file (``run_name``,
    default: the config's ``RUN_FILE``), compared by :func:`_differences`."""
    return Claim(
        Path(cfg.output_dir),
        run_name or cfg.RUN_FILE,
        cfg.fingerprint(),
        _OTHER_CONFIG,
        compare=partial(_differences, cfg),
        dumps=sorted_lines,
    )


def write_run_file(cfg: TrainingConfig, run_name: str | None = None) -> None:
    """The run file: the config's fingerprint (input paths included, for the record), the
    inputs' content digests (what is matched), and the memo of the files digested."""
    claim, digests = run_claim(cfg, run_name), InputDigests()
    fingerprint, inputs = claim.fingerprint, _inputs(cfg, digests)
    matched = json.dumps(
        {"fingerprint": _without(fingerprint, cfg.INPUTS), "inputs": inputs},
        sort_keys=True,
    )
    digest = hashlib.sha256(matched.encode()).hexdigest()[:16]
    claim.write(
        {"fingerprint": fingerprint, "inputs": inputs, "digest": digest, "memo": digests.seen}
    )


def _differences(cfg: TrainingConfig, old: Any, new_fp: dict[str, Any]) -> list[str]:
    """How the config ``cfg`` (its fingerprint ``new_fp``) differs from the run file ``old``
    (empty: the same run): its fields (not where the run directory is), and its inputs by
    content. A run file written before inputs were matched by content is matched by their
    paths. A KeyError, TypeError or ValueError where ``old`` is not a run file."""
    old_fp = _known(dict(old["fingerprint"]), new_fp)
    old_inputs = old.get("inputs")
    if not isinstance(old_inputs, dict):
        return config_differences(old_fp, new_fp)
    names = cfg.INPUTS
    changed = config_differences(_without(old_fp, names), _without(new_fp, names))
    new_inputs = _inputs(cfg, InputDigests(old.get("memo")))
    for name in names:
        if old_inputs.get(name) == new_inputs.get(name):
            continue
        was, now = old_fp.get(name, "<unset>"), new_fp.get(name)
        changed.append(
            f"{name} ({now!r}: its content changed since the run started)"
            if was == now
            else f"{name} ({was!r} → {now!r}, other content)"
        )
    return changed


def check_run_dir(
    cfg: TrainingConfig, run_name: str | None = None, command: str | None = None
) -> bool:
    """Whether ``output_dir`` holds a run of this config to resume (its ``RUN_FILE`` and
    ``COMMAND`` are the defaults of ``run_name`` and ``command``); False where there is none
    yet or ``resume`` is off. Reads only: a ConfigError naming the keys if it holds a run of a
    different config, or what else is wrong with it (a directory that cannot be created or
    written: now, before any work, not an OSError from deep in a trainer)."""
    claim = run_claim(cfg, run_name)
    claim.check_place("output_dir", hint="pick a directory's path")
    if claim.check():
        return cfg.resume
    if claim.dir.exists() and any(claim.dir.iterdir()):
        raise ConfigError(
            f"{claim.dir} is not empty and holds no {claim.file}: not an "
            f"`{command or cfg.COMMAND}` run",
            hint="pick a new --output-dir",
        )
    return False


def prepare_run_dir(
    cfg: TrainingConfig, run_name: str | None = None, command: str | None = None
) -> bool:
    """:func:`check_run_dir`, then create ``output_dir`` with its run file where there is
    none yet; return whether a checkpoint should be resumed from."""
    resume = check_run_dir(cfg, run_name, command)
    if not run_claim(cfg, run_name).path.is_file():
        write_run_file(cfg, run_name)
    return resume


def set_aside(out: Path) -> Path | None:
    """Starting over (``resume: false``) in a directory that holds an earlier run's
    checkpoints or final model (verl's too): they are moved to ``OUTPUT_DIR/previous-N/``
    (with its metrics), so that a later resume cannot pick them up as this run's (a kill at step 2
    would otherwise resume from the earlier run's last checkpoint), an earlier ``final/``
    cannot pass for this run's, and nothing is deleted."""
    saved = (FINAL_DIR, CONVERTED_DIR, VERL_CHECKPOINTS, VERL_METRICS)
    old = [
        p
        for p in out.iterdir()
        if (p.name.startswith("checkpoint-") and p.is_dir()) or p.name in saved
    ]
    if not old:
        return None
    n = 1
    while (out / f"previous-{n}").exists():
        n += 1
    dest = out / f"previous-{n}"
    dest.mkdir()
    for p in [*old, out / METRICS_FILE]:
        if p.exists():
            p.rename(dest / p.name)
    log.warning("resume is off: the earlier run's checkpoints were moved to %s", dest)
    return dest


# ------------------------------------------------------------------ checkpoints


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why ``ckpt`` cannot be resumed from (None: it can): its ``trainer_state.json`` torn,
    its weights truncated or corrupt (each safetensors header against the file's size), a
    torch file (optimizer, scheduler, RNG state) that is not a whole archive, or a JSON file
    that does not parse. Cheap: the files' ends and headers are read, not their tensors."""
    from serving.checkpoint import open_hf_checkpoint

    try:
        checkpoint_step(ckpt)
        open_hf_checkpoint(ckpt)
    except CheckpointError as exc:
        return exc.message
    for p in sorted(ckpt.iterdir()):
        if p.suffix in (".pt", ".pth", ".bin"):
            try:
                with zipfile.ZipFile(p):  # torch.save's archive: its directory is at the end
                    pass
            except (OSError, zipfile.BadZipFile) as exc:
                return f"{p} is truncated or corrupt ({exc})"
        elif p.suffix == ".json":
            try:
                json.loads(p.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                return f"{p} is torn ({exc})"
    return None


def last_complete_checkpoint(output_dir: Path) -> Path | None:
    """The newest ``checkpoint-N`` that can be resumed from (see :func:`checkpoint_problem`).
    The Trainer writes its files in place, so a ``kill -9`` while it saves leaves one torn,
    and a full disk or a bad copy can truncate any of them: such a checkpoint is skipped, with
    a warning saying why, for the one before it."""
    if not output_dir.is_dir():
        return None
    found = []
    for p in output_dir.iterdir():
        m = _CHECKPOINT.match(p.name)
        if m and p.is_dir() and (p / "trainer_state.json").is_file():
            found.append((int(m.group(1)), p))
    for _, p in sorted(found, reverse=True):
        problem = checkpoint_problem(p)
        if problem is None:
            return p
        log.warning("%s skipped (killed while saving?): %s; using the one before it", p, problem)
    return None


def checkpoint_step(checkpoint: Path) -> int:
    state = checkpoint / "trainer_state.json"
    try:
        return int(json.loads(state.read_text(encoding="utf-8"))["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{state} is unreadable ({exc})", hint="delete that checkpoint"
        ) from None


def training_finished(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` ends its run: the Trainer's state there reached its
    ``max_steps``. (Resumed from, the Trainer would train one step more whenever
    ``max_steps`` is not a whole number of epochs.)"""
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
        step, last = int(state["global_step"]), int(state["max_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return 0 < last <= step


def converted_dir(cfg: TrainingConfig) -> Path:
    """Where ``final/`` is converted for serving: ``convert.out``, or ``OUTPUT_DIR/final-bf16``."""
    return Path(cfg.convert.out or cfg.output_dir / CONVERTED_DIR)


def save_final(out: Path, save: Callable[[str], Any], tokenizer: Any, serving: str) -> Path:
    """``OUT/final/``: the model (``save(dir)`` writes it) in HF layout with the serving chat
    template: written into a temp dir, renamed into place."""
    final = out / FINAL_DIR
    with building_dir(final) as tmp:
        save(str(tmp))
        tokenizer.chat_template = serving
        tokenizer.save_pretrained(str(tmp))
    return final


def convert_final(cfg: TrainingConfig, final: Path) -> Path | None:
    """``final/`` converted for serving (``convert``), or None where that is off."""
    if not cfg.convert.enabled:
        return None
    from serving.convert import convert_checkpoint

    target = converted_dir(cfg)
    return convert_checkpoint(final, target, dtype=cfg.convert.dtype, overwrite=True).dst


@dataclass(frozen=True)
class FinishedRun:
    """A rerun of a run that had finished: nothing trained."""

    checkpoint: Path
    steps: int
    final: Path
    converted: Path | None
    wrote: list[str]  # what was missing and was written from the checkpoint ([]: nothing)


def finished_run(
    cfg: TrainingConfig, checkpoint: Path | None, tokenizer: Any, serving: str
) -> FinishedRun | None:
    """None unless ``checkpoint`` ends its run. Then the run is not trained again: if its
    ``final/`` (and conversion, where on) is there, nothing is touched; if it was killed
    after its last checkpoint, what is missing is written from that checkpoint."""
    if checkpoint is None or not training_finished(checkpoint):
        return None
    final, wrote = cfg.output_dir / FINAL_DIR, []
    if not final.is_dir():
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(checkpoint), dtype=torch.float32, attn_implementation="sdpa"
        )
        save_final(cfg.output_dir, model.save_pretrained, tokenizer, serving)
        wrote.append(FINAL_DIR)
    converted = converted_dir(cfg) if cfg.convert.enabled else None
    if converted is not None and not converted.is_dir():
        convert_final(cfg, final)
        wrote.append(str(converted))
    return FinishedRun(checkpoint, checkpoint_step(checkpoint), final, converted, wrote)


# ------------------------------------------------------------------ the run object


def _saved_nothing(out: Path, run_name: str) -> bool:
    """``out`` holds a run directory in which nothing was trained or saved yet (a run that
    failed before its first checkpoint): no checkpoint (verl's included), no final model, no
    metrics."""
    if not (out / run_name).is_file():
        return False
    saved = (FINAL_DIR, CONVERTED_DIR, VERL_CHECKPOINTS)
    for p in out.iterdir():
        if p.name.startswith(("checkpoint-", "previous-")) or p.name in saved:
            return False
    logged = [out / METRICS_FILE, *(out / VERL_METRICS).glob("*.jsonl")]
    return not any(
        m.is_file() and m.read_text(encoding="utf-8", errors="replace").strip() for m in logged
    )


def _adoptable(cfg: TrainingConfig) -> bool:
    """Whether ``output_dir`` holds a run of another config (or a corrupt run file) that
    saved nothing: such a directory takes the new config (see :meth:`TrainingRun.begin`)."""
    claim = run_claim(cfg)
    if not _saved_nothing(claim.dir, claim.file):
        return False
    try:
        return bool(claim.differences(claim.recorded()))
    except ConfigError:
        return True  # a corrupt run file: replaced


@dataclass(frozen=True)
class TrainingRun:
    """One training run in ``cfg.output_dir``, opened once by its backend.

    :meth:`open` reads only: it checks the directory (a run of another config refused with
    the differences named, one that cannot be created refused before any work) and finds the
    checkpoint to resume from. :meth:`begin` writes the run directory, once everything that
    can be refused has been checked. With ``adopt_unsaved`` (RL), a directory whose run saved
    nothing takes the new config instead of refusing it: nothing of the old run can be lost,
    so a run that failed at its start does not lock its directory to the config that failed.
    """

    cfg: TrainingConfig  # an SFT or RL config
    resume: bool  # a run of this config is there to continue
    checkpoint: Path | None  # the newest complete checkpoint, where resumed
    adopt_unsaved: bool = False

    @classmethod
    def open(cls, cfg: TrainingConfig, *, adopt_unsaved: bool = False) -> TrainingRun:
        resume = not (adopt_unsaved and _adoptable(cfg)) and check_run_dir(cfg)
        ckpt = last_complete_checkpoint(Path(cfg.output_dir)) if resume else None
        return cls(cfg, resume, ckpt, adopt_unsaved)

    @property
    def output_dir(self) -> Path:
        return Path(self.cfg.output_dir)

    def finished(self, tokenizer: Any, serving: str) -> FinishedRun | None:
        """The rerun of a run that had finished (see :func:`finished_run`), or None."""
        return finished_run(self.cfg, self.checkpoint, tokenizer, serving)

    def begin(self) -> None:
        """Write the run directory and its run file (once the model has loaded: a refused
        input writes nothing); starting over (``resume: false``) sets the earlier run's
        checkpoints aside."""
        if self.adopt_unsaved and _adoptable(self.cfg):
            log.warning(
                "%s holds a run of another config that saved nothing: it starts anew",
                self.cfg.output_dir,
            )
            write_run_file(self.cfg)
        prepare_run_dir(self.cfg)
        if not self.resume:
            set_aside(self.output_dir)

    def metrics(self, record: type[S]) -> MetricsLog[S]:
        """``metrics.jsonl`` of ``record`` lines, cut back to the step of the checkpoint
        resumed from (a fresh run: emptied)."""
        step = checkpoint_step(self.checkpoint) if self.checkpoint else None
        metrics: MetricsLog[S] = MetricsLog(self.output_dir / METRICS_FILE, step)
        return metrics

    def save(self, trainer: Any, tokenizer: Any, serving: str) -> tuple[Path, Path | None]:
        """``final/`` from ``trainer`` (its weights checked first: a TRL trainer with the
        divergence guard) and, where on, its conversion."""
        trainer.check_weights()
        final = save_final(self.output_dir, trainer.save_model, tokenizer, serving)
        return final, convert_final(self.cfg, final)
