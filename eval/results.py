"""A results directory that a run appends to and ``--resume`` continues: ``config.json`` (the
run's fingerprint) beside ``results.jsonl`` (one whole record per line)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from astra_agent.errors import ConfigError
from astra_agent.trajectory import drop_torn_tail

RESULTS = "results.jsonl"


def read_records(path: Path, key: str) -> dict[Any, dict[str, Any]]:
    """Records already written, by ``key``; a torn last line (kill -9 mid-write) is cut."""
    if not path.is_file():
        return {}
    drop_torn_tail(path)
    done = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise ConfigError(f"{path}:{n} is corrupt; move it away to start afresh") from None
        done[rec[key]] = rec
    return done


def prepare_results_dir(
    out: Path, fingerprint: dict[str, Any], resume: bool, key: str
) -> dict[Any, dict[str, Any]]:
    """Check ``out`` against this run (refuse results of another configuration, or any results
    without ``resume``), record the fingerprint, and return the records already there."""
    out.mkdir(parents=True, exist_ok=True)
    meta = out / "config.json"
    if (out / RESULTS).is_file() and meta.is_file():
        old = json.loads(meta.read_text())
        if not resume:
            raise ConfigError(
                f"{out} already holds results",
                hint="pass --resume to continue them, or choose another --out",
            )
        if old != fingerprint:
            diff = sorted(k for k in fingerprint if old.get(k) != fingerprint[k])
            raise ConfigError(
                f"{out} holds results of a different configuration ({', '.join(diff)} differ)",
                hint="use another --out",
            )
    tmp = meta.with_suffix(".tmp")
    tmp.write_text(json.dumps(fingerprint, indent=2))
    os.replace(tmp, meta)
    return read_records(out / RESULTS, key)
