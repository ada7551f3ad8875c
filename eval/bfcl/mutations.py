"""A deterministic corpus of single-turn model results, built from the installed BFCL data, to
hold :func:`eval.bfcl.ast_check.single_turn_verdict` to the official pipeline.

An AST entry gives its possible answer as a stored FC result (``[{name_with_underscores:
arguments_json}]``: per parameter the first allowed value, optional ones left out; Java and
JavaScript values as source text of the declared type) and mutations of it (``AST_MUTATIONS``:
of one value, of the parameters, of the calls, of the whole result), the kinds least used so
far in the category first, more per entry in small categories. A relevance or irrelevance
entry gives a call, several, calls with odd arguments, text, nothing or something malformed.
"""

from __future__ import annotations

import copy
import json
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eval.bfcl.ast_check import fc_function_name
from eval.bfcl.categories import RELEVANCE, SINGLE_TURN
from eval.bfcl.single import SingleEntry, language, load_single

MUTATIONS_PER_CATEGORY = 240  # mutated cases per AST category (at least one per entry)
RELEVANCE_PER_ENTRY = 2


@dataclass
class _Call:
    doc: dict[str, Any]  # the function's documentation
    sent: str  # the name the model calls it by
    args: dict[str, Any]  # Python values (written as source text for Java and JavaScript)
    extra: dict[str, str]  # more keys in the call's object (the official decoder ignores them)

    def spec(self, param: str) -> dict[str, Any]:
        return self.doc["parameters"]["properties"].get(param, {"type": "string"})


@dataclass(frozen=True)
class _Raw:
    value: Any  # sent as it is: not written as Java or JavaScript source text


@dataclass(frozen=True)
class _Ctx:
    entry: SingleEntry
    lang: str
    calls: list[_Call]  # the gold calls
    rng: random.Random

    def render(self, calls: list[_Call]) -> list[dict[str, Any]]:
        return [_render_call(c, self.lang) for c in calls]


# ---------------------------------------------------------------- the gold answer as a result


def _first(allowed: list[Any]) -> Any:
    return next((a for a in allowed if a != ""), "")


def _pick(value: Any, spec: dict[str, Any]) -> Any:
    """A possible answer's value as the model would give it: dicts of allowed values (dict
    parameters, lists of dicts) reduced to their first allowed values."""
    kind, item = spec.get("type"), spec.get("items", {}).get("type")
    if isinstance(value, dict) and kind in ("dict", "HashMap"):
        return {k: _first(v) for k, v in value.items() if "" not in v}
    if isinstance(value, list) and kind == "array" and item == "dict":
        return [_pick(d, {"type": "dict"}) for d in value]
    return value


def _gold_calls(entry: SingleEntry) -> list[_Call]:
    calls = []
    for expected in entry.ground_truth or []:
        name, allowed = next(iter(expected.items()))
        doc = next(f for f in entry.functions if f["name"] == name)
        call = _Call(doc, fc_function_name(name), {}, {})
        for p, values in allowed.items():
            if "" not in values or p in doc["parameters"]["required"]:
                call.args[p] = _pick(_first(values), call.spec(p))
        calls.append(call)
    return calls


def gold_result(entry: SingleEntry) -> list[dict[str, Any]]:
    """The entry's possible answer as a stored model result."""
    return [_render_call(c, language(entry.category)) for c in _gold_calls(entry)]


def _render_call(call: _Call, lang: str) -> dict[str, Any]:
    source = {"java": _java_source, "javascript": _js_source}.get(lang)
    args = {
        p: v.value if isinstance(v, _Raw) else source(v, call.spec(p)) if source else v
        for p, v in call.args.items()
    }
    return {call.sent: json.dumps(args), **call.extra}


_JAVA_ARRAYS = {"integer": "int", "long": "long", "String": "String", "char": "char"}


def _java_source(value: Any, spec: dict[str, Any]) -> str:
    kind, item = str(spec.get("type")), spec.get("items", {}).get("type")
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) + {"long": "L", "float": "f"}.get(kind, "")
    if isinstance(value, float):
        return f"{value!r}f" if kind == "float" else repr(value)
    if isinstance(value, list) and kind == "ArrayList":
        quote = item in ("String", "char")
        parts = [f'"{v}"' if quote else _java_source(v, {"type": item}) for v in value]
        return (
            f"new ArrayList<>(Arrays.asList({', '.join(parts)}))" if parts else "new ArrayList<>()"
        )
    if isinstance(value, list):
        parts = [_java_source(v, {"type": item}) for v in value]
        return f"new {_JAVA_ARRAYS.get(str(item), 'Object')}[]{{{', '.join(parts)}}}"
    if isinstance(value, dict):
        puts = "".join(f'put("{k}", {_java_literal(v)}); ' for k, v in value.items())
        return f"new HashMap<String, Object>() {{{{ {puts}}}}}"
    return json.dumps(value)


def _java_literal(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else _java_source(value, {})


def _js_source(value: Any, spec: dict[str, Any]) -> str:
    kind, item = spec.get("type"), spec.get("items", {}).get("type")
    if isinstance(value, str):
        return f'"{value}"' if kind == "String" else value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and kind == "Bigint":
        return f"{value}n"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return f"[{', '.join(_js_source(v, {'type': item or 'String'}) for v in value)}]"
    if isinstance(value, dict):
        pairs = [f"{k}: {_js_source(v, {'type': 'String'})}" for k, v in value.items()]
        return "{" + ", ".join(pairs) + "}"
    return json.dumps(value)


# ---------------------------------------------------------------- mutations of AST entries

Mutation = Callable[[_Ctx], Any]  # the model result, or None where the mutation does not apply
Spots = Callable[[_Ctx], list[tuple[int, Any]]]  # (call index, what to change) to choose from


def _edit(spots: Spots, edit: Callable[[_Call, Any, random.Random], None]) -> Mutation:
    """Change one gold call in place (a copy) at a spot chosen among ``spots(ctx)``."""

    def mutate(ctx: _Ctx) -> Any:
        options = spots(ctx)
        if not options:
            return None
        i, what = ctx.rng.choice(options)
        calls = copy.deepcopy(ctx.calls)
        edit(calls[i], what, ctx.rng)
        return ctx.render(calls)

    return mutate


def _value(applies: Callable[[Any], bool], change: Callable[..., Any]) -> Mutation:
    """One argument (among those ``applies`` to) replaced by ``change(value, spec, rng)``."""

    def spots(ctx: _Ctx) -> list[tuple[int, Any]]:
        return [(i, p) for i, c in enumerate(ctx.calls) for p, v in c.args.items() if applies(v)]

    def edit(call: _Call, p: str, rng: random.Random) -> None:
        call.args[p] = change(call.args[p], call.spec(p), rng)

    return _edit(spots, edit)


def _of(*types: type) -> Callable[[Any], bool]:
    return lambda v: type(v) in types and v not in ("", [], {})


def _outside(v: Any, spec: Any, rng: random.Random) -> Any:
    if type(v) is bool:
        return not v
    if type(v) in (int, float):
        return v + rng.choice([1, -1, 1000, 0.5])
    if type(v) is str:
        return rng.choice(["zzz not allowed", v + " x", v[:-1], ""])
    if type(v) is list:
        return [*v, v[0]] if v else ["zzz"]
    return "zzz"


def _unicode(v: str, spec: Any, rng: random.Random) -> str:
    full_width = "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in v)
    cyrillic_a = v.replace("a", "а")
    return rng.choice([v + "é", cyrillic_a, full_width, v + "\u200b", "ñandú 東京 " + v])


def _punctuation(v: str, spec: Any, rng: random.Random) -> str:
    cut = rng.randrange(len(v) + 1)
    return v[:cut] + rng.choice("-._/,*^'\"!:") + v[cut:]


def _element(v: list[Any], spec: Any, rng: random.Random) -> list[Any]:
    """A list with one element of another type."""
    i = rng.randrange(len(v))
    other = {str: 7, int: "7", float: "7.5", bool: "true", dict: "{}", list: "[]"}
    return [*v[:i], other.get(type(v[i])), *v[i + 1 :]]


def _entry_changed(v: dict[str, Any], spec: Any, rng: random.Random) -> dict[str, Any]:
    key, out = rng.choice(sorted(v)), dict(v)
    how = rng.choice(["drop", "extra", "value", "case"])
    if how == "drop":
        del out[key]
    elif how == "extra":
        out["zz_extra_key"] = 1
    elif how == "value" or type(out[key]) is not str:
        out[key] = _outside(out[key], spec, rng)
    else:
        out[key] = out[key].upper()
    return out


def _source_form(v: Any, spec: dict[str, Any], rng: random.Random) -> _Raw:
    """Java/JavaScript: the value's source text in another form (suffixes, quotes, spacing,
    other collection syntax), which the official parser reads or leaves as text."""
    java = spec.get("_lang") == "java"
    text = (_java_source if java else _js_source)(v, spec)
    forms = [f" {text}", f"{text}\n", text.replace(", ", ","), text.replace(" ", "")]
    single = (
        [f"'{x}'" if isinstance(x, str) else json.dumps(x) for x in v] if type(v) is list else []
    )
    if type(v) in (int, float):
        forms += [f"{v}L", f"{v}l", f"{v}.0", f"+{v}", f"{v}f", f"{v}d", f"{v}n", f"{v:.2e}"]
    elif type(v) is bool:
        forms += [str(v), str(v).upper(), f'"{str(v).lower()}"', str(int(v))]
    elif type(v) is str:
        forms += [f'"{v}"', f"'{v}'", f"`{v}`", json.dumps(v), f"'{v[:1]}'", f"\"{v}'"]
    elif type(v) is list and java:
        adds = " ".join(
            f"add({x});" for x in rng.choice([single, [_java_source(x, {}) for x in v]])
        )
        forms += [f"new ArrayList<>() {{{{ {adds} }}}}", f"Arrays.asList({', '.join(single)})"]
        forms += [f"new Object[]{{{', '.join(single)},}}", "new ArrayList<>()", "new int[] { }"]
    elif type(v) is list:
        forms += [f"new Array({', '.join(single)})", f"[{', '.join(single)},]", json.dumps(v)]
        forms += [f"[{json.dumps(v)}, {json.dumps(v)}]", f"new Array([{', '.join(single)}])"]
    elif type(v) is dict and java:
        bare = " ".join(f"put({k}, {x});" for k, x in v.items())
        forms += [f"new HashMap<>() {{{{ {bare} }}}}", "new HashMap<>() {{}}", json.dumps(v)]
    elif type(v) is dict:
        pairs = [f"{k}: {{a: {json.dumps(x)}}}" for k, x in v.items()]
        forms += [json.dumps(v), "{" + ", ".join(pairs) + "}", "{ }", "{a : 1,}"]
    return _Raw(rng.choice(forms))


def _as_json(v: Any, spec: dict[str, Any], rng: random.Random) -> _Raw:
    """Java/JavaScript: the value as JSON of its own type, not as source text."""
    return _Raw(rng.choice([1, [v]]) if isinstance(v, str) else v)


def _in_source(change: Callable[[Any, dict[str, Any], random.Random], _Raw]) -> Mutation:
    """Java and JavaScript only: one argument's source text replaced."""

    def mutate(ctx: _Ctx) -> Any:
        if ctx.lang == "python":
            return None

        def form(v: Any, spec: dict[str, Any], rng: random.Random) -> _Raw:
            return change(v, {**spec, "_lang": ctx.lang}, rng)

        return _value(lambda v: True, form)(ctx)

    return mutate


def _json_edge(ctx: _Ctx) -> Any:
    """Arguments' JSON at its edges: NaN, infinities, huge or negative-zero numbers, a key
    given twice, a null value, Unicode unescaped."""
    result = ctx.render(ctx.calls)
    i = ctx.rng.randrange(len(result))
    name = next(iter(result[i]))
    args = json.loads(result[i][name])
    if not args:
        return None
    p = ctx.rng.choice(sorted(args))
    how = ctx.rng.choice(["nan", "inf", "huge", "zero", "twice", "null", "unescaped"])
    if how == "twice":
        again = json.dumps(_outside(args[p], {}, ctx.rng))
        text = json.dumps(args)[:-1] + f", {json.dumps(p)}: {again}}}"
    else:
        special = {"nan": math.nan, "inf": -math.inf, "huge": 10**30, "zero": -0.0, "null": None}
        args[p] = special.get(how, args[p])
        text = json.dumps(args, ensure_ascii=how != "unescaped")
    result[i] = {name: text}
    return result


def _args_where(keep: Callable[[_Call, str], bool]) -> Spots:
    return lambda ctx: [(i, p) for i, c in enumerate(ctx.calls) for p in c.args if keep(c, p)]


def _required(call: _Call, p: str) -> bool:
    return p in call.doc["parameters"]["required"]


def _drop(call: _Call, p: str, rng: random.Random) -> None:
    del call.args[p]


def _placeholder(spec: dict[str, Any]) -> Any:
    if spec.get("default") is not None:
        return spec["default"]
    if spec.get("enum"):
        return spec["enum"][0]
    return {"integer": 1, "float": 1.5, "boolean": True, "array": [], "dict": {}}.get(
        spec.get("type", ""), "x"
    )


def _undocumented(ctx: _Ctx) -> list[tuple[int, Any]]:
    return [(i, ("zz_unknown", "x")) for i in range(len(ctx.calls))]


def _documented(ctx: _Ctx) -> list[tuple[int, Any]]:
    """Documented parameters the call leaves out, with a placeholder value."""
    return [
        (i, (p, _placeholder(spec)))
        for i, c in enumerate(ctx.calls)
        for p, spec in c.doc["parameters"]["properties"].items()
        if p not in c.args
    ]


def _optional(how: str) -> Spots:
    """Optional parameters left out: with their first allowed value, or documented default."""

    def spots(ctx: _Ctx) -> list[tuple[int, Any]]:
        out = []
        for i, (c, expected) in enumerate(
            zip(ctx.calls, ctx.entry.ground_truth or [], strict=True)
        ):
            allowed = next(iter(expected.values()))
            for p, spec in c.doc["parameters"]["properties"].items():
                if p in c.args:
                    continue
                if how == "allowed" and _first(allowed.get(p, [])) != "":
                    out.append((i, (p, _pick(_first(allowed[p]), spec))))
                elif how == "default" and "default" in spec:
                    out.append((i, (p, spec["default"])))
        return out

    return spots


def _give(call: _Call, what: tuple[str, Any], rng: random.Random) -> None:
    call.args[what[0]] = what[1]


def _upper_name(call: _Call, p: str, rng: random.Random) -> None:
    call.args[p.upper()] = call.args.pop(p)


def _calls_where(keep: Callable[[_Ctx, _Call], bool]) -> Spots:
    return lambda ctx: [(i, None) for i, c in enumerate(ctx.calls) if keep(ctx, c)]


def _rename(new: Callable[[_Call, random.Random], str]) -> Callable[..., None]:
    def edit(call: _Call, what: Any, rng: random.Random) -> None:
        call.sent = new(call, rng)

    return edit


def _other_function(ctx: _Ctx) -> list[tuple[int, Any]]:
    return [
        (i, fc_function_name(f["name"]))
        for i, c in enumerate(ctx.calls)
        for f in ctx.entry.functions
        if f["name"] != c.doc["name"]
    ]


def _calls(how: str) -> Mutation:
    """The calls reordered, one dropped or repeated, arguments swapped between two, or a
    second key in a call's object."""

    def mutate(ctx: _Ctx) -> Any:
        calls = copy.deepcopy(ctx.calls)
        if how in ("reordered", "one_dropped", "args_swapped") and len(calls) < 2:
            return None
        if how == "reordered":
            calls = calls[::-1] if ctx.rng.random() < 0.5 else calls[1:] + calls[:1]
        elif how == "one_dropped":
            del calls[ctx.rng.randrange(len(calls))]
        elif how == "one_repeated":
            calls.insert(0, copy.deepcopy(ctx.rng.choice(calls)))
        elif how == "args_swapped":
            calls[0].args, calls[1].args = calls[1].args, calls[0].args
        else:
            calls[0].extra = {"zz_other": "{}"}
        return ctx.render(calls)

    return mutate


def _arguments(how: str) -> Mutation:
    """One call's arguments replaced by something other than a JSON object's text."""

    def mutate(ctx: _Ctx) -> Any:
        result = ctx.render(ctx.calls)
        i = ctx.rng.randrange(len(result))
        name = next(iter(result[i]))
        text = result[i][name]
        bad: Any = {
            "not_json": lambda: ctx.rng.choice([text[:-1], text.replace('"', "'"), "", "{a: 1}"]),
            "not_object": lambda: ctx.rng.choice(["null", "[]", "5", '"text"', f"[{text}]"]),
            "not_text": lambda: json.loads(text),
        }[how]()
        result[i] = {name: bad}
        return result

    return mutate


def _result(how: str) -> Mutation:
    """The whole result replaced: by text, nothing, or something malformed."""

    def mutate(ctx: _Ctx) -> Any:
        calls = ctx.render(ctx.calls)
        name = next(iter(calls[0]))
        return {
            "prose": f"I would call {name} with {calls[0][name]} to answer this.",
            "empty_list": [],
            "empty_text": "",
            "null": None,
            "object": ctx.rng.choice([{}, calls[0]]),
            "empty_call": [{}],
            "call_text": [f"{name}({calls[0][name]})"],
            "nested": [calls],
        }[how]

    return mutate


_TEXT, _NUMBER, _LIST = _of(str), _of(int, float), _of(list)
AST_MUTATIONS: dict[str, Mutation] = {
    # values
    "int_as_float": _value(_of(int), lambda v, s, r: float(v)),
    "float_as_int": _value(_of(float), lambda v, s, r: round(v)),
    "number_as_text": _value(_NUMBER, lambda v, s, r: r.choice([str(v), f" {v}"])),
    "bool_changed": _value(_of(bool), lambda v, s, r: r.choice([str(v).lower(), str(v), int(v)])),
    "case": _value(_TEXT, lambda v, s, r: r.choice([v.upper(), v.swapcase(), v.title()])),
    "whitespace": _value(
        _TEXT, lambda v, s, r: r.choice([f"  {v} ", v.replace(" ", ""), f"{v}\n", f"\t{v}"])
    ),
    "punctuation": _value(_TEXT, _punctuation),
    "unicode": _value(_TEXT, _unicode),
    "outside_allowed": _value(lambda v: True, _outside),
    "null_value": _value(lambda v: True, lambda v, s, r: None),
    "list_order": _value(_LIST, lambda v, s, r: v[::-1] if len(v) > 1 else [*v, *v]),
    "nested_type": _value(_LIST, _element),
    "dict_changed": _value(_of(dict), _entry_changed),
    "json_edge": _json_edge,
    "source_variant": _in_source(_source_form),
    "source_variant_2": _in_source(_source_form),
    "source_raw": _in_source(_as_json),
    # parameters
    "drop_required": _edit(_args_where(_required), _drop),
    "drop_expected": _edit(_args_where(lambda c, p: not _required(c, p)), _drop),
    "extra_unknown": _edit(_undocumented, _give),
    "extra_known": _edit(_documented, _give),
    "optional_allowed": _edit(_optional("allowed"), _give),
    "optional_default": _edit(_optional("default"), _give),
    "param_case": _edit(_args_where(lambda c, p: p.upper() != p), _upper_name),
    # calls
    "wrong_name": _edit(
        _calls_where(lambda ctx, c: True),
        _rename(lambda c, r: r.choice([c.sent + "_v2", c.sent[:-1], "get_" + c.sent])),
    ),
    "dotted_name": _edit(
        _calls_where(lambda ctx, c: "." in c.doc["name"]), _rename(lambda c, r: c.doc["name"])
    ),
    "prefixed_name": _edit(
        _calls_where(lambda ctx, c: True),
        _rename(lambda c, r: r.choice(["functions.", "default_api.", "tools_", "api/"]) + c.sent),
    ),
    "lookalike_name": _edit(
        _calls_where(lambda ctx, c: True),
        _rename(lambda c, r: r.choice([c.sent.upper(), c.sent.replace("e", "е"), c.sent + " "])),
    ),
    "other_function": _edit(_other_function, lambda c, name, r: setattr(c, "sent", name)),
    "reordered": _calls("reordered"),
    "one_dropped": _calls("one_dropped"),
    "one_repeated": _calls("one_repeated"),
    "args_swapped": _calls("args_swapped"),
    "extra_key": _calls("extra_key"),
    # the whole result
    "args_not_json": _arguments("not_json"),
    "args_not_object": _arguments("not_object"),
    "args_not_text": _arguments("not_text"),
    "prose": _result("prose"),
    "empty_list": _result("empty_list"),
    "empty_text": _result("empty_text"),
    "null": _result("null"),
    "object": _result("object"),
    "empty_call": _result("empty_call"),
    "call_text": _result("call_text"),
    "nested_result": _result("nested"),
}


# ---------------------------------------------------------------- relevance and irrelevance


def _call_of(doc: dict[str, Any], args: str | None = None) -> dict[str, str]:
    params = doc["parameters"]
    if args is None:
        props = params.get("properties", {})
        args = json.dumps({p: _placeholder(props[p]) for p in params.get("required", [])})
    return {fc_function_name(doc["name"]): args}


def _relevance_results(entry: SingleEntry, rng: random.Random) -> dict[str, Any]:
    first = entry.functions[0] if entry.functions else {"name": "get_weather", "parameters": {}}
    return {
        "call": [_call_of(first)],
        "calls": [_call_of(d) for d in entry.functions] or [_call_of(first)],
        "call_no_args": [_call_of(first, "{}")],
        "call_unknown": [{"zz_no_such_function": "{}"}],
        "args_null": [_call_of(first, "null")],
        "args_list": [_call_of(first, "[]")],
        "args_not_json": [_call_of(first, "{'a': 1")],
        "text": rng.choice(["I cannot help with that.", "No function fits this request.", "[]"]),
        "empty_text": "",
        "empty_list": [],
        "null": None,
        "empty_call": [{}],
        "object": rng.choice([{}, _call_of(first)]),
    }


# ---------------------------------------------------------------- the corpus


def corpus(per_category: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """Cases ``{"case", "category", "id", "result"}`` for every single-turn category: per
    category its first ``per_category`` entries (all by default); ``seed`` varies the
    mutations' choices."""
    cases: list[dict[str, Any]] = []
    for category in SINGLE_TURN:
        entries = load_single(category)[:per_category]
        used: Counter[str] = Counter()  # mutation kinds used so far in the category
        count = max(1, math.ceil(MUTATIONS_PER_CATEGORY / max(1, len(entries))))
        for index, entry in enumerate(entries):
            if category in RELEVANCE:
                made = _relevance_cases(entry, index, seed)
            else:
                made = _ast_cases(entry, count, used, seed)
            cases += [
                {"case": k, "category": category, "id": entry.id, "result": r} for k, r in made
            ]
    return cases


def _ast_cases(
    entry: SingleEntry, count: int, used: Counter[str], seed: int
) -> list[tuple[str, Any]]:
    """The gold case and ``count`` mutations, the kinds least used so far first."""
    calls = _gold_calls(entry)
    made: list[tuple[str, Any]] = [("gold", gold_result(entry))]
    for name in sorted(AST_MUTATIONS, key=lambda n: used[n]):
        if len(made) > count:
            break
        rng = random.Random(f"{seed}:{entry.id}:{name}")
        result = AST_MUTATIONS[name](_Ctx(entry, language(entry.category), calls, rng))
        if result is not None:
            made.append((name, result))
            used[name] += 1
    return made


def _relevance_cases(entry: SingleEntry, index: int, seed: int) -> list[tuple[str, Any]]:
    """``RELEVANCE_PER_ENTRY`` results, the kinds rotating from entry to entry."""
    results = _relevance_results(entry, random.Random(f"{seed}:{entry.id}"))
    names = list(results)
    start = (index * RELEVANCE_PER_ENTRY + seed) % len(names)
    return [(n, results[n]) for n in (names[start:] + names[:start])[:RELEVANCE_PER_ENTRY]]
