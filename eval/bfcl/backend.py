"""BFCL's stateful backends as an Environment: instances from ``initial_config``, calls
dispatched to their methods with parsed arguments. Model output never reaches ``eval()``."""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from typing import Any

from astra_agent.environment import ToolResult, ToolSpec
from eval.bfcl.official import Entry, openai_tools

# What the official executor refuses by name (its wording is kept).
BLOCKED = {"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"}


def new_instances(entry: Entry) -> dict[str, Any]:
    from bfcl_eval.constants.executable_backend_config import (
        CLASS_FILE_PATH_MAPPING,
        STATELESS_CLASSES,
    )

    out = {}
    for name in entry.involved_classes:
        instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
        if name not in STATELESS_CLASSES:
            config = copy.deepcopy(entry.initial_config.get(name, {}))
            instance._load_scenario(config, long_context=entry.long_context)
        out[name] = instance
    return out


def method_table(instances: dict[str, Any]) -> dict[str, Any]:
    table = {}
    for instance in instances.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                table[name] = method
    return table


def format_result(value: Any) -> str:
    """The official executor's text for a return value."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def invoke(table: dict[str, Any], name: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    """Run one call as the official executor would, minus ``eval``: same results, same errors."""
    try:
        if name in BLOCKED:
            raise Exception(f"Function call {name} is not allowed.")
        method = table.get(name)
        if method is None:
            raise NameError(f"name '{name}' is not defined")
        return format_result(method(*args, **kwargs))
    except Exception as exc:  # the official wording for any failure
        return f"Error during execution: {exc}"


def parse_call(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """``"f(1, b='x')"`` → ("f", [1], {"b": "x"}) with literals only (ast, never eval)."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name | ast.Attribute):
        raise ValueError(f"not a function call: {text!r}")
    name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    return name, args, kwargs


def execute_calls(table: dict[str, Any], calls: list[str]) -> list[str]:
    """Execute call strings (ground truth or decoded model calls) in order."""
    out = []
    for call in calls:
        try:
            name, args, kwargs = parse_call(call)
        except (SyntaxError, ValueError) as exc:
            out.append(f"Error during execution: {exc}")
            continue
        out.append(invoke(table, name, args, kwargs))
    return out


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """The official decoded form of a function-calling model's call: ``f(a=1,b='x')``."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def decode_step(responses: Any) -> list[str] | None:
    """One model step as the official function-calling harness decodes it: the step's calls
    ``[{name: json_arguments}, ...]`` become ``["name(a=1)", ...]``. None when the step does not
    decode — text, arguments that are not valid JSON or not an object — and the official
    harness then drops the whole step, even calls of it that would decode."""
    if not isinstance(responses, list):
        return None
    out = []
    for call in responses:
        if not isinstance(call, dict):
            return None
        for name, value in call.items():
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    return None
            if not isinstance(value, dict):
                return None
            out.append(call_string(name, value))
    return out


class BFCLEnvironment:
    """One entry's backend instances, alive for the whole entry (all its turns)."""

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.instances = new_instances(entry)
        self._table = method_table(self.instances)
        self._tools = [ToolSpec.from_openai(t) for t in openai_tools(entry)]
        self.executed: list[str] = []  # every result, in order (the response check uses them)

    def add_tools(self, schemas: list[dict[str, Any]]) -> None:
        """A held-out function arrives (miss_func)."""
        self._tools += [ToolSpec.from_openai(t) for t in schemas]

    async def list_tools(self) -> list[ToolSpec]:
        return list(self._tools)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        text = invoke(self._table, name, [], arguments)
        self.executed.append(text)
        return ToolResult(text, is_error=text.startswith("Error during execution:"))

    async def close(self) -> None:
        return None
