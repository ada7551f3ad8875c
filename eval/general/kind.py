"""General benchmarks (lm-eval tasks) as their runs' readers see them
(:class:`eval.run.EvalKind`): records and summary, the report section and the CLI table.
Their runs are not compared entry by entry (no pairing).

The smallest kind: a new eval's ``kind.py`` starts as a copy of this one."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from astra_agent.console import console
from eval.general.report import general_section
from eval.general.runner import NAME, GeneralRecord, GeneralSummary
from eval.run import EvalKind, Guess


def general_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task, the mean of each numeric field of its records (booleans as 0/1)."""
    sums: dict[str, dict[str, list[float]]] = {}
    for r in records:
        task = str(r.get("task", "(none)"))
        metrics = sums.setdefault(task, {})
        for key, value in r.items():
            if key in ("id", "task", "index") or isinstance(value, str):
                continue
            if isinstance(value, bool | int | float):
                metrics.setdefault(key, []).append(float(value))
    tasks = {
        task: {k: round(sum(v) / len(v), 4) for k, v in metrics.items() if v}
        for task, metrics in sorted(sums.items())
    }
    return {"tasks": tasks, "samples": len(records)}


def _summarize(typed: list[Any], records: list[dict[str, Any]], fp: dict[str, Any]) -> dict:
    return {"kind": NAME, **general_summary(records)}


def _show(summary: GeneralSummary) -> None:
    table = Table(title=f"general: {summary.samples} samples, model {summary.model}")
    for col in ("task", "metric", "value"):
        table.add_column(col, justify="left" if col != "value" else "right")
    for task, metrics in summary.tasks.items():
        for name, value in metrics.items():
            table.add_row(escape(task), escape(name), f"{value:.4f}")
    console.print(table)
    for note in summary.notes:
        console.print(f"note: {escape(note)}")
    if summary.errors:
        console.print(
            f"{summary.errors} of {summary.samples} sample(s) got no usable reply "
            "(inference errors, left out of the metrics; see results.jsonl): "
            "--retry-errors re-runs them"
        )
    aime = summary.published["AIME"]
    console.print(
        f"published AIME (paper): {' / '.join(f'{x:.2f}' for x in aime['figures'])} for "
        f"{' / '.join(aime['models'])} (which is which: unconfirmed); compare like with like"
    )


GENERAL = EvalKind(
    name=NAME,
    title="general",
    counted_by="samples",
    record=GeneralRecord,
    summary=GeneralSummary,
    summarize=_summarize,
    section=general_section,
    show=_show,
    guess=Guess(
        summary=lambda s: isinstance(s.get("tasks"), dict),
        fingerprint=lambda fp: "tasks" in fp,
        record=lambda r: "task" in r and "id" in r,
    ),
)
