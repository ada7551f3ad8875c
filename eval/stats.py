"""What a comparison of two runs is made of, below every eval: one :class:`Row` per id, the
paired tests (:class:`PairedTest`: exact McNemar, Wilcoxon signed-rank), and the
:class:`Comparison` they make, read through its kind's :class:`Pairing` (how its entries pair
and are tested, what its groups are called, what its JSON and tables add).

Each eval kind that can be compared gives its :class:`Pairing` (:mod:`eval.kinds`);
:mod:`eval.compare` reads the runs and builds the comparison. Nothing here knows an eval.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from rich.table import Table

    from eval.results import EvalRecord

Change = Literal[
    "fixed", "broken", "changed_error", "both_fail", "both_pass", "error", "only_a", "only_b"
]
Direction = Literal["up", "down", "same"]
MIN_PAIRS = 6  # non-zero reward differences below which no Wilcoxon test is run
EPS = 1e-9  # rewards closer than this are the same
COUNTED = ("fixed", "broken", "changed_error", "both_fail", "both_pass")
CHANGED = ("broken", "fixed", "changed_error")  # listed first, in this order


@dataclass(frozen=True)
class Row:
    """One id: its change, its category (BFCL) or domain (arenas, τ²), and each run's verdict
    (BFCL, τ²: passed; arenas: the reward; None where the run has no verdict: not there, or an
    error) with why it failed."""

    id: str
    change: Change
    group: str
    a: bool | float | None
    b: bool | float | None
    a_error: str | None = None
    b_error: str | None = None
    a_solved: bool | None = None  # arenas
    b_solved: bool | None = None
    reward: Direction | None = None  # arenas, compared rows

    @property
    def compared(self) -> bool:
        return self.change in COUNTED


@dataclass(frozen=True)
class PairedTest:
    """A significance test: ``statistic`` and ``p_value`` are None where it could not run
    (``note`` says why)."""

    name: str
    statistic: float | None
    p_value: float | None
    n: int
    note: str


Tested = tuple[list[PairedTest], list[Any]]  # the paired tests, and per-task rows (τ²)
# (run paths, their fingerprints, their summaries) → warnings; a ConfigError refuses the pair
Comparable = Callable[[tuple[Path, Path], tuple[dict[str, Any], ...], tuple[Any, ...]], list[str]]


def by_name(group: str) -> tuple[int, str]:
    """The default order of groups: by name."""
    return 0, group


@dataclass(frozen=True)
class Pairing:
    """How one eval kind's runs are compared: ``row`` classifies an id from its two records
    (None where a run lacks it), ``tests`` runs the paired tests on the rows; the rest says
    how the comparison reads (``what``: ``compare: two BFCL runs``; ``noun``: ``a BFCL
    run``), and what the kind adds: a check that two runs are comparable at all (refusing,
    or returning warnings), JSON and CLI tables of its own."""

    what: str
    noun: str
    row: Callable[[str, Any, Any], Row]
    tests: Callable[[list[Row]], Tested]
    group_key: str = "domain"
    group_order: Callable[[str], Any] = by_name
    rewards: bool = False  # rows carry rewards and solved flags (the arenas)
    error_types: bool = False  # a failure has a type, and ``changed_error`` is a change
    comparable: Comparable | None = None
    to_dict: Callable[[Comparison], dict[str, Any]] | None = None
    tables: Callable[[Comparison, int], list[Table]] | None = None  # after the groups' table


@dataclass(frozen=True)
class Comparison:
    """Run B against run A: one row per id of either run (in natural id order), the paired
    tests, what was missing from the runs (``warnings``), and (τ²) one row per task."""

    kind: str
    names: tuple[str, str]
    models: tuple[str | None, str | None]
    rows: tuple[Row, ...]
    tests: tuple[PairedTest, ...]
    pairing: Pairing = field(repr=False, compare=False)
    warnings: tuple[str, ...] = field(default=())
    tasks: tuple[Any, ...] = field(default=())  # τ²: eval.tau2.runs.TaskRow

    @property
    def group_key(self) -> str:
        return self.pairing.group_key

    def counts(self) -> dict[str, int]:
        c: Counter[str] = Counter(r.change for r in self.rows)
        out = {k: c[k] for k in COUNTED}
        out |= {"errors": c["error"], "only_a": c["only_a"], "only_b": c["only_b"]}
        if self.pairing.rewards:
            d = Counter(r.reward for r in self.rows if r.compared)
            out |= {f"reward_{k}": d[k] for k in ("up", "down", "same")}
        return out

    def groups(self) -> dict[str, dict[str, float | int]]:
        """Per category (BFCL, in the official order) or domain: {a, b, n} (+ rewards)."""
        names = sorted({r.group for r in self.rows if r.compared}, key=self.pairing.group_order)
        rows = [r for r in self.rows if r.compared]
        rewards = self.pairing.rewards
        return {g: accuracy([r for r in rows if r.group == g], rewards) for g in names}

    def overall(self) -> dict[str, float | int]:
        return accuracy([r for r in self.rows if r.compared], self.pairing.rewards)

    def changed(self) -> list[Row]:
        """The rows whose verdict changed (broken first), then (arenas) whose reward did."""
        order = {c: i for i, c in enumerate(CHANGED)}
        moved = [r for r in self.rows if r.change in order]
        moved.sort(key=lambda r: order[r.change])
        return moved + [
            r for r in self.rows if r.change not in order and r.reward in ("up", "down")
        ]

    def to_dict(self) -> dict[str, Any]:
        """The comparison as JSON-able data (``astra-eval compare --json``, the report)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "names": list(self.names),
            "models": list(self.models),
            "counts": self.counts(),
            "overall": self.overall(),
            "groups": self.groups(),
            "tests": [asdict(t) for t in self.tests],
            "rows": [self._row_dict(r) for r in self.rows],
            "warnings": list(self.warnings),
        }
        if self.pairing.to_dict is not None:
            out |= self.pairing.to_dict(self)
        return out

    def _row_dict(self, r: Row) -> dict[str, Any]:
        row: dict[str, Any] = {"id": r.id, "change": r.change, self.group_key: r.group}
        row |= {"a": r.a, "b": r.b, "a_error": r.a_error, "b_error": r.b_error}
        if self.pairing.rewards:
            row |= {"a_solved": r.a_solved, "b_solved": r.b_solved, "reward": r.reward}
        return row


def accuracy(rows: list[Row], rewards: bool = False) -> dict[str, float | int]:
    """Pass rates of A and B over ``rows``; with ``rewards``, pass is fully solved and the
    mean rewards come too."""
    n = len(rows)
    if rewards:
        return {
            "a": frac(sum(bool(r.a_solved) for r in rows), n),
            "b": frac(sum(bool(r.b_solved) for r in rows), n),
            "n": n,
            "a_reward": frac(sum(float(r.a or 0) for r in rows), n),
            "b_reward": frac(sum(float(r.b or 0) for r in rows), n),
        }
    a, b = sum(r.a is True for r in rows), sum(r.b is True for r in rows)
    return {"a": frac(a, n), "b": frac(b, n), "n": n}


def frac(x: float, n: int) -> float:
    return round(x / n, 4) if n else 0.0


def natural_key(text: str) -> list[tuple[int, int, str]]:
    """``multi_turn_base_2`` before ``multi_turn_base_10``."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


# ------------------------------------------------------------------ classification


def verdict_change(pa: bool, pb: bool) -> Change:
    if pa != pb:
        return "fixed" if pb else "broken"
    return "both_pass" if pa else "both_fail"


def presence(ra: EvalRecord | None, rb: EvalRecord | None) -> Change | None:
    """The change of an id that is not compared: in one run only, or an error in either."""
    if ra is None:
        return "only_b"
    if rb is None:
        return "only_a"
    if ra.error_kind is not None or rb.error_kind is not None:
        return "error"
    return None


# ------------------------------------------------------------------ tests


def mcnemar(fixed: int, broken: int, what: str = "verdicts") -> PairedTest:
    """The exact McNemar test: two-sided binomial test of ``fixed`` of the discordant pairs
    against p = 1/2. ``statistic`` is ``fixed``, ``n`` the discordant pairs."""
    from scipy.stats import binomtest

    name = f"McNemar exact ({what})"
    n = fixed + broken
    if n == 0:
        return PairedTest(name, None, None, 0, "no discordant pairs: the runs agree on every entry")
    p = float(binomtest(fixed, n, 0.5).pvalue)
    return PairedTest(name, float(fixed), p, n, f"{fixed} fixed vs {broken} broken (two-sided)")


def verdict_tests(rows: list[Row], what: str = "verdicts") -> list[PairedTest]:
    """McNemar on the rows' verdicts."""
    c = Counter(r.change for r in rows)
    return [mcnemar(c["fixed"], c["broken"], what)]


def mean_ci(xs: Sequence[float]) -> tuple[float, float] | None:
    """The mean of ``xs`` and the half-width of its 95% confidence interval (normal
    approximation); None for no values."""
    n = len(xs)
    if not n:
        return None
    m = sum(xs) / n
    sd = (sum((x - m) ** 2 for x in xs) / (n - 1)) ** 0.5 if n > 1 else 0.0
    return m, 1.96 * sd / n**0.5


def wilcoxon_rewards(diffs: list[float]) -> PairedTest:
    """The Wilcoxon signed-rank test on paired reward differences (B − A); zeros are dropped,
    and under :data:`MIN_PAIRS` non-zero ones no test is run. ``statistic`` is scipy's (the
    smaller rank sum), ``n`` the non-zero differences."""
    from scipy.stats import wilcoxon

    name = "Wilcoxon signed-rank (reward)"
    nonzero = [d for d in diffs if abs(d) > EPS]
    mean = sum(diffs) / len(diffs) if diffs else 0.0
    about = f"mean difference B − A {mean:+.4f} over {len(diffs)} tasks"
    if len(nonzero) < MIN_PAIRS:
        note = f"too few pairs: {len(nonzero)} non-zero differences (needs {MIN_PAIRS}); {about}"
        return PairedTest(name, None, None, len(nonzero), note)
    res = wilcoxon(nonzero)
    return PairedTest(name, float(res.statistic), float(res.pvalue), len(nonzero), about)
