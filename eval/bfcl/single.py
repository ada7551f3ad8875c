"""BFCL's single-turn categories (non-live and live: AST, irrelevance, relevance) in
function-calling mode, as the official handler for OpenAI-compatible endpoints runs them.

Per entry, one chat request: the entry's first-turn messages as they are (no system prompt is
added), and its functions as tools, rewritten as the official handler rewrites them: the
language note appended to each description; for Java and JavaScript every parameter becomes
a string described in that language's terms; dots in names become underscores (OpenAI's
name rule); Gorilla types mapped to JSON-schema types (``float`` also marked as such in its
description). Nothing is sent when an entry has no functions. The reply is stored in the
official result format: the calls as ``[{name: arguments_text}]`` when the reply carries a
``tool_calls`` list (an empty one too, as vLLM sends), else the reply's text; it is then
scored by :func:`eval.bfcl.ast_check.single_turn_verdict`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from astra_agent.errors import ConfigError
from astra_agent.model import ChatModel
from astra_agent.runio import read_json_lines
from eval.bfcl.ast_check import fc_function_name
from eval.bfcl.categories import RELEVANCE, SINGLE_TURN
from eval.bfcl.official import package_dir

# Gorilla (and Java) types → JSON-schema types, as the official function-calling handlers map
# them; a type not listed becomes "string".
OPENAPI_TYPES = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
    "byte": "integer",
    "short": "integer",
    "long": "integer",
    "double": "number",
    "char": "string",
    "ArrayList": "array",
    "Array": "array",
    "HashMap": "object",
    "Hashtable": "object",
    "Queue": "array",
    "Stack": "array",
    "Any": "string",
    "String": "string",
    "Bigint": "integer",
}


@dataclass(frozen=True)
class SingleEntry:
    id: str
    category: str
    question: list[list[dict[str, Any]]]  # per turn, the messages (only the first is sent)
    functions: list[dict[str, Any]]  # as in the data file
    ground_truth: list[dict[str, Any]] | None  # None for relevance and irrelevance


@cache
def load_single(category: str) -> tuple[SingleEntry, ...]:
    if category not in SINGLE_TURN:
        raise ConfigError(f"not a single-turn BFCL category: {category!r}")
    data = package_dir() / "data"
    name = f"BFCL_v4_{category}.json"
    rows = read_json_lines(data / name)
    gold: dict[str, Any] = {}
    if category not in RELEVANCE:
        gold = {
            a["id"]: a["ground_truth"] for a in read_json_lines(data / "possible_answer" / name)
        }
    return tuple(
        SingleEntry(r["id"], category, r["question"], r["function"], gold.get(r["id"]))
        for r in rows
    )


def count_single(category: str) -> int:
    """The entry count of a single-turn category: its data file's lines (one entry each), not
    parsed (the summary weighs the live categories that did not run by their size: parsing the
    six took ≈0.4 s at the end of every run)."""
    if category not in SINGLE_TURN:
        raise ConfigError(f"not a single-turn BFCL category: {category!r}")
    data = (package_dir() / "data" / f"BFCL_v4_{category}.json").read_bytes()
    return sum(1 for line in data.split(b"\n") if line.strip())


def language(category: str) -> str:
    if category == "simple_java":
        return "java"
    if category == "simple_javascript":
        return "javascript"
    return "python"


_HINTS = {
    "java": " Note that the provided function is in Java 8 SDK syntax.",
    "javascript": " Note that the provided function is in JavaScript syntax.",
    "python": " Note that the provided function is in Python 3 syntax.",
}
_LANGUAGE_NAME = {"java": "Java", "javascript": "JavaScript"}


def _as_strings(properties: dict[str, Any], lang: str) -> None:
    """Java/JavaScript: every parameter is sent as a string, its type told in words."""
    word = _LANGUAGE_NAME[lang]
    for value in properties.values():
        if value["type"] == "any":
            value["description"] += (
                f" This parameter can be of any type of {word} object in string representation."
            )
        else:
            value["description"] += (
                f" This is {word} {value['type']} type parameter in string representation."
            )
        if value["type"] in (("ArrayList", "Array") if lang == "java" else ("array",)):
            value["description"] += (
                f" The list elements are of type {value['items']['type']}; they are not in "
                "string representation."
            )
            del value["items"]
        if lang == "javascript" and value["type"] == "dict" and "properties" in value:
            value["description"] += (
                " The dictionary entries have the following schema; they are not in string "
                f"representation. {json.dumps(value['properties'])}"
            )
            del value["properties"]
        value["type"] = "string"


def _openapi(properties: dict[str, Any]) -> dict[str, Any]:
    """Gorilla types → JSON-schema types, into nested properties and (two levels of) items."""
    for value in properties.values():
        if "type" not in value:
            value["type"] = "string"
        else:
            if value["type"] == "float":
                value["format"] = "float"
                value["description"] += " This is a float type value."
            value["type"] = OPENAPI_TYPES.get(value["type"], "string")
        if value["type"] not in ("array", "object"):
            continue
        if "properties" in value:
            value["properties"] = _openapi(value["properties"])
        elif "items" in value:
            items = value["items"]
            items["type"] = OPENAPI_TYPES[items["type"]]
            if items["type"] == "array" and "items" in items:
                items["items"]["type"] = OPENAPI_TYPES[items["items"]["type"]]
            elif items["type"] == "object" and "properties" in items:
                items["properties"] = _openapi(items["properties"])
    return properties


def fc_tools(entry: SingleEntry) -> list[dict[str, Any]]:
    """The entry's functions as the official FC handler sends them (see the module's doc)."""
    lang = language(entry.category)
    tools = []
    for function in copy.deepcopy(entry.functions):
        function["description"] += _HINTS[lang]
        if lang != "python":
            _as_strings(function["parameters"]["properties"], lang)
        function["name"] = fc_function_name(function["name"])
        function["parameters"]["type"] = "object"
        function["parameters"]["properties"] = _openapi(function["parameters"]["properties"])
        tools.append({"type": "function", "function": function})
    return tools


def messages(entry: SingleEntry) -> list[dict[str, Any]]:
    return copy.deepcopy(entry.question[0])


async def infer(entry: SingleEntry, model: ChatModel) -> Any:
    """One request; the reply in the official result format."""
    turn = await model.complete(messages(entry), fc_tools(entry) or None)
    if turn.tool_calls or turn.raw.get("tool_calls_list"):
        return [{c.name: c.arguments} for c in turn.tool_calls]
    return turn.content
