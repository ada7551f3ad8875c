"""Fuzz: our BFCL verdicts against the official evaluator's, on mutated ground truth.

Each case starts from an entry's ground truth as a function-calling model returns it (per turn,
one step of calls ``[{name: json_arguments}]``, then a text answer) and applies one to three
mutations: names (NFKC look-alikes, ``Class.method``, call expressions, spaces, case),
arguments (types, JSON encodings that ``json`` rejects or gives up on, already-decoded
objects, NFKC keys, Unicode strings, text that looks like a call), and structure (empty,
split, merged, duplicated and text steps, merged, dropped and extra turns). Our verdict
(valid, error type) is compared with the official checker's in-process, and, per batch, with
the official ``bfcl evaluate`` run from ``.venv-bfcl`` on the same result files.

    .venv/bin/python bench/bfcl_fuzz.py [--cases 2000] [--batch 400] [--seed 0]

The mutation engine takes its choices from a ``Choose`` (random here, hypothesis in
``tests/eval/test_bfcl_fuzz.py``), so the same mutations run in both.
"""

from __future__ import annotations

import argparse
import builtins
import copy
import json
import random
import sys
import tempfile
import time
import unicodedata
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from eval.bfcl.backend import method_table, new_instances
from eval.bfcl.checker import check_entry
from eval.bfcl.official import CATEGORIES, OFFICIAL_FC_MODEL, Entry, load_category
from eval.bfcl.parity import official_decode, official_verdict, run_bfcl_evaluate
from eval.bfcl.replay import json_calls
from eval.bfcl.score import decode_result

T = TypeVar("T")
Raw = list[list[Any]]  # per turn, per step: [{name: arguments}, ...] or text
Verdict = tuple[bool, str | None]


class Choose(Protocol):
    def pick(self, options: Sequence[T]) -> T: ...
    def integer(self, lo: int, hi: int) -> int: ...
    def text(self) -> str: ...


class RandomChoose:
    ALPHABET = "aé中ｌ ﬁ\t\n\"'\\(){}[]=,.;:_-0123456789\u200b\U0001f600ß"

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def text(self) -> str:
        return "".join(self.rng.choice(self.ALPHABET) for _ in range(self.rng.randint(0, 12)))


def ground_truth_raw(entry: Entry) -> Raw:
    table = method_table(new_instances(entry))
    turns: Raw = []
    for calls in entry.ground_truth:
        steps: list[Any] = [[{n: a} for n, a in json_calls(calls, table)]] if calls else []
        turns.append([*steps, "Done."])
    return turns


def _safe_name(name: str) -> bool:
    """A name the official evaluator can ``eval`` in this process without harm: nothing in it
    normalises to a builtin (``ｅｘｉｔ`` would be ``exit`` there)."""
    words = "".join(c if c.isidentifier() or c.isdigit() else " " for c in name).split()
    return not any(unicodedata.normalize("NFKC", w) in dir(builtins) for w in words)


FULLWIDTH = {c: chr(ord(c) + 0xFEE0) for c in "abcdefghijklmnopqrstuvwxyz"}


def _rename(name: str, c: Choose, others: list[str]) -> str:
    kind = c.pick(["fullwidth", "one_fullwidth", "ligature", "dotted", "expression", "spaces"])
    if kind == "fullwidth":
        return "".join(FULLWIDTH.get(ch, ch) for ch in name)
    if kind == "one_fullwidth" and name:
        i = c.integer(0, len(name) - 1)
        return name[:i] + FULLWIDTH.get(name[i], name[i]) + name[i + 1 :]
    if kind == "ligature":
        return name.replace("fi", "ﬁ").replace("fl", "ﬂ") if "f" in name else name.upper()
    if kind == "dotted":
        return c.pick(["GorillaFileSystem.", "functions.", "api.", "x.y."]) + name
    if kind == "expression":
        other = c.pick(others)
        return c.pick([f"{other}() or {name}", f"{name}()", f"{other}() and {name}"])
    return c.pick([" ", "", "\t"]) + name + c.pick([" ", "", "\n"])


def _json_value(c: Choose) -> Any:
    return c.pick([0, -1, 2.5, True, None, "", c.text(), [1, "a"], {"k": c.text()}, "ls(x)"])


def _spoil_arguments(args: str, c: Choose) -> Any:
    try:
        obj = json.loads(args)
    except (ValueError, RecursionError):  # spoilt already
        return args
    if not isinstance(obj, dict):
        return args
    kind = c.pick(["type", "unicode", "key", "decoded", "encoding", "broken", "extra"])
    keys = sorted(obj)
    if kind in ("type", "unicode") and keys:
        k = c.pick(keys)
        obj[k] = _json_value(c) if kind == "type" else c.text() + str(obj[k])
    elif kind == "key" and keys:
        k = c.pick(keys)
        new = c.pick(["".join(FULLWIDTH.get(x, x) for x in k), k.upper(), k + "-x", f"{k} "])
        obj[new] = obj.pop(k)
    elif kind == "decoded":
        return obj  # the arguments as an object, not a JSON string
    elif kind == "encoding":
        return c.pick(
            [
                json.dumps(obj, ensure_ascii=False),
                json.dumps(obj, indent=2),
                "  " + json.dumps(obj) + "\n",
                json.dumps(obj).replace("1", "1.0", 1),
            ]
        )
    elif kind == "broken":
        return c.pick(
            [
                args[:-1],
                "",
                "[1]",
                "null",
                '"x"',
                '{"a": ' + "9" * 4500 + "}",
                '{"a": ' + "[" * 5000 + "]" * 5000 + "}",
                '{"a": Infinity}',
                '{"a": NaN}',
                "{'a': 1}",
            ]
        )
    else:
        obj[c.pick(["extra", "ｅxtra", "path", "folder"])] = _json_value(c)
    return json.dumps(obj)


def _busy(turns: Raw) -> list[tuple[int, int]]:
    return [
        (t, s)
        for t, turn in enumerate(turns)
        for s, st in enumerate(turn)
        if st and isinstance(st, list)
    ]


def _mutate_call(turns: Raw, c: Choose, names: list[str]) -> None:
    calls = [
        (t, s, i)
        for t, s in _busy(turns)
        for i, call in enumerate(turns[t][s])
        if isinstance(call, dict) and len(call) == 1
    ]
    if not calls:
        return
    t, s, i = c.pick(calls)
    step = turns[t][s]
    ((name, args),) = step[i].items()
    if c.pick([True, False]):
        new = _rename(name, c, names)
        if _safe_name(new):
            step[i] = {new: args}
    else:
        step[i] = {name: _spoil_arguments(args, c) if isinstance(args, str) else args}


def _mutate_structure(turns: Raw, c: Choose) -> Raw:
    kind = c.pick(["empty_step", "split", "merge_turns", "drop_turn", "extra_turn", "duplicate"])
    kind = c.pick([kind, "text_step", "multi_key", "drop_call"])
    busy = _busy(turns)
    if not turns:  # every turn dropped already: nothing to pick from, an empty turn to add
        turns.append([])
    elif kind == "empty_step":
        t = c.integer(0, len(turns) - 1)
        turns[t].insert(c.integer(0, len(turns[t])), c.pick([[], [{}], ""]))
    elif kind == "merge_turns" and len(turns) > 1:
        t = c.integer(0, len(turns) - 2)
        turns[t][-1:] = turns[t + 1]
        turns[t + 1] = ["Done."]
    elif kind == "drop_turn":
        del turns[c.integer(0, len(turns) - 1)]
    elif kind == "extra_turn":
        turns.append(copy.deepcopy(c.pick(turns)))
    elif busy:
        t, s = c.pick(busy)
        step = turns[t][s]
        if kind == "split":
            turns[t][s : s + 1] = [[call] for call in step]
        elif kind == "duplicate":
            step.insert(c.integer(0, len(step)), copy.deepcopy(c.pick(step)))
        elif kind == "text_step":
            turns[t][s] = c.pick(["I will call the tools now.", "", json.dumps(step)])
        elif kind == "multi_key" and len(step) > 1 and len(step[0].keys() | step[1].keys()) == 2:
            step[0:2] = [{**step[0], **step[1]}]
        elif kind == "drop_call":
            del step[c.integer(0, len(step) - 1)]
    return turns


def mutate(entry: Entry, c: Choose) -> Raw:
    turns = ground_truth_raw(entry)
    names = sorted(method_table(new_instances(entry)))
    for _ in range(c.integer(1, 3)):
        if c.pick([True, True, False]):
            _mutate_call(turns, c, names)
        else:
            turns = _mutate_structure(turns, c)
    return turns


def ours(entry: Entry, raw: Raw) -> Verdict:
    v = check_entry(entry, decode_result(raw))
    return v.valid, v.error_type


def official_in_process(entry: Entry, raw: Raw) -> Verdict:
    return official_verdict(entry, official_decode(raw))


def official_cli(bfcl: Path, cases: list[tuple[Entry, Raw]]) -> dict[str, Verdict]:
    """The official ``bfcl evaluate`` on result files of the cases (one entry id each)."""
    with tempfile.TemporaryDirectory(prefix="astra-bfcl-fuzz-") as tmp:
        work = Path(tmp)
        target = work / "result" / OFFICIAL_FC_MODEL.replace("/", "_") / "multi_turn"
        target.mkdir(parents=True)
        cats = sorted({e.category for e, _ in cases})
        for cat in cats:
            with (target / f"BFCL_v4_multi_turn_{cat}_result.json").open("w") as f:
                for e, raw in cases:
                    if e.category == cat:
                        f.write(json.dumps({"id": e.id, "result": raw}) + "\n")
        scores = run_bfcl_evaluate(bfcl, work / "result", work / "score", cats, OFFICIAL_FC_MODEL)
    failing = {x["id"]: x["error"]["error_type"] for lines in scores.values() for x in lines[1:]}
    return {e.id: (e.id not in failing, failing.get(e.id)) for e, _ in cases}


def batch(c: Choose, per_category: int) -> list[tuple[Entry, Raw]]:
    """Mutated cases over distinct entries (a result file holds an id once)."""
    out = []
    for cat in CATEGORIES:
        entries = list(load_category(cat))
        for _ in range(per_category):
            entry = entries.pop(c.integer(0, len(entries) - 1))
            out.append((entry, mutate(entry, c)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=400, help="cases per official CLI run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--official-bfcl", type=Path, default=Path(".venv-bfcl/bin/bfcl"))
    args = ap.parse_args()
    c = RandomChoose(random.Random(args.seed))
    seen: Counter[str] = Counter()
    differ = []
    t0 = time.monotonic()
    for _ in range(max(1, args.cases // args.batch)):
        cases = batch(c, min(200, args.batch // len(CATEGORIES)))
        cli = official_cli(args.official_bfcl, cases)
        for entry, raw in cases:
            mine, theirs, there = ours(entry, raw), official_in_process(entry, raw), cli[entry.id]
            seen[str(mine[1])] += 1
            if not mine == theirs == there:
                differ.append({"id": entry.id, "ours": mine, "official": there, "raw": raw})
    total = sum(seen.values())
    print(f"{total} cases in {time.monotonic() - t0:.1f} s; verdicts: {dict(seen)}")
    print(f"agree with the official evaluator: {total - len(differ)}, differ: {len(differ)}")
    for d in differ[:10]:
        print(json.dumps(d, ensure_ascii=False, default=repr)[:2000])
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
