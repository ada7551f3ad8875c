"""BFCL's single-turn verdict (AST and relevance categories), our own code, held to the
official ``bfcl evaluate`` entry by entry (``tests/eval/test_bfcl_ast.py``).

The model result is what an OpenAI-compatible function-calling handler stores: a list of
``{function_name: arguments_json}`` (one per tool call) or, when the reply had no tool calls,
the reply's text. Function names were sent with dots turned into underscores (the handler of
``openbmb/MiniCPM-SALA-FC``, ``underscore_to_dot``), so an expected ``math.hypot`` is looked
for as ``math_hypot``.

An AST entry is decoded (``ast_decoder:decoder_failed``), its shape checked
(``ast_decoder:decoder_wrong_output_format``), then checked against the possible answers:
one call for ``simple`` categories, one call of the expected function among several for
``multiple``, and for ``parallel`` every expected call matched by a distinct model call in any
order. Per parameter: required ones present, no parameter the function or the answer lacks,
the language's type rules (Java and JavaScript values arrive as source text and are parsed
first), then the value among the allowed ones (``""`` in an allowed list: may be omitted).
Relevance entries pass when the result decodes to at least one call; irrelevance entries
when it does not (decoding fails, or gives no call).

Official behaviours matched on purpose, odd as some are:

- Strings compare after dropping spaces and ``,./-_*^``, lower-cased, ``'`` read as ``"``;
  inside dicts and lists too, but a string given where another type is declared ("a
  variable", when the allowed values are of another type than declared) compares exactly.
- A Python ``float`` parameter takes an ``int``; an ``int`` parameter refuses a ``float``; in
  a list of floats an ``int`` element is refused.
- Parallel matching is greedy: each expected call takes the first model call that fits, so a
  model call fitting two expected ones can make a valid set fail.
- Decoding: a text reply is undecodable, except the empty text, which decodes to no call
  (as does ``{}``); only the first key of a call object counts; arguments that decode to
  JSON other than an object (``null``, a list) fail the format check, and count as no call
  for (ir)relevance.
- A list parameter whose allowed values include ``""`` also takes ``[]``; with ``""`` among
  the allowed values of a list of dicts, the element type check always passes.
- Java ``String`` values are taken verbatim (quotes kept), JavaScript ``String`` values lose
  one pair of surrounding quotes; Java ``char`` is never parsed; Java ``String[]`` elements
  keep their quotes, ``ArrayList<String>`` elements lose their first and last character; a
  Java ``long`` needs its ``L``. A JavaScript object's values lose their quotes and are then
  read as numbers where they look like one; the object ends at its first ``}``.
- Where the official checker raises (its ``bfcl evaluate`` would stop), the verdict is
  invalid with ``ast_checker:crash``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from astra_agent.errors import ConfigError
from eval.bfcl.categories import RELEVANCE, SINGLE_TURN

CRASH = "ast_checker:crash"


@dataclass(frozen=True)
class AstVerdict:
    valid: bool
    error_type: str | None = None  # the official error type, e.g. "value_error:string"
    errors: tuple[str, ...] = ()  # what was wrong, in the official wording where practical
    decoded: list[dict[str, Any]] | None = None  # [{name: {param: value}}]; None: undecodable


def fc_function_name(name: str) -> str:
    """The name a function is offered (and must be called) under in FC mode."""
    return name.replace(".", "_")


# ---------------------------------------------------------------- decoding


def decode_fc(result: Any) -> list[dict[str, Any]]:
    """``[{name: arguments}]`` from a stored FC result; ValueError where the official
    decoder raises."""
    if isinstance(result, str | dict):
        if result:
            raise ValueError(f"not a list of tool calls: {_short(result)}")
        return []  # the empty text (or object) iterates as no call
    if not isinstance(result, list | tuple):
        raise ValueError(f"not a list of tool calls: {_short(result)}")
    calls = []
    for item in result:
        if not isinstance(item, dict) or not item:
            raise ValueError(f"a tool call is not a non-empty object: {_short(item)}")
        name = next(iter(item))
        text = item[name]
        if not isinstance(text, str | bytes | bytearray):
            raise ValueError(f"arguments of {name!r} are not a JSON string: {_short(text)}")
        try:
            calls.append({name: json.loads(text)})
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"arguments of {name!r} are not JSON: {exc}") from None
    return calls


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _calls_shaped(decoded: list[dict[str, Any]]) -> bool:
    return all(type(next(iter(c.values()))) is dict for c in decoded)


# ---------------------------------------------------------------- entry points


def single_turn_verdict(
    category: str,
    functions: list[dict[str, Any]],
    possible_answer: list[dict[str, Any]] | None,
    result: Any,
) -> AstVerdict:
    """The official verdict of one single-turn entry (see the module's docstring)."""
    if category in RELEVANCE:
        return _relevance_verdict(category, result)
    if category not in SINGLE_TURN:
        known = ", ".join(SINGLE_TURN)
        raise ConfigError(f"not a single-turn category: {category!r} (known: {known})")
    if possible_answer is None:
        raise ConfigError(f"category {category} needs the possible answers")
    try:
        decoded = decode_fc(result)
    except ValueError as exc:
        return AstVerdict(False, "ast_decoder:decoder_failed", (f"Failed to decode: {exc}",))
    if not _calls_shaped(decoded):
        msg = "Did not output in the specified format (each call's arguments an object)."
        return AstVerdict(False, "ast_decoder:decoder_wrong_output_format", (msg,), decoded)
    try:
        failure = _check_calls(category, functions, decoded, possible_answer)
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
        msg = f"the official checker raises here ({type(e).__name__}: {e})"
        return AstVerdict(False, CRASH, (msg,), decoded)
    if failure is None:
        return AstVerdict(True, decoded=decoded)
    return AstVerdict(False, failure.error_type, failure.errors, decoded)


def _relevance_verdict(category: str, result: Any) -> AstVerdict:
    try:
        decoded: list[dict[str, Any]] | None = decode_fc(result)
    except ValueError:
        decoded = None
    called = bool(decoded) and _calls_shaped(decoded or [])
    if "irrelevance" in category:
        if not called:
            return AstVerdict(True, decoded=decoded)
        msg = "Valid syntax. Successfully decode AST when it should not."
        return AstVerdict(False, "irrelevance_error:decoder_success", (msg,), decoded)
    if called:
        return AstVerdict(True, decoded=decoded)
    msg = "Invalid syntax. Failed to decode AST when it should have."
    return AstVerdict(False, "relevance_error:decoder_failed", (msg,), decoded)


# ---------------------------------------------------------------- call level


@dataclass(frozen=True)
class _Fail:
    error_type: str
    errors: tuple[str, ...]


def _fail(error_type: str, *errors: str) -> _Fail:
    return _Fail(error_type, errors)


def _language(category: str) -> str:
    if "javascript" in category:
        return "javascript"
    return "java" if "java" in category else "python"


def _doc(functions: list[dict[str, Any]], name: str) -> Any:
    return next((f for f in functions if f["name"] == name), None)


def _check_calls(
    category: str, functions: list[dict[str, Any]], calls: list[dict[str, Any]], gold: list[Any]
) -> _Fail | None:
    lang = _language(category)
    if "parallel" in category:
        return _check_unordered(functions, calls, gold, lang)
    if "multiple" in category:  # one call, of the expected function among those offered
        if len(calls) != len(gold):
            return _fail("multiple_function_checker:wrong_count", "Wrong number of functions.")
        return _check_call(_doc(functions, next(iter(gold[0]))), calls[0], gold[0], lang)
    if len(calls) != 1:
        return _fail("simple_function_checker:wrong_count", "Wrong number of functions.")
    return _check_call(functions[0], calls[0], gold[0], lang)


def _check_unordered(
    functions: list[dict[str, Any]], calls: list[dict[str, Any]], gold: list[Any], lang: str
) -> _Fail | None:
    """Greedy, as the official checker: each expected call takes the first unused model call
    that fits it."""
    if len(calls) != len(gold):
        return _fail("parallel_function_checker_no_order:wrong_count", "Wrong number of functions.")
    used: set[int] = set()
    for i, expected in enumerate(gold):
        doc = _doc(functions, next(iter(expected)))
        misses = []
        for j, call in enumerate(calls):
            if j in used:
                continue
            failure = _check_call(doc, call, expected, lang)
            if failure is None:
                used.add(j)
                break
            misses.append(f"model call {j}: {failure.error_type}: {' '.join(failure.errors)}")
        else:
            free = [j for j in range(len(calls)) if j not in used]
            head = (
                f"Could not find a matching function among index {free} of model output "
                f"for index {i} of possible answers."
            )
            return _fail("parallel_function_checker_no_order:cannot_find_match", head, *misses)
    return None


def _check_call(
    doc: Any, call: dict[str, Any], expected: dict[str, Any], lang: str
) -> _Fail | None:
    allowed = next(iter(expected.values()))
    name = fc_function_name(doc["name"])
    props, required = doc["parameters"]["properties"], doc["parameters"]["required"]
    if name not in call:
        msg = f"Function name {name!r} not found in model output."
        return _fail("simple_function_checker:wrong_func_name", msg)
    args = call[name]
    for p in required:
        if p not in args:
            msg = f"Missing required parameter: {p!r}."
            return _fail("simple_function_checker:missing_required", msg)
    for p, value in args.items():
        if p not in props or p not in allowed:
            return _fail(
                "simple_function_checker:unexpected_param", f"Unexpected parameter: {p!r}."
            )
        failure = _check_param(p, value, props[p], allowed[p], lang)
        if failure is not None:
            return failure
    for p, values in allowed.items():
        if p not in args and "" not in values:
            msg = f"Optional parameter {p!r} not provided and not marked as optional."
            return _fail("simple_function_checker:missing_optional", msg)
    return None


# ---------------------------------------------------------------- parameter level

_PYTHON_TYPES: dict[str, type] = dict(
    string=str, integer=int, float=float, boolean=bool, array=list, tuple=list, dict=dict, any=str
)
_JAVA_TYPES: dict[str, type] = dict(
    byte=int, short=int, integer=int, long=int, float=float, double=float, boolean=bool
) | dict(char=str, String=str, any=str, Array=list, ArrayList=list, HashMap=dict)
# (and Set, Hashtable, Queue and Stack, which the official parser refuses: ``CRASH``)
_JS_TYPES: dict[str, type] = dict(
    String=str, integer=int, float=float, Bigint=int, Boolean=bool, dict=dict, array=list, any=str
)
_SOURCE_LISTS = ("Array", "ArrayList", "array")  # Java/JavaScript types parsed with an item type


def _check_param(p: str, value: Any, spec: dict[str, Any], allowed: Any, lang: str) -> _Fail | None:
    declared = spec["type"]
    inner: type | None = None
    if lang == "python":
        expected = _PYTHON_TYPES[declared]
        if declared in ("array", "tuple"):
            inner = _PYTHON_TYPES[spec["items"]["type"]]
        if declared == "float" and type(value) is int:
            value = float(value)
    else:
        table, parse = (_JAVA_TYPES, _java) if lang == "java" else (_JS_TYPES, _js)
        expected = table[declared]
        if type(value) is not str:
            msg = _type_message(p, "String", value)
            return _fail("type_error:java" if lang == "java" else "type_error:js", msg)
        if declared in _SOURCE_LISTS:
            inner = table[spec["items"]["type"]]
            value = parse(value, declared, spec["items"]["type"])
        else:
            value = parse(value, declared, None)
    is_variable, failure = _check_type(p, value, allowed, declared, expected, inner)
    if failure is not None:
        return failure
    if not is_variable:
        if expected is dict:
            return _check_dict(p, value, allowed)
        if expected is list and inner is dict:
            return _check_dict_list(p, value, allowed)
        if expected is str:
            return _check_string(p, value, allowed)
        if expected is list:
            return _check_list(p, value, allowed)
    if value not in allowed:
        msg = f"Invalid value for parameter {p!r}: {value!r}. Expected one of {allowed}."
        return _fail("value_error:others", msg)
    return None


def _answer_type(allowed: Any) -> type | None:
    """The type of the first allowed value ("" means "may be omitted", not a type)."""
    return next((type(a) for a in allowed if a != ""), None)


def _check_type(
    p: str, value: Any, allowed: Any, declared: str, expected: type, inner: type | None
) -> tuple[bool, _Fail | None]:
    """(is_variable, failure). A value of the allowed values' type where that is not the
    declared type counts as a variable name: compared exactly, not by type."""
    answer_type = _answer_type(allowed)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if inner is None or any(_items_typed(value, a, inner) for a in allowed):
            return is_variable, None
        msg = (
            f"Nested type checking failed for parameter {p!r}. Expected outer type {declared} "
            f"with inner type {inner}. Parameter value: {value!r}."
        )
        kind = "nested" if type(value) is answer_type else "simple"
        return True, _fail(f"type_error:{kind}", msg)
    if answer_type is not None and type(value) is answer_type:
        return True, None
    return False, _fail("type_error:simple", _type_message(p, declared, value))


def _type_message(p: str, expected: str, value: Any) -> str:
    got = type(value).__name__
    return f"Incorrect type for parameter {p!r}. Expected type {expected}, got {got}. " + (
        f"Parameter value: {value!r}."
    )


def _items_typed(value: Any, option: Any, inner: type) -> bool:
    """Every element of ``value`` of the item type (or of the option's elements' type); an
    option that is not a list (``""`` included) accepts any elements."""
    if type(option) is not list:
        return True
    option_type = _answer_type(option)
    return all(type(v) is inner or type(v) is option_type for v in value)


def _std(text: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _std_items(seq: Any) -> list[Any]:
    return [seq[i] if type(seq[i]) is not str else _std(seq[i]) for i in range(len(seq))]


def _check_string(p: str, value: str, allowed: Any) -> _Fail | None:
    if _std(value) in [_std(a) for a in allowed if type(a) is str]:
        return None
    msg = f"Invalid value for parameter {p!r}: {value!r}. Expected one of {allowed}."
    return _fail("value_error:string", msg + " Case insensitive.")


def _check_list(p: str, value: list[Any], allowed: Any) -> _Fail | None:
    if _std_items(value) in [_std_items(a) for a in allowed]:
        return None
    msg = f"Invalid value for parameter {p!r}: {value!r}. Expected one of {allowed}."
    return _fail("value_error:list/tuple", msg)


def _check_dict(p: str, value: dict[str, Any], allowed: Any) -> _Fail | None:
    failure: _Fail | None = _fail("dict_checker:unclear")
    for option in allowed:
        if option == "":
            continue
        failure = _dict_against(value, option)
        if failure is None:
            return None
    return failure


def _dict_against(value: dict[str, Any], option: Any) -> _Fail | None:
    """One allowed dict: every key of ``value`` allowed with an allowed value, and every
    key it lacks optional; the last problem found names the error type."""
    errors: list[str] = []
    kind = None
    for key, v in value.items():
        if key not in option:
            errors.append(f"Unexpected dict key parameter: '{key}'.")
            kind = "value_error:dict_key"
            break
        choices = _std_items(option[key])
        if (_std(v) if type(v) is str else v) not in choices:
            errors.append(f"Invalid value for parameter {key!r}: {v!r}. Expected one of {choices}.")
            kind = "value_error:dict_value"
            break
    for key, values in option.items():
        if key not in value and "" not in values:
            errors.append(f"Missing dict key parameter: '{key}'.")
            kind = "value_error:dict_key"
            break
    return None if kind is None else _Fail(kind, tuple(errors))


def _check_dict_list(p: str, value: list[Any], allowed: Any) -> _Fail | None:
    """Dicts compared in order against each allowed list of dicts."""
    failure: _Fail | None = _fail("list_dict_checker:unclear")
    for option in allowed:
        if len(value) != len(option):
            msg = "Wrong number of dictionaries in the list."
            failure = _fail("value_error:list_dict_count", msg)
            continue
        for i, item in enumerate(value):
            failure = _check_dict(p, item, [option[i]])
            if failure is not None:
                break
        else:
            return None
    return failure


# ---------------------------------------------------------------- Java and JavaScript values

_INT = re.compile(r"-?\d+$")
_LONG = re.compile(r"-?\d+[lL]$")
_JAVA_FLOAT = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?[fF]$")
_DOUBLE = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?$")


def _java(text: str, declared: str, item: str | None) -> Any:
    """A Java source literal of the declared type as a Python value; text that does not
    parse stays text (and then fails the type check)."""
    if declared in ("byte", "short", "integer"):
        return int(text) if _INT.match(text) else text
    if declared == "long":
        return int(re.sub(r"[lL]$", "", text)) if _LONG.match(text) else text
    if declared == "float":
        return float(re.sub(r"[fF]$", "", text)) if _JAVA_FLOAT.match(text) else text
    if declared == "double":
        return float(text) if _DOUBLE.match(text) else text
    if declared == "boolean":
        return text == "true" if text in ("true", "false") else text
    if declared in ("char", "String", "any"):
        return text
    if declared == "Array":
        return _java_array(text, item)
    if declared == "ArrayList":
        return _java_arraylist(text, item)
    if declared == "HashMap":
        return _java_hashmap(text)
    raise ValueError(f"Unsupported type: {declared}")


def _java_plain(text: str) -> Any:
    """A Java literal of unknown type."""
    if text in ("true", "false"):
        return text == "true"
    if text.startswith('"') and text.endswith('"'):
        return text[1:-1]
    if _LONG.match(text):
        return int(text[:-1])
    if _JAVA_FLOAT.match(text):
        return float(re.sub(r"[fF]$", "", text))
    return _number_or_text(text)


def _number_or_text(text: str) -> Any:
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


def _java_array(text: str, item: str | None) -> Any:
    m = re.search(r"new\s+\w+\[\]\s*\{(.*?)\}", text)
    if m is None:
        return text
    parts = [x.strip() for x in m.group(1).split(",") if x.strip()]
    return [_java(x, item, None) if item else _java_plain(x) for x in parts]


def _java_arraylist(text: str, item: str | None) -> Any:
    m = re.search(r"new\s+ArrayList<\w*>\(Arrays\.asList\((.+?)\)\)", text)
    if m is not None:
        parts = [x.strip() for x in m.group(1).split(",")]
    else:
        m = re.search(r"new\s+ArrayList<\w*>\(\)\s*\{\{\s*(.+?)\s*\}\}", text, re.DOTALL)
        if m is None:
            return [] if re.search(r"new\s+ArrayList<\w*>\(\)", text) else text
        parts = [x.strip() for x in re.findall(r"add\((.+?)\)", m.group(1))]
    if item in ("char", "String"):
        return [x[1:-1] for x in parts]  # the quotes, whatever they are
    return [_java(x, item, None) if item else _java_plain(x) for x in parts]


def _java_hashmap(text: str) -> Any:
    m = re.search(r"new\s+HashMap<.*?>\s*\(\)\s*\{\s*\{?\s*(.*?)\s*\}?\s*\}", text, re.DOTALL)
    if m is None:
        return {} if re.search(r"new\s+HashMap<.*?>\s*\(\)", text) else text
    pairs = re.findall(r"put\(\"(.*?)\",\s*(.*?)\)", m.group(1))
    return {k: _java_plain(v.strip()) for k, v in pairs}


def _quoted(text: str) -> bool:
    return any(text.startswith(q) and text.endswith(q) for q in "\"'")


def _js(text: str, declared: str, item: str | None) -> Any:
    """A JavaScript source literal of the declared type as a Python value (text that does not
    parse stays text)."""
    if declared == "String":
        return text[1:-1] if _quoted(text) else text
    if declared == "integer":
        return int(text) if _INT.match(text) else text
    if declared == "float":
        return float(text) if re.match(r"-?\d+(\.\d+)?$", text) else text
    if declared == "Bigint":
        return int(text[:-1]) if re.match(r"-?\d+n$", text) else text
    if declared == "Boolean":
        return text == "true" if text in ("true", "false") else text
    if declared == "dict":
        return _js_object(text)
    if declared == "array":
        return _js_array(text, item)
    if declared == "any":
        return text
    raise ValueError(f"Unsupported type: {declared}")


def _js_plain(text: str) -> Any:
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    return text[1:-1] if _quoted(text) else _number_or_text(text)


_JS_ROWS = re.compile(
    r"\[\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\]|\bnew\s+Array\(\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\)"
)


def _js_array(text: str, item: str | None) -> Any:
    text = text.strip()
    try:
        rows = _JS_ROWS.match(text)
        if rows is not None:
            out = []
            for i, row in enumerate(re.findall(r"\[(.*?)\]", rows.group(0))):
                row = row.strip()
                row = row[1:] if i == 0 and row.startswith("[") else row
                out.append([_js_plain(x.strip()) for x in row.split(",")])
            return out
        m = re.match(r"\[(.*?)\]|\bnew\s+Array\((.*?)\)", text)
        if m is None:
            return text
        body = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
        parts = [x.strip() for x in body.split(",")] if body else []
        if not item:
            return [_js_plain(x) for x in parts]
        return [_js(x, item, "String" if x[:1] in ("'", '"') else None) for x in parts]
    except Exception:  # as the official parser: anything odd leaves the text as it is
        return text


def _js_object(text: str) -> Any:
    text = text.strip()
    if text == "{}":
        return {}
    m = re.match(r"\{(.*?)\}", text)
    if m is None:
        return text
    try:
        out: dict[str, Any] = {}
        for key, raw in re.findall(r"([^:]+):\s*(.*?)(?:,\s*(?=[^,]+:)|$)", m.group(1)):
            key, raw = key.strip().strip("'\""), raw.strip()
            if raw.startswith("[") and raw.endswith("]"):
                out[key] = _js_array(raw, None)
            elif raw.startswith("{") and raw.endswith("}"):
                out[key] = _js_object(raw)
            else:
                out[key] = _js_plain(raw.strip("'\""))
        return out
    except Exception:  # as the official parser
        return text
