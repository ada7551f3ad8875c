"""BFCL (every category this harness runs) as its runs' readers see it
(:class:`eval.run.EvalKind`): records and summary, the pairing of two runs (verdict per
entry, McNemar), the report section and the CLI table."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from astra_agent.console import console
from eval.bfcl.categories import RUNNABLE
from eval.bfcl.report import bfcl_section
from eval.bfcl.runner import (
    NAME,
    PUBLISHED,
    BFCLRecord,
    BFCLSummary,
    overall_label,
    summarize,
)
from eval.run import EvalKind, Guess
from eval.stats import Pairing, Row, Tested, presence, verdict_change, verdict_tests

CATS = ("base", "miss_func", "miss_param", "long_context")


def _summarize(typed: list[Any], records: list[dict[str, Any]], fp: dict[str, Any]) -> dict:
    return {**summarize(typed).written(), "published": PUBLISHED}


def _row(id_: str, ra: Any, rb: Any) -> Row:
    def why(r: Any) -> str | None:
        if r is None or r.valid:
            return None
        return str(r.error or r.error_type) if r.error_kind else r.error_type

    def verdict(r: Any) -> bool | None:
        return None if r is None or r.error_kind else bool(r.valid)

    change = presence(ra, rb)
    if change is None:
        change = verdict_change(ra.valid, rb.valid)
        if change == "both_fail" and ra.error_type != rb.error_type:
            change = "changed_error"
    group = (ra or rb).category
    return Row(id_, change, group, verdict(ra), verdict(rb), why(ra), why(rb))


def _tests(rows: list[Row]) -> Tested:
    return verdict_tests(rows), []


def _category_order(name: str) -> tuple[int, str]:
    return (RUNNABLE.index(name), "") if name in RUNNABLE else (len(RUNNABLE), name)


def _progress(records: list[Any]) -> str:
    """The running accuracy of the categories seen so far (the last six when many run)."""
    seen: dict[str, list[int]] = {}
    for r in records:
        n = seen.setdefault(r.category, [0, 0])
        n[0] += bool(r.valid)
        n[1] += 1
    return "  ".join(f"{c} {100 * v / n:.1f}" for c, (v, n) in list(seen.items())[-6:])


def _show(summary: BFCLSummary) -> None:
    acc = summary.accuracy
    if any(c in acc for c in CATS):
        _show_multi_turn(summary)
    single = [c for c in acc if c not in CATS]
    if single:
        table = Table(title=f"BFCL single-turn: {summary.model}")
        for col in ("category", "entries", "accuracy"):
            table.add_column(col, justify="right")
        for c in single:
            table.add_row(c, str(summary.counts.get(c, "")), f"{acc[c]:.2f}")
        console.print(table)
    for label, groups, total in (
        ("V4", summary.v4_groups, summary.v4_overall),
        ("V3", summary.v3_groups, summary.v3_overall),
    ):
        if total is None:
            continue
        parts = ", ".join(
            f"{g} {s.value:.2f}" + ("*" if s.missing else "") for g, s in groups.items()
        )
        console.print(
            f"BFCL {label} overall {total.value:.2f}"
            + (" (partial*)" if total.missing else "")
            + f": {parts}"
        )
    missing = sorted({c for t in (summary.v4_overall, summary.v3_overall) if t for c in t.missing})
    if missing:
        console.print(
            "* partial: not run, counted 0 as the official evaluator counts them: "
            + ", ".join(missing)
        )
    if summary.errors:
        console.print("failures: " + ", ".join(f"{k}={v}" for k, v in summary.errors.items()))


def _show_multi_turn(summary: BFCLSummary) -> None:
    table = Table(title=f"BFCL-V3 multi-turn: {summary.model}")
    for col in ("model", "overall", *CATS):
        table.add_column(col, justify="right")
    acc = summary.accuracy
    partial = summary.overall_partial
    overall = "-" if summary.overall is None else f"{summary.overall:.2f}"
    table.add_row(
        f"{summary.model} (measured)",
        overall + (" (partial)" if partial else ""),
        *(f"{acc[c]:.2f}" if c in acc else "-" for c in CATS),
    )
    for name, row in PUBLISHED.items():
        table.add_row(
            f"{name} (published)",
            f"{row['overall']:.2f}",
            *(f"{row[c]:.2f}" if c in row else "-" for c in CATS),
        )
    console.print(table)
    if partial:
        n = sum(c in acc for c in CATS)
        console.print(
            f"{overall_label(acc, partial)}: the mean of {n} of 4 categories, not "
            "comparable with the published overall"
        )


BFCL = EvalKind(
    name=NAME,
    title="BFCL",
    counted_by="entries",
    record=BFCLRecord,
    summary=BFCLSummary,
    summarize=_summarize,
    section=bfcl_section,
    show=_show,
    progress=_progress,
    score=lambda r: None if r.get("error_kind") else float(bool(r.get("valid"))),
    guess=Guess(
        summary=lambda s: "accuracy" in s and "overall" in s,
        fingerprint=lambda fp: "categories" in fp,
        record=lambda r: "category" in r and "valid" in r,
    ),
    pairing=Pairing(
        what="BFCL",
        noun="a BFCL",
        row=_row,
        tests=_tests,
        group_key="category",
        group_order=_category_order,
        error_types=True,
    ),
)
