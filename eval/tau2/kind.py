"""τ²-bench as its runs' readers see it (:class:`eval.run.EvalKind`): records and summary,
the pairing of two runs (conversations and tasks, refused across data versions or user
simulators: :mod:`eval.tau2.runs`), the report section and the CLI table."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.markup import escape
from rich.table import Table

from astra_agent.console import console
from eval.run import EvalKind, Guess
from eval.stats import Comparison, Pairing
from eval.tau2.records import Tau2Record, Tau2Summary
from eval.tau2.report import task_blocks, tau2_section
from eval.tau2.runner import NAME, PUBLISHED, summarize
from eval.tau2.runs import (
    changed_tasks_table,
    check_comparable,
    conversation_row,
    paired_tests,
    task_counts,
    tasks_table,
    tau2_summary,
)


def _summarize(typed: list[Any], records: list[dict[str, Any]], fp: dict[str, Any]) -> dict:
    return tau2_summary(typed, fp)


def _to_dict(c: Comparison) -> dict[str, Any]:
    return {"task_counts": task_counts(c.tasks), "tasks": [asdict(t) for t in c.tasks]}


def _tables(c: Comparison, show: int) -> list[Table]:
    """Tasks by change per domain, and the first ``show`` tasks that moved."""
    tables = [tasks_table(c)]
    if show > 0 and (moved := changed_tasks_table(c, show)) is not None:
        tables.append(moved)
    return tables


def _score(record: dict[str, Any]) -> float | None:
    reward = record.get("reward")
    return None if record.get("error_kind") or reward is None else float(reward)


def _progress(records: list[Any]) -> str:
    s = summarize(records, trials=1)
    return "  ".join(f"{d} {row.mean_reward:.2f}" for d, row in s.domains.items() if row.scored)


def _show(summary: Tau2Summary) -> None:
    trials = summary.trials or 1
    ks = [str(k) for k in range(1, trials + 1)]
    table = Table(title=f"τ²-bench: {summary.conversations} conversations, model {summary.model}")
    for col in ("domain", "tasks", "scored", "errors", *(f"pass^{k}" for k in ks)):
        table.add_column(col, justify="left" if col == "domain" else "right")
    for name, row in summary.domains.items():
        figures = [f"{100 * row.pass_hat_k[k]:.2f}" if k in row.pass_hat_k else "-" for k in ks]
        table.add_row(escape(name), str(row.tasks), str(row.scored), str(row.errors), *figures)
    console.print(table)
    if summary.overall_pass_1 is not None:
        console.print(
            f"overall pass^1: {100 * summary.overall_pass_1:.2f} (the mean of "
            f"{', '.join(summary.domains)})"
        )
    _show_setting(summary)


def _show_setting(summary: Tau2Summary) -> None:
    """The paper's figures (for reference), the run's data version and user simulator."""
    paper = {"retail", "telecom"}
    if set(summary.domains) != paper or any(row.tasks != 114 for row in summary.domains.values()):
        console.print(
            "not the paper's task set (all 114 tasks of retail and of telecom): the published "
            "figures below are for reference only"
        )
    published = "; ".join(
        f"{m} " + " / ".join(f"{k} {v:.2f}" for k, v in row.items()) for m, row in PUBLISHED.items()
    )
    console.print(f"published (ASTRA paper, pass^1, user simulator GPT-5.1): {published}")
    user = summary.user_simulator
    data = summary.data
    console.print(
        f"τ² data: inspect-evals {data.get('inspect_evals')} (task version "
        f"{data.get('tau2_task_version')}); user simulator: {escape(str(user.get('model')))} at "
        f"temperature {user.get('temperature')}: figures compare only with runs of the same two"
    )
    if summary.errors:
        console.print(
            f"{summary.errors} conversation(s) could not be played (not scored; see "
            "results.jsonl): --retry-errors re-runs them"
        )


TAU2 = EvalKind(
    name=NAME,
    title="τ²-bench",
    counted_by="conversations",
    record=Tau2Record,
    summary=Tau2Summary,
    summarize=_summarize,
    section=tau2_section,
    compare_blocks=task_blocks,
    show=_show,
    progress=_progress,
    score=_score,
    guess=Guess(
        summary=lambda s: "overall_pass_1" in s or "user_simulator" in s,
        fingerprint=lambda fp: "user_simulator" in fp,
        record=lambda r: "trial" in r and "user_side" in r,
        first=True,  # its records carry task_id and reward, as the arenas' do
    ),
    pairing=Pairing(
        what="τ²",
        noun="a τ²",
        row=conversation_row,
        tests=paired_tests,
        comparable=check_comparable,
        to_dict=_to_dict,
        tables=_tables,
    ),
)
