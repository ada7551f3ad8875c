"""The official BFCL-V3 multi-turn data, read from the installed ``bfcl-eval`` package.

Every file is JSON Lines despite its ``.json`` name. Nothing is copied into this repository.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from astra_agent.errors import ConfigError
from astra_agent.runio import read_json_lines

PINNED = "2026.3.23"
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
# The official harness's function-calling type mapping (Gorilla → OpenAPI/JSON schema).
TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}
PY_NOTE = " Note that the provided function is in Python 3 syntax."
# A registry entry of the official package whose handler talks to any OpenAI-compatible chat
# endpoint in function-calling mode (and decodes with the FC decoder): used to run the official
# pipeline against our endpoints, and to name our exported results for `bfcl evaluate`.
OFFICIAL_FC_MODEL = "openbmb/MiniCPM-SALA-FC"


def package_dir() -> Path:
    """The installed bfcl-eval's package directory; an error if it is missing or is not the
    pinned release (its data, gold answers and checker semantics are what is scored)."""
    try:
        import bfcl_eval
    except ImportError as exc:
        raise ConfigError(
            f"bfcl-eval is not installed (make setup installs bfcl-eval=={PINNED} "
            "without its dependencies)"
        ) from exc
    installed = installed_version()
    if installed != PINNED:
        raise ConfigError(
            f"bfcl-eval {installed} is installed, but this harness is pinned to {PINNED} (its "
            "data, gold answers and checker semantics are what it scores and holds parity with)",
            hint=f"pip install --no-deps bfcl-eval=={PINNED} (make setup does)",
        )
    return Path(bfcl_eval.__file__).parent


def installed_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bfcl-eval")
    except PackageNotFoundError:
        return None


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return read_json_lines(path)


@dataclass(frozen=True)
class Entry:
    id: str
    category: str
    question: list[list[dict[str, Any]]]  # per turn, the user messages (empty: a held-out turn)
    initial_config: dict[str, Any]
    involved_classes: list[str]
    missed_function: dict[str, list[str]]  # turn index (as a string) → functions held out
    ground_truth: list[list[str]]  # per turn, Python call strings

    @property
    def long_context(self) -> bool:
        return self.category == "long_context"


@cache
def load_category(category: str) -> tuple[Entry, ...]:
    if category not in CATEGORIES:
        raise ConfigError(f"unknown category {category!r}: choose from {', '.join(CATEGORIES)}")
    data = package_dir() / "data"
    name = f"BFCL_v4_multi_turn_{category}.json"
    questions = _jsonl(data / name)
    answers = {a["id"]: a["ground_truth"] for a in _jsonl(data / "possible_answer" / name)}
    return tuple(
        Entry(
            q["id"],
            category,
            q["question"],
            q["initial_config"],
            q["involved_classes"],
            q.get("missed_function") or {},
            answers[q["id"]],
        )
        for q in questions
    )


@cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    path = (
        package_dir()
        / "data"
        / "multi_turn_func_doc"
        / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    )
    return tuple(_jsonl(path))


def _schema(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _schema(v) for k, v in node.items()}
        if isinstance(out.get("type"), str):
            out["type"] = TYPES.get(out["type"], out["type"])
        return out
    if isinstance(node, list):
        return [_schema(v) for v in node]
    return node


def openai_tools(entry: Entry, *, include_missed: bool = False) -> list[dict[str, Any]]:
    """OpenAI function schemas for the entry's classes, as the official FC harness builds them
    (types mapped, the Python note appended); held-out functions left out unless asked."""
    missed = set() if include_missed else {f for fs in entry.missed_function.values() for f in fs}
    return class_tools(entry.involved_classes, missed)


def class_tools(classes: Iterable[str], left_out: Collection[str] = ()) -> list[dict[str, Any]]:
    """The OpenAI function schemas of the classes' functions (new objects), but those named in
    ``left_out``, as the official FC harness builds them."""
    tools = []
    for cls in classes:
        for doc in function_docs(cls):
            if doc["name"] in left_out:
                continue
            tools.append(
                {
                    "type": "function",
                    "function": {
                        "name": doc["name"],
                        "description": doc["description"] + PY_NOTE,
                        "parameters": _schema(doc["parameters"]),
                    },
                }
            )
    return tools


def held_out_tools(entry: Entry, turn: int) -> list[dict[str, Any]]:
    names = set(entry.missed_function.get(str(turn), []))
    return [t for t in openai_tools(entry, include_missed=True) if t["function"]["name"] in names]
