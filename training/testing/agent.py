"""The scripted teacher's rules for the interaction stage (tests): the agent, and a tool.

``scripted_agent(body)`` answers a chat request that offers tools, as the agent of an episode:

* its plan is the offered tools the user's question mentions — by the first sentence of the
  tool's description (what the scripted ``tasks`` rule writes into questions) or by its name
  in words (``get_current_time`` → "get current time") — in the order the question mentions
  them; a question that mentions none is answered in text, without a call;
* it calls the plan's tools one per step, in order, each with arguments built from the tool's
  schema (:func:`scripted_arguments`); a call whose result is an error (text starting
  ``Error``) is retried once with the same arguments, then the plan moves on;
* after the last tool it answers in text, quoting the results.

The ``simulate_tool`` rule (:func:`simulate_reply`) plays a tool: from the prompt's ``Tool (JSON):``
and ``Arguments (JSON):`` lines it returns ``{"error": false, "output": …}``, an object built
from the tool's output schema where it has one, else the arguments echoed with an ``id`` and a
``status``; the same call always gets the same answer.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from astra_agent.testing.scripted_server import Reply
from training.synth.envs.sandboxed import JSON_TYPES
from training.testing.rules import ScriptedPlants, clause, rule

QUOTED = re.compile(r'"([^"\n]{1,200})"|“([^”\n]{1,200})”')
TOOL_LINE = re.compile(r"^Tool \(JSON\): (.*)$", re.MULTILINE)
ARGS_LINE = re.compile(r"^Arguments \(JSON\): (.*)$", re.MULTILINE)
_WORDS = re.compile(r"[_\-\s.]+|(?<=[a-z0-9])(?=[A-Z])")
_TYPES = {k: v for k, v in JSON_TYPES.items() if k != "null"}  # the schema types it fills


# ------------------------------------------------------------------ arguments from a schema


def _kind(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if not isinstance(kind, str):
        kind = "object" if "properties" in schema else "string"
    return kind


def _fits(value: Any, schema: dict[str, Any]) -> bool:
    kind = _kind(schema)
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES.get(kind, (object,)))


def _first_string(source: dict[str, Any]) -> str | None:
    return next((v for v in source.values() if isinstance(v, str) and v), None)


def scripted_value(
    name: str, schema: Any, source: dict[str, Any], quoted: list[str], *, every: bool = False
) -> Any:
    """A value for the parameter ``name``: the same key in ``source`` (the last result; an
    ``…id`` parameter also takes its ``id``), the schema's const/enum/default, else by type — a
    string from ``quoted`` (consumed) or ``source``, 1, false, one item, an object of the
    required properties (``every``: of all of them)."""
    if not isinstance(schema, dict):
        return name
    for key in (name, "id") if name.lower().endswith("id") else (name,):
        if key in source and _fits(source[key], schema):
            return source[key]
    for word in ("const", "default"):
        if word in schema:
            return schema[word]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    match _kind(schema):
        case "string":
            return quoted.pop(0) if quoted else _first_string(source) or name
        case "integer":
            return int(schema.get("minimum", 1))
        case "number":
            return schema.get("minimum", 1)
        case "boolean":
            return False
        case "array":
            count = max(1, int(schema.get("minItems", 1)))
            return [scripted_value(name, schema.get("items", {}), source, quoted)] * count
        case "object":
            return scripted_object(schema, source, quoted, every=every)
    return None


def scripted_object(
    schema: dict[str, Any], source: dict[str, Any], quoted: list[str], *, every: bool = False
) -> dict[str, Any]:
    props = schema.get("properties") or {}
    required = schema.get("required") or []
    names = [n for n in props if every or n in required]
    names += [n for n in required if isinstance(n, str) and n not in props]
    return {n: scripted_value(n, props.get(n, {}), source, quoted, every=every) for n in names}


def scripted_arguments(
    schema: dict[str, Any], question: str, last_result: str | None
) -> dict[str, Any]:
    """The agent's arguments: the schema's required parameters, strings taken from the
    question's quoted values (in order) or from the last tool result."""
    quoted = [a or b for a, b in QUOTED.findall(question)]
    return scripted_object(schema, _as_object(last_result), quoted)


def _as_object(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    if isinstance(value, list) and value:
        value = value[0]
    return value if isinstance(value, dict) else {}


# ------------------------------------------------------------------ the agent


def scripted_plan(question: str, tools: Sequence[dict[str, Any]]) -> list[str]:
    """The offered tools the question mentions, in the order it mentions them."""
    text = question.lower()
    found: list[tuple[int, str]] = []
    for tool in tools:
        fn = tool.get("function", tool)
        name = str(fn.get("name", ""))
        keys = [clause(str(fn.get("description") or "")).lower()]
        words = [w for w in _WORDS.split(name) if w]
        if len(words) >= 2:
            keys.append(" ".join(words).lower())
        hits = [text.find(k) for k in keys if k and k in text]
        if hits:
            found.append((min(hits), name))
    return [name for _, name in sorted(found)]


def _results(messages: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(tool, arguments JSON, result text) of every call so far, in order."""
    asked: dict[str, tuple[str, str]] = {}
    out: list[tuple[str, str, str]] = []
    for m in messages:
        if m.get("role") == "assistant":
            for call in m.get("tool_calls") or []:
                fn = call.get("function") or {}
                asked[str(call.get("id"))] = (str(fn.get("name")), str(fn.get("arguments") or "{}"))
        elif m.get("role") == "tool":
            name, args = asked.get(str(m.get("tool_call_id")), ("", "{}"))
            content = m.get("content")
            out.append((name, args, content if isinstance(content, str) else json.dumps(content)))
    return out


def _failed(text: str) -> bool:
    return text.lstrip().startswith("Error")


def scripted_agent(body: dict[str, Any]) -> Reply:
    """The agent's next step for a chat request with tools (see the module)."""
    tools = [t.get("function", t) for t in body.get("tools") or []]
    messages = body.get("messages") or []
    question = next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), "")
    plan = scripted_plan(question, tools)
    if not plan:
        return Reply(content="I cannot help with that using the tools I have.")
    step, tries, retry, last_ok = 0, 0, "{}", None
    done: list[tuple[str, str]] = []
    for name, args, text in _results(messages):
        if not _failed(text):
            last_ok = text
        if step < len(plan) and name == plan[step]:
            if _failed(text) and tries == 0:
                tries, retry = 1, args
                continue
            if not _failed(text):
                done.append((name, text))
            step, tries = step + 1, 0
    if step < len(plan):
        name = plan[step]
        if tries:
            return Reply(reasoning=f"{name} failed; trying it once more.",
                         tool_calls=[(name, retry)])  # fmt: skip
        schema = next(t.get("parameters") or {} for t in tools if t.get("name") == name)
        built = scripted_arguments(schema, question, last_ok)
        return Reply(reasoning=f"Next, {name}.", tool_calls=[(name, json.dumps(built))])
    if not done:
        return Reply(content="I could not finish this: every tool I called returned an error.")
    found = "; ".join(f"{n}: {t[:200]}" for n, t in done)
    return Reply(reasoning="I have every result I need.", content=f"Here is what I found. {found}")


# ------------------------------------------------------------------ a simulated tool


def _line(pattern: re.Pattern[str], text: str) -> Any:
    found = pattern.findall(text)
    return json.loads(found[-1]) if found else {}


@rule("simulate_tool")
def simulate_reply(name: str, prompt_text: str, plants: ScriptedPlants) -> dict[str, Any]:
    """The rule's answer to a ``simulate_tool`` prompt (see the module)."""
    tool = _line(TOOL_LINE, prompt_text)
    args = _line(ARGS_LINE, prompt_text)
    args = args if isinstance(args, dict) else {}
    tool_name = str(tool.get("name", "tool"))
    key = json.dumps([tool_name, args], sort_keys=True).encode()
    rid = f"{tool_name[:12]}-{hashlib.sha256(key).hexdigest()[:8]}"
    returns = tool.get("returns")
    if isinstance(returns, dict) and returns.get("properties"):
        source = {"id": rid, **args}
        return {"error": False, "output": scripted_object(returns, source, [], every=True)}
    return {"error": False, "output": {"id": rid, "status": "ok", **args}}
