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

This module knows no eval: each kind that pairs its runs gives an :class:`eval.stats.Pairing`
(in its package's ``kind.py``, listed in :mod:`eval.kinds`): how an id's two records make a
:class:`~eval.stats.Row`, its tests, whether two runs are comparable, its extra JSON and
tables. The value types (:class:`~eval.stats.Row`, :class:`~eval.stats.PairedTest`,
:class:`~eval.stats.Comparison`) and the tests live in :mod:`eval.stats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.markup import escape
from rich.table import Table

from astra_agent.errors import ConfigError
from astra_agent.runio import write_json_atomic
from eval.kinds import comparable
from eval.run import EvalKind, Run
from eval.rundir import load_run, typed_records
from eval.stats import (
    CHANGED,
    COUNTED,
    EPS,
    MIN_PAIRS,
    Change,
    Comparison,
    Direction,
    PairedTest,
    Row,
    mcnemar,
    mean_ci,
    natural_key,
    wilcoxon_rewards,
)

__all__ = [
    "CHANGED",
    "COUNTED",
    "EPS",
    "MIN_PAIRS",
    "Change",
    "Comparison",
    "Direction",
    "PairedTest",
    "Row",
    "compare_loaded",
    "compare_runs",
    "mcnemar",
    "mean_ci",
    "natural_key",
    "render_table",
    "wilcoxon_rewards",
    "write_comparison",
]


# ------------------------------------------------------------------ reading the runs


@dataclass(frozen=True)
class _Run:
    path: Path
    records: dict[str, Any]  # id → the kind's record
    model: str | None
    fingerprint: dict[str, Any]
    summary: dict[str, Any] | None


def _or(words: Sequence[str]) -> str:
    """``a, b or c``."""
    return ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else "".join(words)


def _kind(path: Path, run: Run) -> EvalKind:
    """The kind ``run`` was read as, where it is one that pairs its runs."""
    if run.eval_kind is None or run.eval_kind not in comparable():
        whats = [k.pairing.what for k in comparable() if k.pairing is not None]
        commands = [f"`astra-eval {k.name}`" for k in comparable()]
        raise ConfigError(
            f"{path} is a {run.kind} run: compare takes {_or(whats)} runs",
            hint=f"give the directories of two runs of {_or(commands)}",
        )
    return run.eval_kind


def _load(path: Path, run: Run, kind: EvalKind, warnings: list[str]) -> _Run:
    """The run's records by id (the later of two with one id wins), read without writing to
    the directory (it may be a run still appending); what is missing becomes a warning."""
    warnings += [f"{path}: {p}" for p in run.problems]
    typed, bad = typed_records(kind, run.records)
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


def compare_runs(a: Path, b: Path) -> Comparison:
    """Compare run ``b`` with run ``a`` (both of one eval kind that pairs its runs: BFCL, the
    arenas, τ²), entry by entry. Runs of different kinds, a directory that is not a run, two
    runs with no id in common, or runs the kind finds not comparable (τ²: other data or user
    simulator) are ConfigErrors; a half-written run is compared as far as it goes, with a
    warning."""
    return compare_loaded(load_run(a), load_run(b))


def compare_loaded(run_a: Run, run_b: Run) -> Comparison:
    """:func:`compare_runs` of two runs already read (:func:`eval.rundir.load_run`)."""
    a, b = run_a.path, run_b.path
    kind, kind_b = _kind(a, run_a), _kind(b, run_b)
    pairing = kind.pairing
    assert pairing is not None and kind_b.pairing is not None  # _kind: comparable kinds only
    if kind.name != kind_b.name:
        two = [f"two {k.pairing.what} runs" for k in comparable() if k.pairing is not None]
        raise ConfigError(
            f"cannot compare runs of different kinds: {a} is {pairing.noun} run, "
            f"{b} {kind_b.pairing.noun} run",
            hint=f"compare {_or(two)}",
        )
    warnings: list[str] = []
    ra, rb = _load(a, run_a, kind, warnings), _load(b, run_b, kind_b, warnings)
    if pairing.comparable is not None:
        pair = (ra.fingerprint, rb.fingerprint)
        warnings += pairing.comparable((a, b), pair, (ra.summary, rb.summary))
    if not ra.records.keys() & rb.records.keys():
        raise ConfigError(
            f"{a} and {b} have no entry in common ({len(ra.records)} and {len(rb.records)} ids)",
            hint="compare runs of the same categories or task file",
        )
    data = "data_sha256"
    if ra.fingerprint.get(data) and ra.fingerprint.get(data) != rb.fingerprint.get(data):
        warnings.append("the runs used different task files: one id may be two different tasks")
    ids = sorted(ra.records.keys() | rb.records.keys(), key=natural_key)
    rows = [pairing.row(i, ra.records.get(i), rb.records.get(i)) for i in ids]
    tests, tasks = pairing.tests(rows)
    return Comparison(
        kind=kind.name,
        names=(str(a), str(b)),
        models=(ra.model, rb.model),
        rows=tuple(rows),
        tests=tuple(tests),
        pairing=pairing,
        warnings=tuple(warnings),
        tasks=tuple(tasks),
    )


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
    t = Table(title=f"compare: two {c.pairing.what} runs")
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
        if key != "changed_error" or c.pairing.error_types:
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
    if c.pairing.rewards:
        cols = [c.group_key, "n", "A solved", "B solved", "Δ pts", "A reward", "B reward"]
    for col in cols:
        t.add_column(col, justify="left" if col == c.group_key else "right")
    for name, g in [*c.groups().items(), ("all", c.overall())]:
        cells = [escape(name), str(g["n"]), _pct(g["a"]), _pct(g["b"])]
        cells.append(f"{100 * (g['b'] - g['a']):+.1f}")
        if c.pairing.rewards:
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
    if c.pairing.tables is not None:
        tables += c.pairing.tables(c, show)
    return [*tables, _changed_table(c, show)] if show > 0 and c.changed() else tables
