"""BFCL memory by the official pipeline: the reference for :mod:`eval.bfcl.memory`.

Two sides in one file. The harness calls :func:`official_verdicts`, which runs this file with
the interpreter of the official pipeline's own virtualenv (``.venv-bfcl``: ``bfcl-eval`` with
all its pins) as ``python -P official_memory.py``. Run that way it imports only the standard
library and ``bfcl_eval``, reads one JSON request on stdin and writes one JSON answer:

- ``{"mode": "score", "model": registry name, "cases": [{"category", "id", "result"}, ...]}``:
  each stored result scored by the official ``_evaluate_single_agentic_entry`` (with the
  registry model's handler decoding the steps) against the entry's gold answers in the
  installed data, or against the case's own ``possible_answer``; per case ``[valid,
  error_type]``, or ``{"raised": "Type: message"}`` where the official code raises.
- ``{"mode": "entries", "categories": [...]}``: per category, the scored questions in the
  official order (``id``, ``scenario``, ``ground_truth``, ``depends_on``) and every
  prerequisite conversation's ``id`` in the order the official generator runs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKER = Path(__file__)


def official_verdicts(
    cases: list[dict[str, Any]], bfcl_python: Path, model: str | None = None
) -> list[tuple[bool, str | None]]:
    """``(valid, error_type)`` per case as the official agentic checker gives it; where the
    official code raises, ``(False, memory.CRASH)``. ``bfcl_python``: the official
    pipeline's interpreter; ``model``: the registry model whose handler decodes (default:
    the one our exports are named after)."""
    from eval.bfcl.memory import CRASH
    from eval.bfcl.official import OFFICIAL_FC_MODEL

    if not cases:
        return []
    keys = ("category", "id", "result", "possible_answer")
    request = {
        "mode": "score",
        "model": model or OFFICIAL_FC_MODEL,
        "cases": [{k: c[k] for k in keys if k in c} for c in cases],
    }
    out: list[tuple[bool, str | None]] = []
    for verdict in ask_official(request, bfcl_python):
        if isinstance(verdict, dict):
            out.append((False, CRASH))
        else:
            out.append((bool(verdict[0]), verdict[1]))
    return out


def ask_official(request: dict[str, Any], bfcl_python: Path) -> Any:
    """One request to this file run by the official pipeline's interpreter; its answer."""
    from astra_agent.errors import ConfigError

    if not bfcl_python.is_file():
        raise ConfigError(
            f"no interpreter of the official BFCL pipeline at {bfcl_python}",
            hint="make setup creates .venv-bfcl (bfcl-eval with all its pins)",
        )
    run = subprocess.run(
        [str(bfcl_python), "-P", str(WORKER)],  # -P: this file's folder stays off sys.path
        input=json.dumps(request),
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        raise ConfigError(f"the official BFCL pipeline failed:\n{run.stderr[-1500:]}")
    return json.loads(run.stdout)


# ------------------------------------------------------------------ the official side


def _prompts_and_gold(category: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Question entries and gold answers by id, loaded and aligned as the official evaluator
    aligns them (by position)."""
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

    prompts = load_dataset_entry(
        category, include_prereq=False, include_language_specific_hint=False
    )
    gold = load_ground_truth_entry(category)
    # without their function docs, which the official checker drops before it reads an entry
    by_id = {p["id"]: {k: v for k, v in p.items() if k != "function"} for p in prompts}
    answers = {p["id"]: g["ground_truth"] for p, g in zip(prompts, gold, strict=True)}
    return by_id, answers


def _score(cases: list[dict[str, Any]], model: str) -> list[Any]:
    from bfcl_eval.eval_checker import eval_runner as official

    handler = official.get_handler(model)
    name = model.replace("/", "_")
    loaded: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    out: list[Any] = []
    for case in cases:
        category, id_ = case["category"], case["id"]
        if category not in loaded:
            loaded[category] = _prompts_and_gold(category)
        prompts, answers = loaded[category]
        prompt = dict(prompts.get(id_, {"id": id_, "question": []}))
        answer = case["possible_answer"] if "possible_answer" in case else answers[id_]
        try:
            verdict = official._evaluate_single_agentic_entry(
                handler, id_, case["result"], answer, prompt, name, category
            )
        except Exception as exc:
            out.append({"raised": f"{type(exc).__name__}: {exc}"})
            continue
        valid = bool(verdict["valid"])
        out.append([valid, None if valid else verdict["error"]["error_type"]])
    return out


def _entries(categories: list[str]) -> dict[str, Any]:
    from bfcl_eval.utils import is_memory_prereq, load_dataset_entry, sort_key

    out = {}
    for category in categories:
        entries = load_dataset_entry(category, include_prereq=True)
        prompts, answers = _prompts_and_gold(category)
        prereq = [e for e in entries if is_memory_prereq(e["id"])]
        out[category] = {
            "questions": [
                {
                    "id": p["id"],
                    "scenario": p["scenario"],
                    "ground_truth": answers[p["id"]],
                    "depends_on": p["depends_on"],
                }
                for p in prompts.values()
            ],
            "prerequisites": [e["id"] for e in sorted(prereq, key=sort_key)],
        }
    return out


def main() -> None:
    request = json.load(sys.stdin)
    os.environ.setdefault("OPENAI_API_KEY", "unused")  # the handler builds a client it never uses
    with contextlib.redirect_stdout(sys.stderr):  # the official code prints as it goes
        if request["mode"] == "score":
            out: Any = _score(request["cases"], request["model"])
        else:
            out = _entries(request["categories"])
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
