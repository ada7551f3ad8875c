"""BFCL's part of a report: its section (accuracy per category beside the paper's, failures
by error type, each run's entries) and its entry view (the turns beside the calls the checker
decoded, the verdict and the checker's details)."""

from __future__ import annotations

from typing import Any

from eval.bfcl.official import CATEGORIES
from eval.bfcl.runner import PUBLISHED, overall_label
from eval.report import charts
from eval.report.blocks import (
    Block,
    Cell,
    Charts,
    Entry,
    Heading,
    Note,
    Page,
    Section,
    Table,
    num,
)
from eval.report.entries import clip, entry_list, trajectory_facts, turns
from eval.run import Run


def bfcl_section(runs: list[Run], page: Page) -> Section:
    """Accuracy per category beside the paper's (an overall only over all four categories),
    failures by error type, and each run's entries."""
    blocks: list[Block] = [_bfcl_table(runs, list(CATEGORIES), PUBLISHED)]
    x = [*CATEGORIES, "overall"]
    series: list[tuple[str, list[Any]]] = []
    for run in runs:
        s = run.summary or {}
        acc = s.get("accuracy") or {}
        overall = None if s.get("overall_partial", True) else s.get("overall")
        series.append((run.name, [acc.get(c) for c in CATEGORIES] + [overall]))
    for model, row in PUBLISHED.items():
        series.append((f"{model} (published)", [row.get(c) for c in x]))
    ids = [page.figure(charts.bars("Accuracy by category (%)", x, series, ytitle="accuracy %"))]
    if any(r.summary and r.summary.get("overall_partial", True) for r in runs):
        blocks.append(
            Note(
                "An overall over fewer than the four categories is partial: it is not comparable "
                "with the published overall and is left out of the chart.",
                "warn",
            )
        )
    blocks += _bfcl_failures(runs, page, ids)
    blocks.insert(1, Charts(ids))
    entries: list[Block] = []
    for run in runs:
        entries += [Heading(f"Entries of {run.name}"), entry_list(page, run, bfcl_view)]
    return Section("bfcl", "BFCL-V3 multi-turn", "bfcl", blocks, entries)


def _bfcl_failures(runs: list[Run], page: Page, ids: list[str]) -> list[Block]:
    """Failures by error type: a chart (its id added to ``ids``) and a table."""
    errors = {r.name: (r.summary or {}).get("errors") or {} for r in runs}
    kinds = sorted(
        {k for e in errors.values() for k in e},
        key=lambda k: -sum(e.get(k, 0) for e in errors.values()),
    )
    if not kinds:
        return [Note("No failures: every entry passed.")]
    fails = [(name, [e.get(k, 0) for k in kinds]) for name, e in errors.items()]
    names = [k.removeprefix("multi_turn:") for k in kinds]
    fig = charts.bars("Failures by error type", names, fails, xtitle="entries", horizontal=True)
    ids.append(page.figure(fig))
    return [_count_table("Failures by error type", names, kinds, errors, "errors")]


def _bfcl_table(runs: list[Run], cats: list[str], published: dict[str, Any]) -> Table:
    rows = []
    for run in runs:
        s = run.summary or {}
        acc, n = s.get("accuracy") or {}, s.get("counts") or {}
        partial = bool(s.get("overall_partial", True))
        overall = Cell(
            num(s.get("overall")) + (" (partial)" if partial else ""),
            "overall",
            run.name,
            "num partial" if partial else "num",
            overall_label(acc, bool(s.get("overall_partial")))
            if partial
            else "the mean of the four categories",
        )
        rows.append(
            [
                Cell(run.name, cls="run"),
                Cell(str(s.get("model") or run.model or "")),
                Cell(num(s.get("entries")), "entries", run.name, "num"),
                overall,
                *(
                    Cell(
                        num(acc.get(c)), f"accuracy.{c}", run.name, "num", f"{n.get(c, 0)} entries"
                    )
                    for c in cats
                ),
            ]
        )
    for model, row in published.items():
        rows.append(
            [
                Cell(f"{model} (published)", cls="published"),
                Cell("paper, Table 1"),
                Cell("–", cls="num"),
                Cell(num(row.get("overall")), cls="num"),
                *(Cell(num(row.get(c)), cls="num") for c in cats),
            ]
        )
    return Table(
        ["run", "model", "entries", "overall", *cats],
        rows,
        "Accuracy (%) per category, beside the paper's published figures",
    )


def _count_table(
    caption: str, names: list[str], keys: list[str], by_run: dict[str, dict[str, Any]], key: str
) -> Table:
    rows = [
        [
            Cell(name),
            *(Cell(num(c.get(k, 0)), f"{key}.{k}", run, "num") for run, c in by_run.items()),
        ]
        for name, k in zip(names, keys, strict=True)
    ]
    return Table(["", *by_run], rows, caption)


def bfcl_status(r: dict[str, Any]) -> str:
    return "error" if r.get("error_kind") else ("pass" if r.get("valid") else "fail")


def bfcl_view(r: dict[str, Any]) -> tuple[Entry, dict[str, Any]]:
    """A BFCL record's line and drill-down: turns beside the calls the checker decoded from
    them, the verdict, and the checker's details (the state diff, the missing results)."""
    status = bfcl_status(r)
    error_type = r.get("error_type") or ""
    turn = r.get("failed_turn")
    label = error_type.removeprefix("multi_turn:") + (f" (turn {turn})" if turn is not None else "")
    view = {
        "id": r["id"],
        "status": status,
        "facts": [
            ["category", str(r.get("category", ""))],
            ["verdict", status],
            *([["error type", error_type]] if error_type else []),
            *([["failed turn", str(turn)]] if turn is not None else []),
            *trajectory_facts(r.get("trajectory")),
        ],
        "error": clip(r.get("error") or ""),
        "turns": turns(r.get("trajectory")),
        "decoded": r.get("decoded") or [],
        "failed_turn": turn,
        "checker": {"error_type": error_type, "details": r.get("details") or {}},
    }
    return Entry(str(r["id"]), status, label or "passed"), view
