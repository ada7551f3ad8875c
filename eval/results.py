"""A results directory that a run appends to and ``--resume`` continues: ``config.json`` (what
the run's results depend on) beside ``results.jsonl`` (one whole, typed record per line; when
an id appears twice, as after ``--retry-errors``, the later record wins) and ``summary.json``.

What must match for ``--resume`` is the *fingerprint*: the served model id and the sampling,
never the URL text, so a server moved to another port (or ``localhost`` for ``127.0.0.1``)
resumes with a warning while a different model behind the same URL is refused. ``config.json``
is the directory's :class:`~astra_agent.claim.Claim`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from astra_agent.claim import Claim, Refusal
from astra_agent.errors import ConfigError
from astra_agent.model import ModelConfig
from astra_agent.runio import (
    differing_keys,
    drop_torn_tail,
    numbered_lines,
    probe_writable,
)
from astra_agent.runio import write_json_atomic as write_json_atomic  # config.json's layout
from astra_agent.trajectory import FailureKind

log = logging.getLogger(__name__)

RESULTS = "results.jsonl"
CONFIG = "config.json"
SUMMARY = "summary.json"
FORMAT = 2  # 1: untyped records, the endpoint URL in the fingerprint (refused on --resume)

# Why an entry has no score of its own: the endpoint failed (``inference``) or running the
# entry raised (``run``). Both are re-run by ``--retry-errors``.
ErrorKind = Literal["inference", "run"]
# How an inference error failed to get an answer: the endpoint was never reached.
UNREACHABLE: tuple[FailureKind, ...] = ("unreachable", "timeout", "dropped")


class EvalRecord(BaseModel):
    """What every eval writes per entry; each eval's record extends it."""

    model_config = ConfigDict(extra="forbid")

    id: str
    error: str | None = None  # what went wrong, for people
    error_kind: ErrorKind | None = None  # what went wrong, for code
    endpoint_failure: FailureKind | None = None  # how the endpoint failed (inference errors)

    @property
    def unreachable(self) -> bool:
        """Did this entry fail because the endpoint could not be reached at all?"""
        return self.error_kind == "inference" and self.endpoint_failure in UNREACHABLE


R = TypeVar("R", bound=EvalRecord)


class RunMeta(BaseModel):
    """``config.json``: the run's eval kind (:mod:`eval.kinds`; runs written before it was
    recorded lack it), the fingerprint that ``--resume`` compares, and the endpoint (only
    warned about when it differs)."""

    model_config = ConfigDict(extra="forbid")

    format: int = FORMAT
    kind: str | None = None
    fingerprint: dict[str, Any]
    base_url: str | None = None

    def written(self) -> dict[str, Any]:
        """``config.json`` as written: without ``kind`` where it is not known."""
        return self.model_dump(mode="json", exclude={"kind"} if self.kind is None else None)


def model_fingerprint(config: ModelConfig, served_model: str) -> dict[str, Any]:
    """The model part of a fingerprint: the id the endpoint serves plus the sampling settings
    (``ModelConfig.fingerprint`` without the URL and the configured name)."""
    sampling = {k: v for k, v in config.fingerprint().items() if k not in ("base_url", "model")}
    return {"model": served_model, **sampling}


def ensure_writable_dir(out: Path, what: str = "results") -> None:
    """Create ``out`` and prove a file can be written there, before any work starts."""
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"cannot write {what} to {out}: it is a file, not a directory",
            hint="--out names a directory",
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe_writable(out)
    except OSError as exc:
        raise ConfigError(
            f"cannot write {what} to {out}: {exc.strerror or exc}",
            hint="choose a writable --out",
        ) from None


def read_results(path: Path, record: type[R]) -> dict[str, R]:
    """Records already written, by id (the later of two with one id wins); a torn last line
    (kill -9 mid-write) is cut."""
    if not path.is_file():
        return {}
    drop_torn_tail(path)
    done: dict[str, R] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a results file (not UTF-8 text)") from None
    for n, line in numbered_lines(text):
        try:
            rec = record.model_validate_json(line)
        except ValidationError as exc:
            raise ConfigError(
                f"{path}:{n} is not a {record.__name__} record "
                f"({exc.errors()[0]['msg']} at {'.'.join(map(str, exc.errors()[0]['loc']))})",
                hint="results of an older astra-eval or of another eval: use another --out",
            ) from None
        done[rec.id] = rec
    return done


_OTHER_RUN = Refusal(
    other="{dir} holds results of a different configuration ({differences} differ)",
    hint="use another --out",
    joiner=", ",
    corrupt="{dir} holds results of an older astra-eval (or a corrupt {name}), which --resume "
    "cannot check",
)


def _read_meta(claim: Claim) -> RunMeta:
    data = claim.recorded()
    try:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("older format")
        return RunMeta.model_validate(data)
    except ValueError as exc:  # ValidationError included
        raise claim.corrupt(exc) from None


def prepare_results_dir(out: Path, meta: RunMeta, resume: bool, record: type[R]) -> dict[str, R]:
    """Check ``out`` against this run (refuse results of another configuration, or any results
    without ``resume``), record ``meta``, and return the records already there."""
    ensure_writable_dir(out)
    results = out / RESULTS
    claim = Claim(out, CONFIG, meta.fingerprint, _OTHER_RUN, "fingerprint", differing_keys)
    has_results = results.is_file() and results.stat().st_size > 0
    if has_results and not resume:
        raise ConfigError(
            f"{out} already holds results",
            hint="pass --resume to continue them, or choose another --out",
        )
    if has_results:
        if not claim.path.is_file():
            raise ConfigError(
                f"{out} holds results without {CONFIG}: cannot tell what they were run with",
                hint="use another --out",
            )
        old = _read_meta(claim)
        claim.refuse_other(old.written())
        if old.base_url != meta.base_url:
            log.warning(
                "%s was run against %s; resuming against %s (same model and sampling)",
                out,
                old.base_url,
                meta.base_url,
            )
    claim.write(meta.written())
    return read_results(results, record)
