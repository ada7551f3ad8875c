"""A tool of a synthesized environment and the checks it must pass before it is kept.

A tool is an OpenAI function schema and the Python source of a function of that name (its mock
data at module level). :func:`check_tool` accepts it only when, cheapest first,

``bad_schema``
    its parameters are a JSON-schema object and each reference call's arguments fit them;
``does_not_compile`` / ``no_function`` / ``not_stdlib``
    the source compiles, defines the function at top level and imports only the standard
    library (no relative imports);
``answer_in_arguments``
    no reference call is handed its own answer in its arguments (as a whole word or number:
    a sub-answer "3" is not in "ORD-1234");
``load_failed`` / ``call_failed`` / ``call_timeout`` / ``call_crashed``
    in the bubblewrap sandbox (:class:`~astra_agent.sandbox.Sandbox`, the one RL runs it in) the
    source loads, and each reference call, in order, returns without error in time: network,
    processes and writes outside ``/tmp`` are refused there, and the sandbox's message is what
    the failure says;
``forbidden_operation`` / ``thread_left`` / ``too_much_output``
    neither its load nor any call (the probe's too) tried an operation the sandbox refused —
    even one whose error the code caught and went on —, left a thread running, or printed more
    than ``max_printed`` characters (the sandbox's conduct report,
    :func:`eval.arenas.checks.conduct_finding`);
``no_answer``
    each call's output (the text the model would read) contains its sub-answer, as the arena
    reward matches it (:class:`~astra_agent.arena.AnswerMatch`);
``answer_for_other_arguments`` / ``answer_without_arguments``
    with ``probe``: each call's *blind call* — in a fresh state, every value of the task in its
    arguments replaced (strings, numbers, booleans, enum choices, inside arrays and objects
    too) — does *not* return its sub-answer as a whole word or number
    (:func:`eval.arenas.checks.blind_call`). Whatever its signature: a tool with nothing to
    vary (no parameters, only a boolean…) that returns the sub-answer returns it to anyone,
    so it cannot be the tool of a sub-question (``answer_without_arguments``).
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.arena import AnswerMatch
from astra_agent.environment import ToolSpec
from astra_agent.errors import ConfigError
from astra_agent.sandbox import Sandbox, SandboxLimits, bwrap_available
from eval.arenas.checks import (
    Finding,
    answer_in_arguments,
    blind_call,
    conduct_finding,
)
from training.synth.text import cut_text

NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
_NAME = re.compile(NAME_PATTERN)
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}
OUTPUT_KEEP = 2000  # of each reference call's output, kept in the record
MATCH = AnswerMatch()


class EnvTool(BaseModel):
    """One tool of an environment: what the model sees and the source the sandbox runs."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    description: str
    parameters: dict[str, Any]
    source: str
    serves: list[str] = Field(default_factory=list)  # the sub-question ids it answers, in order
    merged: str = ""  # "" (written for one sub-question), "rule" or "teacher"

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)


@dataclass(frozen=True)
class Call:
    """A reference call: the sub-question it answers, its arguments, the answer it must show."""

    subquestion: str
    arguments: dict[str, Any]
    answer: str


class EnvStep(BaseModel):
    """One reference call of an environment: the sub-question, the tool that answers it, its
    arguments and answer, the output the tool gave in the sandbox (cut; filled in by the
    checks)."""

    model_config = ConfigDict(extra="forbid")

    subquestion: str
    question: str
    tool: str
    arguments: dict[str, Any]
    answer: str
    output: str = ""

    def call(self) -> Call:
        return Call(self.subquestion, self.arguments, self.answer)


# Why a tool was refused: a fixed ``reason`` code and the message (the sandbox's own where the
# sandbox refused it), which is also what the teacher is told on a retry.
Failure = Finding


# ------------------------------------------------------------------ cheap checks


def _type_ok(value: Any, kind: Any) -> bool:
    kinds = kind if isinstance(kind, list) else [kind]
    for k in kinds:
        allowed = JSON_TYPES.get(k) if isinstance(k, str) else None
        if allowed is None:
            return True  # a type we do not check
        if isinstance(value, bool) and k in ("integer", "number"):
            continue
        if isinstance(value, allowed):
            return True
    return False


def schema_problem(parameters: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """What is wrong with ``parameters`` (a JSON schema of type object) or with ``arguments``
    as a call of it, or None."""
    if parameters.get("type") != "object" or not isinstance(parameters.get("properties"), dict):
        return 'parameters must be a JSON schema {"type": "object", "properties": {...}}'
    props: dict[str, Any] = parameters["properties"]
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return "parameters.required must be a list of parameter names"
    for name, prop in props.items():
        if not _NAME.match(name):
            return f"parameter name {name!r} is not an identifier"
        if not isinstance(prop, dict) or "type" not in prop:
            return f"parameter {name!r} needs a schema with a type"
    missing = [r for r in required if r not in props]
    if missing:
        return f"required names no parameter: {', '.join(missing)}"
    unknown = [a for a in arguments if a not in props]
    if unknown:
        return f"the arguments name unknown parameters: {', '.join(unknown)}"
    absent = [r for r in required if r not in arguments]
    if absent:
        return f"the arguments lack required parameters: {', '.join(absent)}"
    for name, value in arguments.items():
        prop = props[name]
        if not _type_ok(value, prop["type"]):
            return f"argument {name}={value!r} is not of type {prop['type']}"
        if isinstance(prop.get("enum"), list) and value not in prop["enum"]:
            return f"argument {name}={value!r} is not one of its enum {prop['enum']}"
    return None


def static_problem(name: str, source: str) -> Failure | None:
    """Compiles, defines ``name`` at top level, imports the standard library only."""
    try:
        tree = ast.parse(source, f"<tool {name}>")
        compile(tree, f"<tool {name}>", "exec")
    except SyntaxError as exc:
        why = f"the code does not compile: SyntaxError: {exc.msg} (line {exc.lineno})"
        return Failure("does_not_compile", why)
    except (ValueError, RecursionError) as exc:  # NUL bytes, absurd nesting
        return Failure("does_not_compile", f"the code does not compile: {exc}")
    defined = any(
        (isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name)
        or (
            isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
        )
        for n in tree.body
    )
    if not defined:
        return Failure("no_function", f"the code does not define a function named {name!r}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            return Failure("not_stdlib", "the code uses a relative import")
        mods = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        for mod in mods:
            top = mod.split(".")[0]
            if top not in sys.stdlib_module_names:
                return Failure("not_stdlib", f"the code imports {mod!r}, not a standard library "
                               "module (only the standard library is available)")  # fmt: skip
    return None


def cut(text: str, limit: int) -> str:
    return cut_text(text, limit, "…[{:,} chars cut]")


# ------------------------------------------------------------------ the sandbox


def require_sandbox() -> None:
    """Tools are only ever proven in bubblewrap: refuse to start without it."""
    if not bwrap_available():
        raise ConfigError(
            "bubblewrap (bwrap) is not installed: synthesized tool code is run only inside it",
            hint="apt-get install bubblewrap",
        )


async def _sandbox_calls(
    name: str,
    source: str,
    calls: Sequence[Call],
    parameters: dict[str, Any],
    limits: SandboxLimits,
    probe: bool,
    max_printed: int,
) -> list[str] | Failure:
    async with Sandbox({name: source}, limits) as sandbox:
        if name in sandbox.load_errors:
            why = f"the tool does not load in the sandbox: {sandbox.load_errors[name]}"
            return Failure("load_failed", why)
        loaded = sandbox.load_conduct.get(name)
        if loaded and (found := conduct_finding(loaded, f"loading {name}", max_printed)):
            return found
        outputs: list[str] = []
        for call in calls:
            reply = await sandbox.call(name, call.arguments)
            args = json.dumps(call.arguments, ensure_ascii=False)
            if not reply.ok:
                reason = {"timeout": "call_timeout", "crash": "call_crashed"}.get(
                    reply.kind, "call_failed"
                )
                why = f"calling {name}({args}) failed in the sandbox: {cut(reply.error, 1500)}"
                return Failure(reason, why)
            if found := conduct_finding(reply.conduct, f"calling {name}({args})", max_printed):
                return found
            text = reply.text()
            if not MATCH.found(call.answer, text):
                why = (
                    f"the output of {name}({args}) does not contain the sub-answer "
                    f"{call.answer!r}: {cut(text, 600)}"
                )
                return Failure("no_answer", why)
            outputs.append(text)
        for call in calls if probe else ():
            found = await blind_call(
                sandbox, name, parameters, call.arguments, [call.answer], max_printed
            )
            if found:
                return found
        return outputs


async def check_tool(
    name: str,
    source: str,
    parameters: dict[str, Any],
    calls: Sequence[Call],
    *,
    limits: SandboxLimits,
    probe: bool = True,
    max_printed: int | None = None,
    slots: asyncio.Semaphore | None = None,
) -> list[str] | Failure:
    """Every check of the module, cheapest first: each call's output (cut), or the failure.
    ``max_printed``: characters a load or a call may print (default: the sandbox's cap)."""
    if not _NAME.match(name):
        return Failure("bad_schema", f"the tool name {name!r} is not an identifier")
    for call in calls:
        problem = schema_problem(parameters, call.arguments)
        if problem:
            return Failure("bad_schema", problem)
    static = static_problem(name, source)
    if static:
        return static
    for call in calls:
        if answer_in_arguments(call.arguments, [call.answer]) is not None:
            why = (
                f"the arguments of the call for {call.subquestion} contain its answer "
                f"{call.answer!r}: the tool must find it, not be given it"
            )
            return Failure("answer_in_arguments", why)
    bound = limits.output_cap_chars if max_printed is None else max_printed
    run = _sandbox_calls(name, source, calls, parameters, limits, probe, bound)
    if slots is None:
        result = await run
    else:
        async with slots:
            result = await run
    return result if isinstance(result, Failure) else [cut(o, OUTPUT_KEEP) for o in result]
