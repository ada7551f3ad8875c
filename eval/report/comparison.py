"""The entry-by-entry comparison of two runs of one eval in a report: ``eval.compare``'s JSON
form rendered as blocks (the kind's own blocks follow it:
:attr:`eval.run.EvalKind.compare_blocks`)."""

from __future__ import annotations

from typing import Any

from eval.report.blocks import Block, Cell, Heading, Note, Table, num
from eval.run import Run

COMPARE_ROWS = 300  # changed entries listed in a comparison


def comparison_blocks(a: Run, b: Run, data: dict[str, Any]) -> list[Block]:
    """``eval.compare`` of two runs of one eval, rendered from its JSON form (``data``; the
    kind's own blocks follow: :attr:`eval.run.EvalKind.compare_blocks`)."""
    blocks: list[Block] = [Heading(f"Comparison: {a.name} (A) → {b.name} (B)")]
    blocks += [Note(str(w), "warn") for w in data.get("warnings") or []]
    counts_ = data.get("counts") or {}
    blocks.append(
        Table(
            list(counts_),
            [[Cell(num(v), f"compare.{k}", cls="num") for k, v in counts_.items()]],
            "Entries by change",
        )
    )
    groups = dict(data.get("groups") or {})
    if data.get("overall"):
        groups["overall"] = data["overall"]
    if groups:
        cols = sorted({k for g in groups.values() for k in g})
        blocks.append(
            Table(
                ["", *cols],
                [
                    [Cell(str(g)), *(Cell(num(v.get(c), 4), cls="num") for c in cols)]
                    for g, v in groups.items()
                ],
                "Pass rate of A and B on the entries both ran",
            )
        )
    tests = [t for t in data.get("tests") or [] if isinstance(t, dict)]
    if tests:
        cols = list(dict.fromkeys(k for t in tests for k in t))
        blocks.append(
            Table(cols, [[Cell(num(t.get(c), 4)) for c in cols] for t in tests], "Paired tests")
        )
    blocks.append(_changed_rows(data.get("rows") or []))
    return blocks


def _changed_rows(rows: list[dict[str, Any]]) -> Block:
    changed = [
        r
        for r in rows
        if r.get("change") in ("broken", "fixed", "changed_error")
        or r.get("reward") in ("up", "down")
    ]
    if not changed:
        return Note("No entry changed its verdict.")
    cols = list(dict.fromkeys(k for r in changed for k in r))
    shown = changed[:COMPARE_ROWS]
    table_rows = [
        [
            Cell(num(r.get(c), 3), cls=str(r.get("change", "")) if c == "change" else "")
            for c in cols
        ]
        for r in shown
    ]
    more = f" (the first {COMPARE_ROWS} of {len(changed)})" if len(changed) > len(shown) else ""
    return Table(cols, table_rows, f"Changed entries{more}")
