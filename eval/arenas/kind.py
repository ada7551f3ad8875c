"""The RL arenas as their runs' readers see them (:class:`eval.run.EvalKind`): records
and summary, the pairing of two runs (reward and fully solved per task: Wilcoxon, McNemar),
the report section and the CLI table."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.markup import escape
from rich.table import Table

from astra_agent.console import console
from eval.arenas.report import arenas_section
from eval.arenas.runner import NAME, ArenaRecord, ArenaSummary, summarize
from eval.run import EvalKind, Guess
from eval.stats import (
    EPS,
    Direction,
    Pairing,
    Row,
    Tested,
    mcnemar,
    presence,
    verdict_change,
    wilcoxon_rewards,
)

METRICS = ("mean_reward", "fully_solved", "mean_recall", "mean_precision", "tool_calls_per_task")


def _summarize(typed: list[Any], records: list[dict[str, Any]], fp: dict[str, Any]) -> dict:
    return summarize(typed).written()


def _row(id_: str, ra: Any, rb: Any) -> Row:
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

    change = presence(ra, rb)
    direction: Direction | None = None
    if change is None:
        change = verdict_change(ra.fully_solved, rb.fully_solved)
        diff = rb.reward - ra.reward
        direction = "same" if abs(diff) <= EPS else "up" if diff > 0 else "down"
    group = (ra or rb).domain or "(none)"
    return Row(
        id_, change, group, reward(ra), reward(rb), why(ra), why(rb),
        a_solved=solved(ra), b_solved=solved(rb), reward=direction,
    )  # fmt: skip


def _tests(rows: list[Row]) -> Tested:
    compared = [r for r in rows if r.compared]
    diffs = [float(r.b or 0) - float(r.a or 0) for r in compared]
    c = Counter(r.change for r in compared)
    return [wilcoxon_rewards(diffs), mcnemar(c["fixed"], c["broken"], "fully solved")], []


def _progress(records: list[Any]) -> str:
    s = summarize(records)
    return f"reward {s.mean_reward:.3f}  solved {s.fully_solved:.0%}"


def _show(summary: ArenaSummary) -> None:
    table = Table(title=f"arenas: {summary.tasks} tasks, model {summary.model}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in (*METRICS, "wall_s"):
        table.add_row(key, str(getattr(summary, key)))
    table.add_row("errors", ", ".join(f"{k}={v}" for k, v in summary.errors.items()) or "none")
    table.add_row("terminations", ", ".join(f"{k}={v}" for k, v in summary.terminations.items()))
    console.print(table)
    domains = Table(title="by domain")
    for col in ("domain", "tasks", "mean_reward", "fully_solved"):
        domains.add_column(col, justify="left" if col == "domain" else "right")
    for name, row in summary.domains.items():
        reward, solved = f"{row.mean_reward:.4f}", f"{row.fully_solved:.0%}"
        domains.add_row(escape(name), str(row.tasks), reward, solved)
    console.print(domains)


ARENAS = EvalKind(
    name=NAME,
    title="arenas",
    counted_by="tasks",
    record=ArenaRecord,
    summary=ArenaSummary,
    summarize=_summarize,
    section=arenas_section,
    show=_show,
    progress=_progress,
    score=lambda r: None if r.get("error_kind") else float(r.get("reward") or 0.0),
    solved=lambda r: not r.get("error_kind") and bool(r.get("fully_solved")),
    guess=Guess(
        summary=lambda s: "mean_reward" in s or ("data" in s and "skipped_records" in s),
        fingerprint=lambda fp: "data_sha256" in fp,
        record=lambda r: "task_id" in r and "reward" in r,
    ),
    pairing=Pairing(what="arena", noun="an arena", row=_row, tests=_tests, rewards=True),
)
