"""Score our runs with the official decoder and checker (``bfcl-eval``), verdict by verdict:
multi-turn entries in this process, single-turn ones by the official pipeline in its own
environment (:mod:`eval.bfcl.official_single`); or export them for ``bfcl evaluate`` itself.

The official checker keeps backend instances in module globals keyed by model name and entry
id, and never removes them: each call here uses a fresh name and drops its instances after.
Its runner's turn-count check (``force_terminated``) is applied first, as the runner does.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astra_agent.errors import ConfigError
from astra_agent.runio import read_json_lines
from eval.bfcl.categories import (
    LIVE,
    MEMORY,
    MULTI_TURN,
    NON_LIVE,
    RUNNABLE,
    SINGLE_TURN,
    official_name,
)
from eval.bfcl.official import CATEGORIES, OFFICIAL_FC_MODEL, Entry, load_category

_names = itertools.count()
Verdict = tuple[bool, str | None]  # (valid, error type)


def _forget(name: str) -> None:
    """Drop the official executor's instances kept under names starting with ``name``."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils as mtu

    for key in [k for k in vars(mtu) if k.startswith(name)]:
        del vars(mtu)[key]


def official_execute(entry: Entry, steps: list[list[str]], tag: str) -> tuple[list[str], Any]:
    """Run call strings step by step with the official executor (its ``eval`` included: for
    trusted test input only) under the instance names ``{tag}_{entry.id}_{class}_instance``;
    return every result text and the instances after the last step."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils as mtu

    results: list[str] = []
    instances: Any = {}
    try:
        for step in steps:
            out, instances = mtu.execute_multi_turn_func_call(
                step,
                entry.initial_config,
                entry.involved_classes,
                tag,
                entry.id,
                long_context=entry.long_context,
            )
            results += out
    finally:
        _forget(tag)
    return results, instances


def official_verdict(entry: Entry, turns: list[list[list[str]]]) -> Verdict:
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as mtc

    if len(turns) != len(entry.ground_truth):
        return False, "multi_turn:force_terminated"
    name = f"astra_parity_{next(_names)}"
    test_entry = {
        "id": entry.id,
        "initial_config": entry.initial_config,
        "involved_classes": entry.involved_classes,
    }
    try:
        res = mtc.multi_turn_checker(
            turns, entry.ground_truth, test_entry, f"multi_turn_{entry.category}", name
        )
    finally:
        _forget(name)
    return bool(res["valid"]), res.get("error_type")


def official_decode(responses: list[list[Any]]) -> list[list[list[str]]]:
    """Raw per-turn, per-step model responses decoded by the official evaluator's own code
    (its function-calling decoder; steps that fail to decode or decode empty are skipped)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
        is_empty_execute_response,
    )
    from bfcl_eval.model_handler.utils import convert_to_function_call

    turns = []
    for turn in responses:
        steps = []
        for step in turn:
            try:
                calls = convert_to_function_call(step)
            except Exception:  # as the official evaluator: undecodable steps are skipped
                continue
            if not is_empty_execute_response(calls):
                steps.append(calls)
        turns.append(steps)
    return turns


def export_official(records: list[dict[str, Any]], out_dir: Path, model: str) -> list[Path]:
    """Our records in the official result-file layout (``<model>/<group>/BFCL_v4_<category>
    _result.json``): ``result`` holds what a function-calling handler stores, per turn and
    step for multi-turn (``[{name: json_args}]`` or the text), the reply for single-turn, for
    ``bfcl evaluate`` to decode and score itself."""
    files = []
    for cat in RUNNABLE:
        rows = sorted(
            (r for r in records if r["category"] == cat),
            key=lambda r: _index(r["id"]),
        )
        if not rows:
            continue
        target = out_dir / model.replace("/", "_") / _GROUP_DIR[cat]
        target.mkdir(parents=True, exist_ok=True)
        path = target / f"BFCL_v4_{official_name(cat)}_result.json"
        with path.open("w") as f:
            for r in rows:
                if cat in MULTI_TURN:
                    result = r.get("responses", r["decoded"])
                else:  # memory: its one turn of steps; single-turn: the reply
                    result = r.get("responses") if cat in MEMORY else r.get("result")
                f.write(json.dumps({"id": r["id"], "result": result}) + "\n")
        files.append(path)
    return files


_GROUP_DIR = {
    **{c: "non_live" for c in NON_LIVE},
    **{c: "live" for c in LIVE},
    **{c: "multi_turn" for c in MULTI_TURN},
    **{c: f"agentic/memory/{c.removeprefix('memory_')}" for c in MEMORY},
}


def _index(id_: str) -> tuple[int, ...]:
    """An entry id's numbers, in order (``live_simple_3-2-0`` → (3, 2, 0)): the official
    files' order."""
    return tuple(int(n) for n in re.findall(r"\d+", id_.rsplit("_", 1)[-1]))


def comparable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records a parity check compares: not those of inference errors (the official
    runner has its own record of those)."""
    return [r for r in records if r.get("error_kind") != "inference"]


def _differences(
    records: list[dict[str, Any]], official: Callable[[dict[str, Any]], Verdict]
) -> list[dict[str, Any]]:
    """Every :func:`comparable` record whose verdict differs from ``official(record)``
    (empty: full parity)."""
    out = []
    for r in comparable(records):
        ours = (bool(r["valid"]), None if r["valid"] else r["error_type"])
        theirs = official(r)
        if ours != theirs:
            out.append({"id": r["id"], "ours": ours, "official": theirs})
    return out


def compare(records: list[dict[str, Any]], bfcl: Path | None = None) -> list[dict[str, Any]]:
    """Every record whose verdict differs from the official checker's (empty: full parity).
    The official side decodes the raw responses itself, so our decoding is checked too.
    Multi-turn entries are checked in this process (the official multi-turn checker imports
    only the standard library); single-turn and memory ones by the official pipeline in its
    own environment, whose ``bfcl`` executable is ``bfcl`` (its interpreter beside it)."""
    multi = [r for r in records if r["category"] in MULTI_TURN]
    single = [r for r in comparable(records) if r["category"] in SINGLE_TURN]
    memory = [r for r in comparable(records) if r["category"] in MEMORY]
    entries = {e.id: e for c in CATEGORIES for e in load_category(c)} if multi else {}

    def official(r: dict[str, Any]) -> Verdict:
        turns = official_decode(r["responses"]) if "responses" in r else r["decoded"]
        return official_verdict(entries[r["id"]], turns)

    out = _differences(multi, official)
    for rows, field, scorer in (
        (single, "result", "official_single"),
        (memory, "responses", "official_memory"),
    ):
        if not rows:
            continue
        module = importlib.import_module(f"eval.bfcl.{scorer}")
        cases = [{"category": r["category"], "id": r["id"], "result": r.get(field)} for r in rows]
        got = module.official_verdicts(cases, _official_python(bfcl))
        verdicts = dict(zip((r["id"] for r in rows), got, strict=True))
        out += _differences(rows, lambda r: verdicts[r["id"]])  # noqa: B023 (called at once)
    return out


def _official_python(bfcl: Path | None) -> Path:
    """The interpreter of the official pipeline's environment: beside ``bfcl``, else the
    project's ``.venv-bfcl`` under the working directory."""
    python = (bfcl.parent if bfcl else Path(".venv-bfcl/bin")) / "python"
    if not python.is_file():
        raise ConfigError(
            f"single-turn entries are scored by the official pipeline in its own environment, "
            f"and there is no {python}",
            hint="make setup creates .venv-bfcl; or pass --official-bfcl PATH/TO/bin/bfcl",
        )
    return python


def run_bfcl_evaluate(
    bfcl: Path, result_dir: Path, score_dir: Path, categories: list[str], model: str
) -> dict[str, list[dict[str, Any]]]:
    """The official ``bfcl evaluate`` (``bfcl``: its executable, in a virtualenv of its own
    with all its pins), once for all ``categories``, with ``--partial-eval``; every path goes
    absolute (it resolves relative ones under ``BFCL_PROJECT_ROOT``). Returns, per category,
    the lines of its score file (the header first)."""
    bfcl, result_dir, score_dir = bfcl.resolve(), result_dir.resolve(), score_dir.resolve()
    if not bfcl.is_file():
        raise ConfigError(
            f"no official bfcl executable at {bfcl} (make setup creates .venv-bfcl/bin/bfcl)"
        )
    env = {**os.environ, "BFCL_PROJECT_ROOT": str(score_dir.parent), "OPENAI_API_KEY": "unused"}
    cats = ",".join(official_name(c) for c in categories)
    run = subprocess.run(
        [str(bfcl), "evaluate", "--model", model, "--partial-eval", "--test-category", cats,
         "--result-dir", str(result_dir), "--score-dir", str(score_dir)],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    out = {}
    for cat in categories:
        scores = list(score_dir.rglob(f"BFCL_v4_{official_name(cat)}_score.json"))
        if run.returncode != 0 or not scores:
            tail = (run.stdout + run.stderr)[-1500:]
            raise ConfigError(f"official bfcl evaluate failed for {cat}:\n{tail}")
        out[cat] = read_json_lines(scores[0])
    return out


def _error_type(line: dict[str, Any]) -> str | None:
    """A score-file line's error type: beside its error list (single-turn) or inside its
    error object (multi-turn)."""
    error = line.get("error")
    return line.get("error_type") or (error.get("error_type") if isinstance(error, dict) else None)


def official_evaluate(records: list[dict[str, Any]], bfcl: Path) -> list[dict[str, Any]]:
    """Score our exported results with the official ``bfcl evaluate`` itself and return every
    record whose verdict differs (empty: full parity). The export is named after an FC
    registry entry, so the official evaluator decodes our raw responses with its own
    function-calling decoder."""
    failing: dict[str, str | None] = {}  # id → official error type, over all categories
    with tempfile.TemporaryDirectory(prefix="astra-bfcl-official-") as tmp:
        work = Path(tmp).resolve()
        export_official(records, work / "result", OFFICIAL_FC_MODEL)
        cats = sorted({r["category"] for r in records})
        scores = run_bfcl_evaluate(bfcl, work / "result", work / "score", cats, OFFICIAL_FC_MODEL)
        for lines in scores.values():
            failing.update((x["id"], _error_type(x)) for x in lines[1:])
    return _differences(records, lambda r: (r["id"] not in failing, failing.get(r["id"])))
