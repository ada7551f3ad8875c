"""One run directory as its readers hold it (:mod:`eval.rundir` reads it; the report, the
comparisons and the eval kinds use it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The training writers' kinds (astra-train; not plugins: eval/rundir.py reads them).
TRAINING_KINDS: tuple[str, ...] = ("sft", "rl")


@dataclass(frozen=True)
class Run:
    """One run directory as read: ``records`` for eval kinds (one per id, as plain JSON),
    ``metrics`` for training kinds (one per logged step); ``partial`` when the run is not
    complete or parts of it could not be read (``problems`` says which)."""

    path: Path
    name: str
    kind: str
    summary: dict[str, Any] | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] | None = None  # config.json, or the astra-*.json fingerprint
    partial: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def is_eval(self) -> bool:
        return self.kind not in TRAINING_KINDS

    @property
    def usable(self) -> bool:
        """Is there anything to show: records or a summary (evals), logged steps (training)?"""
        return bool(self.records or self.summary) if self.is_eval else bool(self.metrics)

    @property
    def model(self) -> str:
        """The model the run evaluated or trained ("" where not recorded)."""
        if self.summary and self.summary.get("model"):
            return str(self.summary["model"])
        fingerprint = (self.config or {}).get("fingerprint", self.config or {})
        return str(fingerprint.get("model") or "") if isinstance(fingerprint, dict) else ""
