"""``astra-eval compare``: what changed, entry by entry, between two BFCL runs, two arena runs or
two τ² runs.

Each id common to both runs is classified: ``fixed`` (A fails, B passes), ``broken`` (A
passes, B fails), ``changed_error`` (both fail, with another BFCL ``error_type``),
``both_fail``, ``both_pass``; for the arenas pass means ``fully_solved`` and each task's reward
also went ``up``, ``down`` or stayed the ``same``. An entry recorded as an error (``error_kind``
set: it has no verdict of its own) in either run is ``error``: listed, never tested. Ids in one
run only are ``only_a``/``only_b``. A τ² entry is a conversation (``domain/task_id/trial``,
pass: reward 1); its tasks are compared too, and runs of another τ² data version or user
simulator are refused (:mod:`eval.tau2.runs`).

The tests are paired: the exact McNemar test (a two-sided binomial test on the discordant
pairs, fixed vs broken) on the verdicts, and for the arenas the Wilcoxon signed-rank test on
the reward differences (given at least :data:`MIN_PAIRS` non-zero ones), and for τ² the sign
test over its tasks (:func:`eval.tau2.runs.sign_test`). Accuracies, per
category or domain and overall, are fractions (0..1) over the compared entries only, so that
A and B are measured on the same entries.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.markup import escape
from rich.table import Table

from astra_agent.errors import ConfigError
from astra_agent.runio import write_json_atomic
from eval.results import EvalRecord

if TYPE_CHECKING:
    from eval.tau2.runs import TaskRow

Kind = Literal["bfcl", "arenas", "tau2"]
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


@dataclass(frozen=True)
class Comparison:
    """Run B against run A: one row per id of either run (in natural id order), the paired
    tests, what was missing from the runs (``warnings``), and for τ² one row per task."""

    kind: Kind
    names: tuple[str, str]
    models: tuple[str | None, str | None]
    rows: tuple[Row, ...]
    tests: tuple[PairedTest, ...]
    warnings: tuple[str, ...] = field(default=())
    tasks: tuple[TaskRow, ...] = field(default=())  # τ²

    @property
    def group_key(self) -> str:
        return "category" if self.kind == "bfcl" else "domain"

    def counts(self) -> dict[str, int]:
        c: Counter[str] = Counter(r.change for r in self.rows)
        out = {k: c[k] for k in COUNTED}
        out |= {"errors": c["error"], "only_a": c["only_a"], "only_b": c["only_b"]}
        if self.kind == "arenas":
            d = Counter(r.reward for r in self.rows if r.compared)
            out |= {f"reward_{k}": d[k] for k in ("up", "down", "same")}
        return out

    def groups(self) -> dict[str, dict[str, float | int]]:
        """Per category (BFCL, in the official order) or domain: {a, b, n} (+ rewards)."""
        names = sorted({r.group for r in self.rows if r.compared}, key=_group_order)
        rows = [r for r in self.rows if r.compared]
        return {g: _accuracy([r for r in rows if r.group == g], self.kind) for g in names}

    def overall(self) -> dict[str, float | int]:
        return _accuracy([r for r in self.rows if r.compared], self.kind)

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
            "rows": [_row_dict(r, self.kind) for r in self.rows],
            "warnings": list(self.warnings),
        }
        if self.kind == "tau2":
            from eval.tau2.runs import task_counts

            out["task_counts"] = task_counts(self.tasks)
            out["tasks"] = [asdict(t) for t in self.tasks]
        return out


def _row_dict(r: Row, kind: Kind) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": r.id,
        "change": r.change,
        "category" if kind == "bfcl" else "domain": r.group,
    }
    row |= {"a": r.a, "b": r.b, "a_error": r.a_error, "b_error": r.b_error}
    if kind == "arenas":
        row |= {"a_solved": r.a_solved, "b_solved": r.b_solved, "reward": r.reward}
    return row


def _accuracy(rows: list[Row], kind: Kind) -> dict[str, float | int]:
    n = len(rows)
    if kind == "arenas":  # pass = fully solved; the mean rewards too
        return {
            "a": _frac(sum(bool(r.a_solved) for r in rows), n),
            "b": _frac(sum(bool(r.b_solved) for r in rows), n),
            "n": n,
            "a_reward": _frac(sum(float(r.a or 0) for r in rows), n),
            "b_reward": _frac(sum(float(r.b or 0) for r in rows), n),
        }
    a, b = sum(r.a is True for r in rows), sum(r.b is True for r in rows)
    return {"a": _frac(a, n), "b": _frac(b, n), "n": n}


def _frac(x: float, n: int) -> float:
    return round(x / n, 4) if n else 0.0


def _group_order(name: str) -> tuple[int, str]:
    from eval.bfcl.official import CATEGORIES

    return (CATEGORIES.index(name), "") if name in CATEGORIES else (len(CATEGORIES), name)


def natural_key(text: str) -> list[tuple[int, int, str]]:
    """``multi_turn_base_2`` before ``multi_turn_base_10``."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


# ------------------------------------------------------------------ reading the runs


@dataclass(frozen=True)
class _Run:
    path: Path
    records: dict[str, Any]  # id → BFCLRecord | ArenaRecord | Tau2Record
    model: str | None
    fingerprint: dict[str, Any]
    summary: dict[str, Any] | None


def _kind(path: Path) -> Kind:
    from eval.rundir import detect_kind

    kind = detect_kind(path)
    if kind not in ("bfcl", "arenas", "tau2"):
        raise ConfigError(
            f"{path} is a {kind} run: compare takes BFCL, arena or τ² runs",
            hint="give the directories of two runs of `astra-eval bfcl`, `astra-eval arenas` "
            "or `astra-eval tau2`",
        )
    return "bfcl" if kind == "bfcl" else "tau2" if kind == "tau2" else "arenas"


def _load(path: Path, warnings: list[str]) -> _Run:
    """The run's records by id (the later of two with one id wins), read without writing to
    the directory (it may be a run still appending); what is missing becomes a warning."""
    from eval.rundir import load_run, typed_records

    run = load_run(path)
    warnings += [f"{path}: {p}" for p in run.problems]
    typed, bad = typed_records(run.kind, run.records)
    if bad:
        warnings.append(f"{path}: {bad} record(s) are not {run.kind} records: left out")
    if not typed:
        raise ConfigError(
            f"{path} holds no {run.kind} records", hint="wait for the run's first entries"
        )
    fingerprint = (run.config or {}).get("fingerprint")
    return _Run(
        path,
        {r.id: r for r in typed},
        run.model or None,
        fingerprint if isinstance(fingerprint, dict) else {},
        run.summary,
    )


_KINDS = {"bfcl": "a BFCL", "arenas": "an arena", "tau2": "a τ²"}


def compare_runs(a: Path, b: Path) -> Comparison:
    """Compare run ``b`` with run ``a`` (both of ``astra-eval bfcl``, ``arenas`` or ``tau2``),
    entry by entry. Runs of different kinds, a directory that is not a run, two runs with no
    id in common, or τ² runs of different data or user simulators are ConfigErrors; a
    half-written run is compared as far as it goes, with a warning."""
    kind_a, kind_b = _kind(a), _kind(b)
    if kind_a != kind_b:
        raise ConfigError(
            f"cannot compare runs of different kinds: {a} is {_KINDS[kind_a]} run, "
            f"{b} {_KINDS[kind_b]} run",
            hint="compare two BFCL runs, two arena runs or two τ² runs",
        )
    warnings: list[str] = []
    ra, rb = _load(a, warnings), _load(b, warnings)
    if kind_a == "tau2":
        from eval.tau2.runs import check_comparable

        pair = (ra.fingerprint, rb.fingerprint)
        warnings += check_comparable((a, b), pair, (ra.summary, rb.summary))
    if not ra.records.keys() & rb.records.keys():
        raise ConfigError(
            f"{a} and {b} have no entry in common ({len(ra.records)} and {len(rb.records)} ids)",
            hint="compare runs of the same categories or task file",
        )
    data = "data_sha256"
    if ra.fingerprint.get(data) and ra.fingerprint.get(data) != rb.fingerprint.get(data):
        warnings.append("the runs used different task files: one id may be two different tasks")
    rows = _rows(kind_a, ra.records, rb.records)
    tasks: list[TaskRow] = []
    if kind_a == "tau2":
        from eval.tau2.runs import sign_test, task_rows

        tasks = task_rows(rows)
        tests = [*_verdict_tests(rows, "conversations, paired by id"), sign_test(tasks)]
    else:
        tests = _verdict_tests(rows) if kind_a == "bfcl" else _arena_tests(rows)
    return Comparison(
        kind=kind_a,
        names=(str(a), str(b)),
        models=(ra.model, rb.model),
        rows=tuple(rows),
        tests=tuple(tests),
        warnings=tuple(warnings),
        tasks=tuple(tasks),
    )


# ------------------------------------------------------------------ classification


def _rows(kind: Kind, a: dict[str, Any], b: dict[str, Any]) -> list[Row]:
    one = {"bfcl": _bfcl_row, "arenas": _arena_row, "tau2": _tau2_row}[kind]
    return [one(i, a.get(i), b.get(i)) for i in sorted(a.keys() | b.keys(), key=natural_key)]


def _verdict_change(pa: bool, pb: bool) -> Change:
    if pa != pb:
        return "fixed" if pb else "broken"
    return "both_pass" if pa else "both_fail"


def _presence(ra: EvalRecord | None, rb: EvalRecord | None) -> Change | None:
    """The change of an id that is not compared: in one run only, or an error in either."""
    if ra is None:
        return "only_b"
    if rb is None:
        return "only_a"
    if ra.error_kind is not None or rb.error_kind is not None:
        return "error"
    return None


def _bfcl_row(id_: str, ra: Any, rb: Any) -> Row:
    def why(r: Any) -> str | None:
        if r is None or r.valid:
            return None
        return str(r.error or r.error_type) if r.error_kind else r.error_type

    def verdict(r: Any) -> bool | None:
        return None if r is None or r.error_kind else bool(r.valid)

    change = _presence(ra, rb)
    if change is None:
        change = _verdict_change(ra.valid, rb.valid)
        if change == "both_fail" and ra.error_type != rb.error_type:
            change = "changed_error"
    group = (ra or rb).category
    return Row(id_, change, group, verdict(ra), verdict(rb), why(ra), why(rb))


def _arena_row(id_: str, ra: Any, rb: Any) -> Row:
    def why(r: Any) -> str | None:
        if r is None:
            return None
        if r.error_kind:
            return str(r.error or r.error_kind)
        return None if r.termination == "stop" else f"termination: {r.termination}"

    def reward(r: Any) -> float | None:
        return None if r is None or r.error_kind else float(r.reward)

    def solved(r: Any) -> bool | None:
        return None if r is None or r.error_kind else bool(r.fully_solved)

    change = _presence(ra, rb)
    direction: Direction | None = None
    if change is None:
        change = _verdict_change(ra.fully_solved, rb.fully_solved)
        diff = rb.reward - ra.reward
        direction = "same" if abs(diff) <= EPS else "up" if diff > 0 else "down"
    group = (ra or rb).domain or "(none)"
    return Row(
        id_, change, group, reward(ra), reward(rb), why(ra), why(rb),
        a_solved=solved(ra), b_solved=solved(rb), reward=direction,
    )  # fmt: skip


def _tau2_row(id_: str, ra: Any, rb: Any) -> Row:
    def why(r: Any) -> str | None:
        if r is None or r.reward == 1.0:
            return None
        if r.error_kind:
            return str(r.error or r.error_kind)
        first = (r.explanation or "failed").strip().splitlines() or ["failed"]
        return first[0][:200]

    def verdict(r: Any) -> bool | None:
        return None if r is None or r.error_kind or r.reward is None else r.reward == 1.0

    change = _presence(ra, rb)
    if change is None:
        change = _verdict_change(ra.reward == 1.0, rb.reward == 1.0)
    group = (ra or rb).domain
    return Row(id_, change, group, verdict(ra), verdict(rb), why(ra), why(rb))


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


def _verdict_tests(rows: list[Row], what: str = "verdicts") -> list[PairedTest]:
    c = Counter(r.change for r in rows)
    return [mcnemar(c["fixed"], c["broken"], what)]


def _arena_tests(rows: list[Row]) -> list[PairedTest]:
    compared = [r for r in rows if r.compared]
    diffs = [float(r.b or 0) - float(r.a or 0) for r in compared]
    c = Counter(r.change for r in compared)
    return [wilcoxon_rewards(diffs), mcnemar(c["fixed"], c["broken"], "fully solved")]


# ------------------------------------------------------------------ output


def write_comparison(c: Comparison, path: Path, *, overwrite: bool = False) -> None:
    """``c.to_dict()`` as JSON at ``path``, atomically; an existing file only with
    ``overwrite``."""
    if path.is_dir():
        raise ConfigError(f"cannot write the comparison to {path}: it is a directory")
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} already exists", hint="pass --overwrite to replace it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, c.to_dict())
    except OSError as exc:
        raise ConfigError(f"cannot write the comparison to {path}: {exc.strerror or exc}") from None


def _cell(r: Row, side: Literal["a", "b"]) -> str:
    value = r.a if side == "a" else r.b
    error = r.a_error if side == "a" else r.b_error
    if value is None:
        return "error" if error else "-"
    if isinstance(value, bool):
        return "pass" if value else "fail"
    solved = r.a_solved if side == "a" else r.b_solved
    return f"{value:.3f}" + (" solved" if solved else "")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _runs_table(c: Comparison) -> Table:
    what = {"bfcl": "BFCL", "arenas": "arena", "tau2": "τ²"}[c.kind]
    t = Table(title=f"compare: two {what} runs")
    for col in ("run", "directory", "model", "entries"):
        t.add_column(col, justify="right" if col == "entries" else "left")
    for side, name, model, absent in zip(
        "AB", c.names, c.models, ("only_b", "only_a"), strict=True
    ):
        n = sum(r.change != absent for r in c.rows)
        t.add_row(side, escape(name), escape(model or "-"), str(n))
    return t


def _counts_table(c: Comparison) -> Table:
    counts = c.counts()
    t = Table(title="changes A → B", caption=f"{sum(counts[k] for k in COUNTED)} compared")
    t.add_column("change")
    t.add_column("entries", justify="right")
    label = {"errors": "errors (not compared)", "only_a": "only in A", "only_b": "only in B"}
    for key, value in counts.items():
        if key != "changed_error" or c.kind == "bfcl":
            t.add_row(label.get(key, key.replace("_", " ")), str(value))
    return t


def _tests_table(c: Comparison) -> Table:
    t = Table(title="paired tests")
    for col in ("test", "n", "statistic", "p-value", "note"):
        t.add_column(col, justify="right" if col in ("n", "statistic", "p-value") else "left")
    for x in c.tests:
        stat = "-" if x.statistic is None else f"{x.statistic:g}"
        p = "-" if x.p_value is None else f"{x.p_value:.4g}"
        t.add_row(x.name, str(x.n), stat, p, x.note)
    return t


def _groups_table(c: Comparison) -> Table:
    t = Table(title=f"by {c.group_key} (compared entries)")
    cols = [c.group_key, "n", "A", "B", "Δ pts"]
    if c.kind == "arenas":
        cols = [c.group_key, "n", "A solved", "B solved", "Δ pts", "A reward", "B reward"]
    for col in cols:
        t.add_column(col, justify="left" if col == c.group_key else "right")
    for name, g in [*c.groups().items(), ("all", c.overall())]:
        cells = [escape(name), str(g["n"]), _pct(g["a"]), _pct(g["b"])]
        cells.append(f"{100 * (g['b'] - g['a']):+.1f}")
        if c.kind == "arenas":
            cells += [f"{g['a_reward']:.4f}", f"{g['b_reward']:.4f}"]
        t.add_row(*cells)
    return t


def _changed_table(c: Comparison, show: int) -> Table:
    changed = c.changed()
    t = Table(title=f"changed entries (first {min(show, len(changed))} of {len(changed)})")
    for col in ("id", c.group_key, "change", "A", "B", "A error", "B error"):
        t.add_column(col)
    for r in changed[:show]:
        change = r.change if r.change in CHANGED else f"reward {r.reward}"
        t.add_row(
            escape(r.id), escape(r.group), change, _cell(r, "a"), _cell(r, "b"),
            escape(r.a_error or ""), escape(r.b_error or ""),
        )  # fmt: skip
    return t


def render_table(c: Comparison, show: int = 20) -> list[Table]:
    """The CLI's tables: the two runs, the counts, the tests, per category/domain, (τ²) the
    tasks by change per domain, and the first ``show`` changed entries and (τ²) tasks (none
    when ``show`` is 0)."""
    tables = [_runs_table(c), _counts_table(c), _tests_table(c), _groups_table(c)]
    if c.kind == "tau2":
        from eval.tau2.runs import changed_tasks_table, tasks_table

        tables.append(tasks_table(c))
        if show > 0 and (moved := changed_tasks_table(c, show)) is not None:
            tables.append(moved)
    return [*tables, _changed_table(c, show)] if show > 0 and c.changed() else tables
