"""The BFCL fuzzer (bench/bfcl_fuzz.py), bounded: mutated ground truth — names, argument types
and encodings, step and turn structure, Unicode — scored by us and by the official evaluator
(in-process checker; and one batch through the official ``bfcl evaluate`` CLI), verdict and
error type equal. The property test draws its mutations with hypothesis (a dev extra)."""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bench.bfcl_fuzz import (
    RandomChoose,
    batch,
    ground_truth_raw,
    mutate,
    official_cli,
    official_in_process,
    ours,
)
from eval.bfcl import CATEGORIES, load_category

T = TypeVar("T")
OFFICIAL_BFCL = Path(
    os.environ.get("ASTRA_BFCL_OFFICIAL", Path(__file__).parents[2] / ".venv-bfcl/bin/bfcl")
)


@pytest.mark.integration
def test_a_fuzzed_batch_scores_as_the_official_bfcl_evaluate() -> None:
    """100 mutated entries (25 per category), scored by the official CLI once (< 60 s)."""
    cases = batch(RandomChoose(random.Random("fuzz-ci")), 25)
    cli = official_cli(OFFICIAL_BFCL, cases)
    seen: Counter[str | None] = Counter()
    for entry, raw in cases:
        mine = ours(entry, raw)
        assert mine == official_in_process(entry, raw) == cli[entry.id], (entry.id, raw)
        seen[mine[1]] += 1
    assert len(cases) == 100 and seen[None] >= 5 and len(seen) >= 4, seen


def test_random_mutations_score_as_the_official_checker() -> None:
    c = RandomChoose(random.Random("fuzz-unit"))
    seen: Counter[str | None] = Counter()
    for entry, raw in batch(c, 40):
        mine = ours(entry, raw)
        assert mine == official_in_process(entry, raw), (entry.id, raw)
        seen[mine[1]] += 1
    assert seen[None] >= 5 and len(seen) >= 4, seen


class ScriptedChoose:
    """Choices given in order: the first option equal to the next scripted one, or the number."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)

    def pick(self, options: Sequence[T]) -> T:
        want = self.script.pop(0)
        return next(o for o in options if o == want)

    def integer(self, lo: int, hi: int) -> int:
        n = int(self.script.pop(0))
        assert lo <= n <= hi, (lo, n, hi)
        return n

    def text(self) -> str:
        return str(self.script.pop(0))


@pytest.mark.parametrize("last", ["empty_step", "drop_turn", "extra_turn"])
def test_every_turn_dropped_then_another_structural_mutation(last: str) -> None:
    """Hypothesis found it (CI, 12-06): a two-turn entry with both turns dropped, then a
    mutation that picks a turn, drew from an empty range."""
    entry = next(e for e in load_category("base") if len(ground_truth_raw(e)) == 2)
    drop = [False, "drop_turn", "drop_turn", 0]  # structural, kind, kind again, which turn
    raw = mutate(entry, ScriptedChoose([3, *drop, *drop, False, last, last]))
    assert raw == [[]]
    assert ours(entry, raw) == official_in_process(entry, raw)


try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # a dev extra: the property test needs it
    HAVE_HYPOTHESIS = False
else:
    HAVE_HYPOTHESIS = True


class DrawChoose:
    """The fuzzer's choices drawn by hypothesis (so failures shrink)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def pick(self, options: Sequence[T]) -> T:
        return self.data.draw(st.sampled_from(list(options)))

    def integer(self, lo: int, hi: int) -> int:
        return int(self.data.draw(st.integers(lo, hi)))

    def text(self) -> str:
        return str(self.data.draw(st.text(max_size=12)))


if HAVE_HYPOTHESIS:

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def test_mutations_score_as_the_official_checker(data: Any) -> None:
        category = data.draw(st.sampled_from(CATEGORIES))
        entry = load_category(category)[data.draw(st.integers(0, 199))]
        raw = mutate(entry, DrawChoose(data))
        assert ours(entry, raw) == official_in_process(entry, raw)

else:

    @pytest.mark.skip(reason="hypothesis is not installed (the dev extra has it)")
    def test_mutations_score_as_the_official_checker() -> None:
        raise AssertionError("unreachable")
