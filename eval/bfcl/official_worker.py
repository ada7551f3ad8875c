"""Run by the official pipeline's own interpreter (``.venv-bfcl``), not imported by the harness:
scores single-turn cases with the official evaluator's entry functions and the handler of a
registry model. Standard library and ``bfcl_eval`` only.

stdin: ``{"model": registry name, "cases": [{"category", "id", "result"}, ...]}``, a case
scored against its entry in the installed data, or against its own ``functions`` and
``possible_answer`` where it brings them (hand-written cases); stdout: one JSON list, per case
``[valid, error_type]``, or ``{"raised": "Type: message"}`` where the official code raises
(its ``bfcl evaluate`` would stop there).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any


class _Entries:
    """Prompts and possible answers of the installed data, as the official evaluator loads
    them, by category and id."""

    def __init__(self) -> None:
        self.prompts: dict[str, dict[str, Any]] = {}
        self.answers: dict[str, dict[str, Any]] = {}

    def get(self, category: str, id: str) -> tuple[dict[str, Any], Any]:
        from bfcl_eval.utils import (
            is_relevance_or_irrelevance,
            load_dataset_entry,
            load_ground_truth_entry,
        )

        if category not in self.prompts:
            entries = load_dataset_entry(
                category, include_prereq=False, include_language_specific_hint=False
            )
            self.prompts[category] = {e["id"]: e for e in entries}
            if not is_relevance_or_irrelevance(category):
                gold = load_ground_truth_entry(category)
                self.answers[category] = {
                    e["id"]: g["ground_truth"] for e, g in zip(entries, gold, strict=True)
                }
        return self.prompts[category][id], self.answers.get(category, {}).get(id)


def _score(cases: list[dict[str, Any]], model: str) -> list[Any]:
    from bfcl_eval.constants.enums import Language, ReturnFormat
    from bfcl_eval.eval_checker import eval_runner as official
    from bfcl_eval.utils import is_java, is_js, is_relevance_or_irrelevance

    handler = official.get_handler(model)
    name = model.replace("/", "_")  # as the runner names a model, by its results directory
    entries = _Entries()
    out: list[Any] = []
    for case in cases:
        category, id, result = case["category"], case["id"], case["result"]
        if "functions" in case:
            prompt, answer = {"id": id, "function": case["functions"]}, case.get("possible_answer")
        else:
            prompt, answer = entries.get(category, id)
        if is_java(category):
            language, fmt = Language.JAVA, ReturnFormat.JAVA
        elif is_js(category):
            language, fmt = Language.JAVASCRIPT, ReturnFormat.JAVASCRIPT
        else:
            language, fmt = Language.PYTHON, ReturnFormat.PYTHON
        try:
            if is_relevance_or_irrelevance(category):
                verdict = official._evaluate_single_relevance_entry(
                    handler, id, result, prompt, name, category
                )
            else:
                verdict = official._evaluate_single_ast_entry(
                    handler,
                    id,
                    result,
                    answer,
                    prompt,
                    name,
                    category,
                    language=language,
                    return_format=fmt,
                    has_tool_call_tag=False,
                )
        except Exception as exc:
            out.append({"raised": f"{type(exc).__name__}: {exc}"})
            continue
        valid = bool(verdict["valid"])
        out.append([valid, None if valid else verdict.get("error_type")])
    return out


def main() -> None:
    request = json.load(sys.stdin)
    os.environ.setdefault("OPENAI_API_KEY", "unused")  # the handler builds a client it never uses
    with contextlib.redirect_stdout(sys.stderr):  # the official code prints as it goes
        out = _score(request["cases"], request["model"])
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
