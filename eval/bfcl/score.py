"""Score result files of the official pipeline with our checker, into the official layout.

Input: what ``bfcl generate`` writes, ``RESULT_DIR/<model>/multi_turn/BFCL_v4_multi_turn_<category>
_result.json`` (``BFCL_v3_`` names are read too), one JSON object per line with ``id`` and
``result`` (per turn, per step: the raw model response, ``[{name: json_arguments}]`` for a
function-calling model, or its text). Each file is decoded as the official function-calling
decoder decodes it and scored with :func:`eval.bfcl.checker.check_entry`.

Output: what ``bfcl evaluate`` writes, ``SCORE_DIR/<model>/multi_turn/BFCL_v4_multi_turn_<category>
_score.json`` (a header line ``{"accuracy", "correct_count", "total_count"}``, then one line per
failing entry, with its error type and message), and ``SCORE_DIR/data_multi_turn.csv``. Entries
present are scored (the official ``--partial-eval``); categories absent count 0 in the overall
accuracy and show as N/A, as there. Differences: the CSV names a model by its result folder (the
official one uses its registry's display name), the failing entries' ``details`` are ours.

    astra-eval bfcl score results/ --out scores/    # the official `bfcl evaluate`, our checker

    >>> from eval.bfcl.score import score_official_results
    >>> summary = score_official_results(Path("results"), Path("scores"))  # doctest: +SKIP
    >>> summary["models"]["my-model"]["accuracy"]["base"]  # doctest: +SKIP
    0.675
"""

from __future__ import annotations

import json
import logging
import re
from functools import cache
from pathlib import Path
from typing import Any

from astra_agent.errors import ConfigError
from astra_agent.runio import (
    numbered_lines,
    read_json_lines,
    write_lines_atomic,
    write_text_atomic,
)
from eval.bfcl.backend import decode_step
from eval.bfcl.checker import TurnVerdict, check_entry
from eval.bfcl.official import CATEGORIES, Entry, function_docs, load_category, package_dir

log = logging.getLogger(__name__)
RESULT_FILE = re.compile(r"^BFCL_v[34]_multi_turn_(\w+?)_result\.json$")
NOT_A_LIST = "Error during inference phase. Model did not output a list of model responses."
COLUMNS = ["Base", "Miss Func", "Miss Param", "Long Context"]


@cache
def _prompts(category: str) -> dict[str, dict[str, Any]]:
    """The official prompt entries (as a score file shows them: without the function docs)."""
    path = package_dir() / "data" / f"BFCL_v4_multi_turn_{category}.json"
    rows = read_json_lines(path)
    out = {}
    for r in rows:
        prompt = {k: v for k, v in r.items() if k != "function"}
        if prompt.get("missed_function"):  # there, the held-out names become their docs
            docs = {d["name"]: d for c in r["involved_classes"] for d in function_docs(c)}
            prompt["missed_function"] = {
                t: [docs[n] for n in names] for t, names in prompt["missed_function"].items()
            }
        out[r["id"]] = prompt
    return out


def _read_results(path: Path, category: str) -> list[dict[str, Any]]:
    """One result file's rows, sorted by entry index; any malformed line is a ConfigError."""
    known = {e.id: len(e.ground_truth) for e in load_category(category)}
    rows: dict[str, dict[str, Any]] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read result file {path}: {exc}") from exc
    for n, line in numbered_lines(text):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"{path}:{n}: not a JSON line ({exc})") from exc
        if not isinstance(row, dict) or "id" not in row or "result" not in row:
            raise ConfigError(f"{path}:{n}: a result line needs 'id' and 'result'")
        if row["id"] not in known:
            raise ConfigError(
                f"{path}:{n}: unknown id {row['id']!r} for multi_turn_{category}",
                hint="the file's name says its category: ids must be of that category",
            )
        if row["id"] in rows:
            raise ConfigError(f"{path}:{n}: id {row['id']!r} appears twice")
        result = row["result"]
        decoded = isinstance(result, list) and len(result) == known[row["id"]]
        if decoded and not all(isinstance(turn, list | str | dict) for turn in result):
            raise ConfigError(f"{path}:{n}: a turn of the result is not a list of steps")
        rows[row["id"]] = row
    return sorted(rows.values(), key=lambda r: int(str(r["id"]).rsplit("_", 1)[1]))


def decode_result(result: list[Any]) -> list[list[list[str]]]:
    """Per turn, the steps that decode to calls (the others are skipped, as there)."""
    turns = []
    for turn in result:  # a text or an object iterates as the official decoder iterates it
        if not isinstance(turn, list | str | dict):
            raise ConfigError(f"a turn of a result is not a list of steps: {turn!r:.80}")
        steps = [decode_step(step) for step in turn]
        turns.append([s for s in steps if s])
    return turns


def _message(v: TurnVerdict, result: list[Any], entry: Entry) -> str | list[str]:
    match v.error_type:
        case "multi_turn:force_terminated":
            return [
                "Model was force-terminated during inference phase. The length of the model "
                f"result turns ({len(result)}) does not match the length of the ground truth "
                f"turns ({len(entry.ground_truth)})."
            ]
        case "multi_turn:empty_turn_model_response":
            return f"Model response list is empty for turn {v.turn}"
        case "multi_turn:instance_state_mismatch":
            return (
                f"Model instance for {v.details.get('class')} does not match the state with "
                "ground truth instance."
            )
        case _:
            return (
                "Model response execution results so far does not contain all the ground "
                f"truth response execution results for turn {v.turn}."
            )


def score_row(row: dict[str, Any], entry: Entry, model: str) -> dict[str, Any] | None:
    """None for a passing entry, else its line of the score file."""
    result = row["result"]
    base = {"id": entry.id, "model_name": model, "test_category": f"multi_turn_{entry.category}"}
    prompt = _prompts(entry.category)[entry.id]
    tail = {"possible_answer": entry.ground_truth, "inference_log": row.get("inference_log", "")}
    if not isinstance(result, list) or len(result) != len(entry.ground_truth):
        error: dict[str, Any]
        if isinstance(result, list):
            v = TurnVerdict(False, None, "multi_turn:force_terminated")
            error = {"error_message": _message(v, result, entry), "error_type": v.error_type}
        else:
            error = {"error_message": [NOT_A_LIST], "error_type": "multi_turn:inference_error"}
        return {
            **base,
            "valid": False,
            "error": error,
            "prompt": prompt,
            "model_result": result,
        } | tail
    decoded = decode_result(result)
    v = check_entry(entry, decoded)
    if v.valid:
        return None
    error = {"error_message": _message(v, result, entry), "error_type": v.error_type}
    if v.details:
        error["details"] = v.details
    return {
        **base,
        "valid": False,
        "error": error,
        "prompt": prompt,
        "model_result_raw": result,
        "model_result_decoded": decoded,
        **tail,
    }


def _write_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_lines_atomic(path, (json.dumps(r, ensure_ascii=False, default=repr) + "\n" for r in rows))


def score_file(path: Path, category: str, model: str, score_dir: Path) -> dict[str, Any]:
    entries = {e.id: e for e in load_category(category)}
    rows = _read_results(path, category)
    failing = [f for r in rows if (f := score_row(r, entries[r["id"]], model)) is not None]
    correct = len(rows) - len(failing)
    header = {
        "accuracy": correct / len(rows) if rows else 0.0,
        "correct_count": correct,
        "total_count": len(rows),
    }
    out = score_dir / model / "multi_turn" / f"BFCL_v4_multi_turn_{category}_score.json"
    _write_lines(out, [header, *failing])
    return header


def _result_files(result_dir: Path) -> dict[str, dict[str, Path]]:
    """model (its folder under ``result_dir``) → category → result file."""
    if not result_dir.is_dir():
        raise ConfigError(f"no result directory at {result_dir}")
    found: dict[str, dict[str, Path]] = {}
    for path in sorted(result_dir.rglob("BFCL_v*_multi_turn_*_result.json")):
        match = RESULT_FILE.match(path.name)
        if not match or match[1] not in CATEGORIES:
            continue
        rel = path.relative_to(result_dir).parts
        model = rel[0] if len(rel) > 1 else result_dir.resolve().name
        other = found.setdefault(model, {}).get(match[1])
        if other is not None and other.parent == path.parent and other.name != path.name:
            # BFCL_v3_ and BFCL_v4_ files side by side: the official evaluator reads v4 only
            v3, v4 = sorted([other, path], key=lambda p: p.name)
            log.warning("%s: scoring %s, not the older %s", model, v4.name, v3.name)
            found[model][match[1]] = v4
            continue
        if other is not None:
            raise ConfigError(f"two result files for {model}/{match[1]}: {other} and {path}")
        found[model][match[1]] = path
    if not found:
        raise ConfigError(
            f"no multi-turn result files under {result_dir}",
            hint="expected <model>/multi_turn/BFCL_v4_multi_turn_<category>_result.json",
        )
    return found


def _percent(value: float | None) -> str:
    return "N/A" if value is None else f"{value * 100:.2f}%"


def write_csv(score_dir: Path, models: dict[str, dict[str, Any]]) -> Path:
    """``data_multi_turn.csv`` as the official evaluator writes it (ranked by overall)."""
    ranked = sorted(models.items(), key=lambda kv: kv[1]["overall"], reverse=True)
    lines = ["Rank,Model,Multi Turn Overall Acc," + ",".join(COLUMNS)]
    for rank, (model, s) in enumerate(ranked, 1):
        cells = [_percent(s["accuracy"].get(c)) for c in CATEGORIES]
        lines.append(",".join([str(rank), model, _percent(s["overall"]), *cells]))
    path = score_dir / "data_multi_turn.csv"
    write_text_atomic(path, "\n".join(lines))  # no final newline, as there
    return path


def score_official_results(result_dir: Path, score_dir: Path) -> dict[str, Any]:
    """Score every multi-turn result file under ``result_dir`` into ``score_dir``; return
    ``{"models": {model: {"accuracy": {category: 0..1}, "counts": {...}, "overall": 0..1}},
    "score_dir": str}`` (overall: the mean over the four categories, absent ones as 0)."""
    files = _result_files(result_dir)  # all input checked before anything is written
    for cats in files.values():
        for category, path in cats.items():
            _read_results(path, category)
    try:
        score_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the score directory {score_dir}: {exc}") from exc
    models: dict[str, dict[str, Any]] = {}
    for model, cats in files.items():
        heads = {c: score_file(p, c, model, score_dir) for c, p in cats.items()}
        accuracy = {c: h["accuracy"] for c, h in heads.items()}
        models[model] = {
            "accuracy": accuracy,
            "counts": {c: h["total_count"] for c, h in heads.items()},
            "correct": {c: h["correct_count"] for c, h in heads.items()},
            "overall": sum(accuracy.values()) / len(CATEGORIES),
        }
    write_csv(score_dir, models)
    return {"models": models, "score_dir": str(score_dir)}
