"""Single-turn cases scored by the official pipeline: the installed ``bfcl-eval`` with all its
pins, in its own virtualenv, run as a subprocess (``official_worker.py``) with the handler
of the registry model our exports are named after (:data:`eval.bfcl.official.OFFICIAL_FC_MODEL`).
The reference for :mod:`eval.bfcl.ast_check` (tests and ``astra-eval bfcl parity``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from astra_agent.errors import ConfigError
from eval.bfcl.ast_check import CRASH
from eval.bfcl.official import OFFICIAL_FC_MODEL

WORKER = Path(__file__).with_name("official_worker.py")


def official_verdicts(
    cases: list[dict[str, Any]], bfcl_python: Path
) -> list[tuple[bool, str | None]]:
    """``(valid, error_type)`` per case, as the official evaluator gives it; where the official
    code raises, ``(False, CRASH)``. A case is ``{"category", "id", "result"}`` (the entry of
    the installed data), or brings its own ``functions`` and ``possible_answer``.
    ``bfcl_python``: the interpreter of the official pipeline's virtualenv."""
    if not bfcl_python.is_file():
        raise ConfigError(
            f"no interpreter of the official BFCL pipeline at {bfcl_python}",
            hint="make setup creates .venv-bfcl (bfcl-eval with all its pins)",
        )
    if not cases:
        return []
    keys = ("category", "id", "result", "functions", "possible_answer")
    payload = {
        "model": OFFICIAL_FC_MODEL,
        "cases": [{k: c[k] for k in keys if k in c} for c in cases],
    }
    run = subprocess.run(
        [str(bfcl_python), "-P", str(WORKER)],  # -P: the worker's folder stays off sys.path
        input=json.dumps(payload),
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        raise ConfigError(f"the official BFCL pipeline failed:\n{run.stderr[-1500:]}")
    out: list[tuple[bool, str | None]] = []
    for verdict in json.loads(run.stdout):
        if isinstance(verdict, dict):
            out.append((False, CRASH))
        else:
            out.append((bool(verdict[0]), verdict[1]))
    return out
