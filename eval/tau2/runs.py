"""τ² runs as the readers see them (:mod:`eval.rundir`, :mod:`eval.compare`, the report): the
summary of a run that did not write one, the check that two runs are comparable at all, and
the per-task side of a comparison.

Two τ² runs are comparable only when they ran the same τ² data (inspect-evals, inspect-ai and
τ²'s task-set version: the run's ``data``) against the same user simulator (its served model
and sampling: ``user_simulator``); the user simulator alone moves τ² scores by tens of points.
:func:`check_comparable` refuses any other pair, and a run that does not say which it used.

A comparison pairs each conversation (``domain/task_id/trial``) of A with B's (an exact
McNemar test on pass/fail, :func:`eval.stats.mcnemar`), and each task with itself: its
passes out of its scored trials in A against B's (the trials may differ in number), a task
``better``, ``worse`` or the ``same``, and an exact two-sided sign test over the tasks that
moved. Trials of one task are not independent draws, so the per-task test is the one whose
pairs are independent; the per-conversation test is given beside it, as for the other evals.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.markup import escape
from rich.table import Table

from astra_agent.errors import ConfigError
from astra_agent.runio import differing_keys
from eval.stats import (
    Comparison,
    PairedTest,
    Row,
    Tested,
    presence,
    verdict_change,
    verdict_tests,
)

if TYPE_CHECKING:
    from eval.tau2.records import Tau2Record

TaskChange = Literal["better", "worse", "same", "unscored"]
TASK_CHANGES: tuple[TaskChange, ...] = ("better", "worse", "same", "unscored")
# What must be equal for two τ² runs to be compared: the key in config.json's fingerprint
# (and summary.json), and what it is called in a message.
SAME: tuple[tuple[str, str], ...] = (
    ("data", "τ² data version"),
    ("user_simulator", "user simulator (model and sampling)"),
)


def tau2_summary(records: list[Tau2Record], fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The summary ``astra-eval tau2`` would write for ``records`` (without what only the run
    knew: its total, its wall time), pass^k up to the highest trial recorded; the data version
    and user simulator from the run's fingerprint."""
    from eval.tau2.runner import summarize

    trials = max((r.trial for r in records), default=1)
    out = summarize(records, trials).written()
    for key, _ in SAME:
        if isinstance(fingerprint.get(key), dict):
            out[key] = fingerprint[key]
    return out


def run_setting(fingerprint: dict[str, Any], summary: dict[str, Any], key: str) -> Any:
    """What a run says of ``key`` (``data``, ``user_simulator``): its config.json's
    fingerprint, else its summary's (None: neither says)."""
    for source in (fingerprint, summary):
        value = source.get(key)
        if isinstance(value, dict) and value:
            return value
    return None


def describe(key: str, value: Any) -> str:
    """A run's data version or user simulator in a few words."""
    if not isinstance(value, dict):
        return "unknown"
    if key == "data":
        return (
            f"inspect-evals {value.get('inspect_evals', '?')} (τ² task version "
            f"{value.get('tau2_task_version', '?')}, inspect-ai {value.get('inspect_ai', '?')})"
        )
    sampling = ", ".join(f"{k} {v}" for k, v in value.items() if k != "model")
    return f"{value.get('model', '?')}" + (f" ({sampling})" if sampling else "")


def check_comparable(
    runs: tuple[Path, Path], fingerprints: tuple[dict[str, Any], ...], summaries: tuple[Any, ...]
) -> list[str]:
    """Refuse (ConfigError) two τ² runs whose data version or user simulator differ, or that
    do not say which they used; the warnings for what may differ (the message limit)."""
    for key, what in SAME:
        a, b = (run_setting(f, s or {}, key) for f, s in zip(fingerprints, summaries, strict=True))
        for path, value in zip(runs, (a, b), strict=True):
            if value is None:
                raise ConfigError(
                    f"cannot compare τ² runs: {path} does not say its {what} (no readable "
                    f"config.json or summary.json with {key!r})",
                    hint="compare runs of `astra-eval tau2`, whose config.json names both",
                )
        if a != b:
            fields = differing_keys(a, b)
            verb = "differs" if len(fields) == 1 else "differ"
            raise ConfigError(
                f"cannot compare τ² runs with different {what} ({', '.join(fields)} {verb}): "
                f"{runs[0]} "
                f"has {describe(key, a)}, {runs[1]} has {describe(key, b)}",
                hint="τ² scores move with the task version and the user simulator: compare "
                "runs made with the same ones (rerun one with --user-base-url/--user-model, "
                "the same sampling and the same inspect-evals)",
            )
    warnings = []
    for key, what in (("message_limit", "message limits"), ("max_steps", "step limits")):
        limits = [f.get(key) for f in fingerprints]
        if limits[0] != limits[1]:
            warnings.append(f"the runs' {what} differ ({limits[0]} vs {limits[1]})")
    return warnings


# ------------------------------------------------------------------ per conversation


def conversation_row(id_: str, ra: Any, rb: Any) -> Row:
    """A conversation of A against B's: pass is reward 1."""

    def why(r: Any) -> str | None:
        if r is None or r.reward == 1.0:
            return None
        if r.error_kind:
            return str(r.error or r.error_kind)
        first = (r.explanation or "failed").strip().splitlines() or ["failed"]
        return first[0][:200]

    def verdict(r: Any) -> bool | None:
        return None if r is None or r.error_kind or r.reward is None else r.reward == 1.0

    change = presence(ra, rb)
    if change is None:
        change = verdict_change(ra.reward == 1.0, rb.reward == 1.0)
    group = (ra or rb).domain
    return Row(id_, change, group, verdict(ra), verdict(rb), why(ra), why(rb))


def paired_tests(rows: list[Row]) -> Tested:
    """McNemar over the conversations, the sign test over the tasks; and the tasks' rows."""
    tasks = task_rows(rows)
    return [*verdict_tests(rows, "conversations, paired by id"), sign_test(tasks)], tasks


# ------------------------------------------------------------------ per task


@dataclass(frozen=True)
class TaskRow:
    """One task of either run: its passes out of its scored trials in A and in B, how it
    moved, and its conversations recorded as errors (not scored)."""

    domain: str
    task_id: str
    a_passed: int
    a_trials: int
    b_passed: int
    b_trials: int
    change: TaskChange
    a_errors: int = 0
    b_errors: int = 0

    @property
    def id(self) -> str:
        return f"{self.domain}/{self.task_id}"


def task_of(conversation: str) -> str:
    """``domain/task_id`` of a conversation id ``domain/task_id/trial`` (task ids may hold
    ``/``: the trial is the last part)."""
    return conversation.rpartition("/")[0] or conversation


def task_rows(rows: list[Row]) -> list[TaskRow]:
    """The conversations' rows grouped by task, in their order."""
    by_task: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_task[task_of(r.id)].append(r)
    return [_task(task, its) for task, its in by_task.items()]


def _task(task: str, rows: list[Row]) -> TaskRow:
    domain, _, task_id = task.partition("/")
    a = [r.a for r in rows if r.a is not None]
    b = [r.b for r in rows if r.b is not None]
    a_errors = sum(r.a is None and r.a_error is not None for r in rows)
    b_errors = sum(r.b is None and r.b_error is not None for r in rows)
    change: TaskChange = "unscored"
    if a and b:
        ra, rb = sum(map(bool, a)) / len(a), sum(map(bool, b)) / len(b)
        change = "same" if ra == rb else "better" if rb > ra else "worse"
    return TaskRow(
        domain, task_id, sum(map(bool, a)), len(a), sum(map(bool, b)), len(b), change,
        a_errors, b_errors,
    )  # fmt: skip


def task_counts(tasks: tuple[TaskRow, ...] | list[TaskRow]) -> dict[str, dict[str, int]]:
    """Tasks by change, per domain and over all (``all``)."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for t in tasks:
        out[t.domain][t.change] += 1
        out["all"][t.change] += 1
    return {d: {k: c[k] for k in TASK_CHANGES} for d, c in sorted(out.items(), key=_all_last)}


def _all_last(item: tuple[str, Any]) -> tuple[bool, str]:
    return item[0] == "all", item[0]


def sign_test(tasks: list[TaskRow]) -> PairedTest:
    """The exact two-sided sign test over the tasks scored in both runs: how many went better
    of those that moved (better or worse), against p = 1/2. ``statistic`` is the better
    ones, ``n`` those that moved."""
    from scipy.stats import binomtest

    name = "sign test (tasks: pass rate over trials)"
    c = Counter(t.change for t in tasks)
    better, worse = c["better"], c["worse"]
    n = better + worse
    scored = n + c["same"]
    if n == 0:
        note = f"no task moved: the runs pass each of {scored} tasks as often"
        return PairedTest(name, None, None, 0, note)
    p = float(binomtest(better, n, 0.5).pvalue)
    note = f"{better} better vs {worse} worse of {scored} tasks (two-sided)"
    return PairedTest(name, float(better), p, n, note)


def changed_tasks(tasks: tuple[TaskRow, ...] | list[TaskRow]) -> list[TaskRow]:
    """The tasks that moved: worse first, then better."""
    return [t for t in tasks if t.change == "worse"] + [t for t in tasks if t.change == "better"]


def passes(passed: int, trials: int) -> str:
    """``3/4`` (``-`` where no trial was scored)."""
    return f"{passed}/{trials}" if trials else "-"


# ------------------------------------------------------------------ the command's tables


def tasks_table(c: Comparison) -> Table:
    """Tasks by change, per domain."""
    t = Table(title="tasks A → B (pass rate over each task's scored trials)")
    for col in ("domain", *TASK_CHANGES):
        t.add_column(col, justify="left" if col == "domain" else "right")
    for domain, counts in task_counts(c.tasks).items():
        t.add_row(escape(domain), *(str(counts[k]) for k in TASK_CHANGES))
    return t


def changed_tasks_table(c: Comparison, show: int) -> Table | None:
    """The first ``show`` tasks that moved (worse first), their passes in A and B."""
    moved = changed_tasks(c.tasks)
    if not moved:
        return None
    t = Table(title=f"changed tasks (first {min(show, len(moved))} of {len(moved)})")
    for col in ("task", "change", "A passed", "B passed", "A errors", "B errors"):
        t.add_column(col, justify="left" if col in ("task", "change") else "right")
    for r in moved[:show]:
        t.add_row(
            escape(r.id), r.change, passes(r.a_passed, r.a_trials), passes(r.b_passed, r.b_trials),
            str(r.a_errors), str(r.b_errors),
        )  # fmt: skip
    return t
