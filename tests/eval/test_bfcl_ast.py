"""Our single-turn BFCL verdict (``eval/bfcl/ast_check.py``) held to the official pipeline.

(a) The mutation corpus (``eval/bfcl/mutations.py``: every single-turn category, gold answers
    and their mutations) scored by the official evaluator in its own environment
    (``.venv-bfcl``): every (valid, error type) equal.
(b) Hand-written cases of named behaviours: our verdict as stated, and the official one equal.
(c) The possible answer of every AST entry, made into a model result, passes, except the few
    entries whose possible answer no function-calling result can meet (their verdicts are
    held to the official ones in (a), where every gold answer is a case).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from astra_agent.errors import ConfigError
from eval.bfcl.ast_check import CRASH, AstVerdict, decode_fc, single_turn_verdict
from eval.bfcl.categories import RELEVANCE, SINGLE_TURN
from eval.bfcl.mutations import AST_MUTATIONS, corpus, gold_result
from eval.bfcl.official_single import official_verdicts
from eval.bfcl.single import SingleEntry, load_single

OFFICIAL_PYTHON = Path(
    os.environ.get("ASTRA_BFCL_OFFICIAL", Path(__file__).parents[2] / ".venv-bfcl/bin/bfcl")
).parent.joinpath("python")
AST = [c for c in SINGLE_TURN if c not in RELEVANCE]

# Entries whose possible answer no FC result can meet, with the official verdict of the closest
# one: Java ArrayList<any> elements are always strings, but the answer holds a number and
# booleans; a required list with no allowed value at all; an expected parameter that the
# function does not document; a required parameter that the answer does not expect.
UNREACHABLE = {
    "simple_java_36": "value_error:list/tuple",
    "simple_java_65": "value_error:list/tuple",
    "live_simple_106-63-0": "type_error:simple",
    "live_simple_112-68-0": "type_error:simple",
    "live_multiple_862-181-3": "simple_function_checker:unexpected_param",
    "live_multiple_964-207-0": "simple_function_checker:missing_required",
}


def _params(required: list[str], **types: Any) -> dict[str, Any]:
    props = {k: v if isinstance(v, dict) else {"type": v} for k, v in types.items()}
    return {"type": "dict", "properties": props, "required": required}


WEATHER = {
    "name": "weather.get",
    "description": "Weather in a city.",
    "parameters": _params(["city"], city="string", unit="string", days="integer", temp="float"),
}
NEWS = {"name": "news", "description": "News.", "parameters": _params(["topic"], topic="string")}
JAVA = {
    "name": "Store.put",
    "description": "Java.",
    "parameters": _params(
        ["flag", "n"],
        flag="boolean",
        n="integer",
        big="long",
        names={"type": "ArrayList", "items": {"type": "String"}},
        map="HashMap",
        s="String",
    ),
}
JS = {
    "name": "render",
    "description": "JavaScript.",
    "parameters": _params(
        ["s"], s="String", arr={"type": "array", "items": {"type": "String"}}, d="dict", x="float"
    ),
}
ODD = {"name": "odd", "description": "", "parameters": _params([], n="number")}
STATS = {
    "name": "stats",
    "description": "Lists.",
    "parameters": _params(
        ["xs"],
        xs={"type": "array", "items": {"type": "float"}},
        tags={"type": "array", "items": {"type": "string"}},
    ),
}
STATS_GOLD = {"stats": {"xs": [[1.0, 2.5]], "tags": [["a"], ""]}}


def call(name: str, **args: Any) -> dict[str, str]:
    return {name: json.dumps(args)}


@dataclass(frozen=True)
class Hand:
    name: str
    category: str
    result: Any
    expected: tuple[bool, str | None]
    functions: tuple[dict[str, Any], ...] = (WEATHER,)
    answer: tuple[dict[str, Any], ...] | None = None

    @property
    def possible_answer(self) -> list[dict[str, Any]] | None:
        return None if self.answer is None else list(self.answer)

    def case(self) -> dict[str, Any]:
        return {
            "case": self.name,
            "category": self.category,
            "id": self.name,
            "result": self.result,
            "functions": list(self.functions),
            "possible_answer": self.possible_answer,
        }


PARIS = {"weather.get": {"city": ["Paris"], "unit": ["", "celsius"]}}
LONDON = {"weather.get": {"city": ["London"], "unit": ["", "celsius"]}}
PARIS_DAYS = {"weather.get": {"city": ["Paris"], "days": [3], "temp": ["", 5.0]}}
GREEDY = (
    {"weather.get": {"city": ["Paris"], "unit": ["celsius", "kelvin"]}},
    {"weather.get": {"city": ["Paris"], "unit": ["celsius"]}},
)
JAVA_GOLD = {
    "Store.put": {
        "flag": [True],
        "n": [5],
        "big": [7],
        "names": [["a", "b"]],
        "map": [{"k": ["v"]}],
        "s": ["abc"],
    }
}
JAVA_ARGS = {
    "flag": "true",
    "n": "5",
    "big": "7L",
    "names": 'new ArrayList<>(Arrays.asList("a", "b"))',
    "map": 'new HashMap<String, String>() {{ put("k", "v"); }}',
    "s": "abc",
}
JS_GOLD = {"render": {"s": ["abc"], "arr": [["a", "b"]], "d": [{"k": ["v"]}], "x": [2.5]}}
JS_ARGS = {"s": "'abc'", "arr": "['a', 'b']", "d": "{k: 'v'}", "x": "2.5"}
W = "weather_get"  # the name the function is offered under (dots are not allowed)
OK = (True, None)


def simple(name: str, result: Any, expected: tuple[bool, str | None], *answer: Any) -> Hand:
    return Hand(name, "simple_python", result, expected, answer=answer or (PARIS,))


def java(name: str, changes: dict[str, Any], expected: tuple[bool, str | None]) -> Hand:
    result = [{"Store_put": json.dumps({**JAVA_ARGS, **changes})}]
    return Hand(name, "simple_java", result, expected, (JAVA,), (JAVA_GOLD,))


def js(name: str, changes: dict[str, Any], expected: tuple[bool, str | None]) -> Hand:
    result = [{"render": json.dumps({**JS_ARGS, **changes})}]
    return Hand(name, "simple_javascript", result, expected, (JS,), (JS_GOLD,))


HAND = [
    # order-free parallel calls, and their count; greedy matching (each expected call takes
    # the first model call that fits it, so a valid pairing can be missed)
    Hand(
        "parallel_any_order",
        "parallel",
        [call(W, city="London"), call(W, city="Paris")],
        OK,
        answer=(PARIS, LONDON),
    ),
    Hand(
        "parallel_one_missing",
        "parallel",
        [call(W, city="London")],
        (False, "parallel_function_checker_no_order:wrong_count"),
        answer=(PARIS, LONDON),
    ),
    Hand(
        "parallel_greedy",
        "parallel",
        [call(W, city="Paris", unit="celsius"), call(W, city="Paris", unit="kelvin")],
        (False, "parallel_function_checker_no_order:cannot_find_match"),
        answer=GREEDY,
    ),
    # optional parameters, and the normalised string comparison
    simple("optional_omitted", [call(W, city="Paris")], OK),
    simple("optional_given", [call(W, city="paris ", unit="Cel-sius")], OK),
    simple(
        "expected_omitted",
        [call(W, city="Paris")],
        (False, "simple_function_checker:missing_optional"),
        PARIS_DAYS,
    ),
    simple(
        "required_omitted",
        [call(W, days=3)],
        (False, "simple_function_checker:missing_required"),
        PARIS_DAYS,
    ),
    simple("string_accent", [call(W, city="Pâris")], (False, "value_error:string")),
    simple(
        "undocumented_param",
        [call(W, city="Paris", country="FR")],
        (False, "simple_function_checker:unexpected_param"),
    ),
    # an int for a float is taken, a float for an int is not
    simple("int_for_float", [call(W, city="Paris", days=3, temp=5)], OK, PARIS_DAYS),
    simple(
        "float_for_int", [call(W, city="Paris", days=3.0)], (False, "type_error:simple"), PARIS_DAYS
    ),
    Hand(
        "int_in_float_list",
        "simple_python",
        [call("stats", xs=[1, 2.5])],
        (False, "type_error:nested"),
        (STATS,),
        (STATS_GOLD,),
    ),
    Hand(
        "empty_list_for_optional_list",
        "simple_python",
        [call("stats", xs=[1.0, 2.5], tags=[])],
        OK,
        (STATS,),
        (STATS_GOLD,),
    ),
    # names: dots became underscores in the tools sent; the dotted name is a wrong name
    simple(
        "dotted_name",
        [call("weather.get", city="Paris")],
        (False, "simple_function_checker:wrong_func_name"),
    ),
    Hand(
        "multiple_other_function",
        "multiple",
        [call("news", topic="Paris")],
        (False, "simple_function_checker:wrong_func_name"),
        (NEWS, WEATHER),
        (PARIS,),
    ),
    Hand(
        "multiple_right_function",
        "multiple",
        [call(W, city="Paris")],
        OK,
        (NEWS, WEATHER),
        (PARIS,),
    ),
    # Java and JavaScript values arrive as source text
    java("java_values", {}, OK),
    java("java_json_number", {"n": 5}, (False, "type_error:java")),
    java("java_long_without_l", {"big": "7"}, (False, "type_error:simple")),
    java("java_string_quoted", {"s": '"abc"'}, (False, "value_error:string")),
    js("js_values", {}, OK),
    js("js_string_unquoted", {"s": "abc"}, OK),
    js("js_json_list", {"arr": ["a", "b"]}, (False, "type_error:js")),
    # decoding
    simple("prose", "It is sunny in Paris.", (False, "ast_decoder:decoder_failed")),
    simple("empty_text_is_no_call", "", (False, "simple_function_checker:wrong_count")),
    simple("null_arguments", [{W: "null"}], (False, "ast_decoder:decoder_wrong_output_format")),
    simple("bad_json", [{W: "{'city': 'Paris'}"}], (False, "ast_decoder:decoder_failed")),
    Hand(
        "official_raises",
        "simple_python",
        [call("odd", n=1)],
        (False, CRASH),
        (ODD,),
        ({"odd": {"n": [1]}},),
    ),
    # irrelevance: no call passes; relevance: a call passes
    Hand("irrelevance_text", "irrelevance", "I cannot tell.", OK),
    Hand("irrelevance_empty_list", "live_irrelevance", [], OK),
    Hand("irrelevance_null_args", "irrelevance", [{W: "null"}], OK),
    Hand(
        "irrelevance_call",
        "irrelevance",
        [call(W, city="Paris")],
        (False, "irrelevance_error:decoder_success"),
    ),
    Hand("relevance_call", "live_relevance", [call(W, city="Paris")], OK),
    Hand("relevance_empty_list", "live_relevance", [], (False, "relevance_error:decoder_failed")),
    Hand(
        "relevance_text",
        "live_relevance",
        "Let me look.",
        (False, "relevance_error:decoder_failed"),
    ),
]


def ours(category: str, entry: SingleEntry | Hand, result: Any) -> tuple[bool, str | None]:
    answer = entry.ground_truth if isinstance(entry, SingleEntry) else entry.possible_answer
    v = single_turn_verdict(category, entry.functions, answer, result)
    return v.valid, v.error_type


@pytest.fixture(scope="module")
def cases() -> list[dict[str, Any]]:
    return corpus()


@pytest.fixture(scope="module")
def official(cases: list[dict[str, Any]]) -> list[tuple[bool, str | None]]:
    """The official verdicts of the corpus, then of the hand-written cases (one run)."""
    if not OFFICIAL_PYTHON.is_file():
        pytest.skip(f"no official BFCL environment at {OFFICIAL_PYTHON} (make setup makes one)")
    return official_verdicts(cases + [h.case() for h in HAND], OFFICIAL_PYTHON)


def test_the_corpus_scores_as_the_official_pipeline(
    cases: list[dict[str, Any]], official: list[tuple[bool, str | None]]
) -> None:
    entries = {(c, e.id): e for c in SINGLE_TURN for e in load_single(c)}
    differ = []
    for case, theirs in zip(cases, official[: len(cases)], strict=True):
        mine = ours(case["category"], entries[case["category"], case["id"]], case["result"])
        if mine != theirs:
            differ.append({**case, "ours": mine, "official": theirs})
    assert not differ, (len(differ), differ[:5])
    # the corpus reaches every category, mutation kind and most of the official error types
    assert {c["category"] for c in cases} == set(SINGLE_TURN)
    kinds = Counter(c["case"] for c in cases)
    assert all(kinds[k] >= 10 for k in AST_MUTATIONS), kinds
    seen = Counter(official[: len(cases)])
    assert len(seen) >= 20 and 0.3 < seen[True, None] / len(cases) < 0.7, seen


@pytest.mark.parametrize("hand", HAND, ids=[h.name for h in HAND])
def test_named_behaviours(hand: Hand) -> None:
    assert ours(hand.category, hand, hand.result) == hand.expected


def test_named_behaviours_are_the_official_ones(
    cases: list[dict[str, Any]], official: list[tuple[bool, str | None]]
) -> None:
    theirs = dict(zip((h.name for h in HAND), official[len(cases) :], strict=True))
    assert {h.name: h.expected for h in HAND} == theirs


def test_every_gold_answer_passes() -> None:
    failing, total = {}, 0
    for category in AST:
        for entry in load_single(category):
            total += 1
            valid, error = ours(category, entry, gold_result(entry))
            if not valid:
                failing[entry.id] = error
    assert total > 2400
    assert failing == UNREACHABLE


def test_the_fc_decoder() -> None:
    assert decode_fc([{"f": '{"a": 1}', "ignored": "x"}, {"g": "{}"}]) == [
        {"f": {"a": 1}},
        {"g": {}},
    ]
    assert decode_fc("") == [] and decode_fc({}) == []  # nothing to iterate: no call
    for bad in ["text", None, 3, [{}], ["f()"], [{"f": {"a": 1}}], [{"f": "{a}"}], {"f": "{}"}]:
        with pytest.raises(ValueError):
            decode_fc(bad)
    v = single_turn_verdict("simple_python", [WEATHER], [PARIS], [call(W, city="Paris")])
    assert v == AstVerdict(True, decoded=[{W: {"city": "Paris"}}])


def test_bad_input_is_refused() -> None:
    with pytest.raises(ConfigError, match="single-turn"):
        single_turn_verdict("multi_turn_base", [WEATHER], [PARIS], [])
    with pytest.raises(ConfigError, match="possible answers"):
        single_turn_verdict("simple_python", [WEATHER], None, [])
    with pytest.raises(ConfigError, match="official BFCL pipeline"):
        official_verdicts([{"category": "irrelevance", "id": "x", "result": []}], Path("no/python"))


def test_the_corpus_is_deterministic() -> None:
    small = corpus(per_category=3)
    assert small == corpus(per_category=3)
    assert small != corpus(per_category=3, seed=1)
    assert json.loads(json.dumps(small)) == small
    assert {c["category"] for c in small} == set(SINGLE_TURN)
