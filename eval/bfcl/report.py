"""BFCL's part of a report: its section (multi-turn accuracy per category beside the paper's;
single-turn accuracy per category; the V4 and V3 groups and overall scores; failures by error
type; each run's entries) and its entry view (multi-turn: the turns beside the calls the
checker decoded, the first failing turn, which check failed and the state difference;
single-turn: the request's messages, the reply as stored, the decoded calls, the gold answer
and the checker's messages)."""

from __future__ import annotations

import json
from typing import Any

from eval.bfcl.categories import MULTI_TURN, SINGLE_TURN
from eval.bfcl.official import CATEGORIES
from eval.bfcl.runner import PUBLISHED, overall_label
from eval.bfcl.single import load_single
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


def _ran(runs: list[Run], cats: tuple[str, ...]) -> list[str]:
    seen = {c for r in runs for c in ((r.summary or {}).get("accuracy") or {})}
    return [c for c in cats if c in seen]


def bfcl_section(runs: list[Run], page: Page) -> Section:
    """The multi-turn table and chart (when a run has multi-turn categories), the single-turn
    table, the leaderboard scores, failures by error type, and each run's entries."""
    blocks: list[Block] = []
    ids: list[str] = []
    if _ran(runs, MULTI_TURN) or not _ran(runs, SINGLE_TURN):
        blocks += _multi_turn(runs, page, ids)
    single = _ran(runs, SINGLE_TURN)
    if single:
        blocks.append(_single_table(runs, single))
    if any((r.summary or {}).get("v4_overall") for r in runs):
        blocks.append(_leaderboard_table(runs))
    blocks += _bfcl_failures(runs, page, ids)
    blocks.insert(1 if blocks else 0, Charts(ids))
    entries: list[Block] = []
    for run in runs:
        entries += [Heading(f"Entries of {run.name}"), entry_list(page, run, bfcl_view)]
    return Section("bfcl", "BFCL", "bfcl", blocks, entries)


def _multi_turn(runs: list[Run], page: Page, ids: list[str]) -> list[Block]:
    """Multi-turn accuracy per category beside the paper's (an overall only over all four)."""
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
    title = "Multi-turn accuracy by category (%)"
    ids.append(page.figure(charts.bars(title, x, series, ytitle="accuracy %")))
    if any(r.summary and r.summary.get("overall_partial", True) for r in runs):
        blocks.append(
            Note(
                "A multi-turn overall over fewer than the four categories is partial: it is not "
                "comparable with the published overall and is left out of the chart.",
                "warn",
            )
        )
    return blocks


def _single_table(runs: list[Run], cats: list[str]) -> Table:
    rows = []
    for run in runs:
        s = run.summary or {}
        acc, n = s.get("accuracy") or {}, s.get("counts") or {}
        rows.append(
            [
                Cell(run.name, cls="run"),
                *(
                    Cell(
                        num(acc.get(c)), f"accuracy.{c}", run.name, "num", f"{n.get(c, 0)} entries"
                    )
                    for c in cats
                ),
            ]
        )
    return Table(["run", *cats], rows, "Single-turn accuracy (%) per category")


def _score_cell(score: dict[str, Any] | None, key: str, run: str) -> Cell:
    if not score:
        return Cell("–", cls="num")
    missing = score.get("missing") or []
    title = "made of " + ", ".join(score.get("parts") or [])
    if missing:
        title += "; partial: not run (counted 0): " + ", ".join(missing)
    text = num(score.get("value")) + (" (partial)" if missing else "")
    return Cell(text, key, run, "num partial" if missing else "num", title)


def _leaderboard_table(runs: list[Run]) -> Table:
    """The V4 and V3 overall scores and their groups, as the official evaluator computes
    them; a figure that counts a category that did not run is marked partial."""
    v4 = ["non_live", "live", "irrelevance", "multi_turn", "agentic"]
    v3 = ["non_live", "live", "multi_turn"]
    rows = []
    for run in runs:
        s = run.summary or {}
        g4, g3 = s.get("v4_groups") or {}, s.get("v3_groups") or {}
        rows.append(
            [
                Cell(run.name, cls="run"),
                _score_cell(s.get("v4_overall"), "v4_overall", run.name),
                *(_score_cell(g4.get(g), f"v4_groups.{g}", run.name) for g in v4),
                _score_cell(s.get("v3_overall"), "v3_overall", run.name),
                *(_score_cell(g3.get(g), f"v3_groups.{g}", run.name) for g in v3),
            ]
        )
    return Table(
        ["run", "V4 overall", *(f"V4 {g}" for g in v4), "V3 overall", *(f"V3 {g}" for g in v3)],
        rows,
        "Leaderboard scores (%): V4 weights non-live 10, live 10, irrelevance 10, multi-turn 30, "
        "agentic 40; V3 is the mean of non-live, live and multi-turn (hover a cell for its parts)",
    )


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


CHECKS = {  # which multi-turn check failed, in words
    "multi_turn:instance_state_mismatch": "state (an instance differs from the ground truth's)",
    "multi_turn:execution_response_mismatch": "response (a ground-truth result is missing)",
    "multi_turn:empty_turn_model_response": "calls (none made where some were due)",
    "multi_turn:force_terminated": "turn count (the model did not finish every turn)",
}


def bfcl_view(r: dict[str, Any]) -> tuple[Entry, dict[str, Any]]:
    """A BFCL record's line and drill-down (see the module's doc)."""
    if r.get("category") in SINGLE_TURN:
        return _single_view(r)
    status = bfcl_status(r)
    error_type = r.get("error_type") or ""
    turn = r.get("failed_turn")
    label = error_type.removeprefix("multi_turn:") + (f" (turn {turn})" if turn is not None else "")
    check = CHECKS.get(error_type)
    view = {
        "id": r["id"],
        "status": status,
        "facts": [
            *_facts(r, status, error_type),
            *([["failed turn", str(turn)]] if turn is not None else []),
            *([["failed check", check]] if check and status == "fail" else []),
            *trajectory_facts(r.get("trajectory")),
        ],
        "error": clip(r.get("error") or ""),
        "turns": turns(r.get("trajectory")),
        "decoded": r.get("decoded") or [],
        "failed_turn": turn,
        "checker": {"error_type": error_type, "details": r.get("details") or {}},
    }
    return Entry(str(r["id"]), status, label or "passed"), view


def _facts(r: dict[str, Any], status: str, error_type: str) -> list[list[str]]:
    return [
        ["category", str(r.get("category", ""))],
        ["verdict", status],
        *([["error type", error_type]] if error_type else []),
    ]


def _question(category: str, id_: str) -> tuple[list[dict[str, Any]], Any]:
    """The entry's first-turn messages and gold answer from the installed data (none when the
    data does not hold it)."""
    try:
        for e in load_single(category):
            if e.id == id_:
                return list(e.question[0]), e.ground_truth
    except Exception:  # a report renders without the data (another bfcl-eval, none)
        pass
    return [], None


def _json(value: Any) -> str:
    return clip(json.dumps(value, ensure_ascii=False, indent=1, default=repr))


def _single_view(r: dict[str, Any]) -> tuple[Entry, dict[str, Any]]:
    status = bfcl_status(r)
    error_type = r.get("error_type") or ""
    messages, gold = _question(str(r["category"]), str(r["id"]))
    result = r.get("result")
    reply: dict[str, Any] = {
        "role": "assistant",
        "content": result if isinstance(result, str) else "",
    }
    if isinstance(result, list):
        reply["tool_calls"] = [
            {"function": {"name": str(k), "arguments": v if isinstance(v, str) else _json(v)}}
            for call in result
            if isinstance(call, dict)
            for k, v in call.items()
        ]
    errors = (r.get("details") or {}).get("errors") or []
    explanation = "\n".join(
        [
            *(str(e) for e in errors),
            "decoded calls: " + ("none" if r.get("calls") is None else _json(r.get("calls"))),
            *(["gold (any of the listed values per parameter): " + _json(gold)] if gold else []),
        ]
    )
    view = {
        "id": r["id"],
        "status": status,
        "facts": _facts(r, status, error_type),
        "error": clip(r.get("error") or ""),
        "turns": [[*messages, reply]] if r.get("error_kind") is None else [messages],
        "explanation": explanation,
    }
    return Entry(str(r["id"]), status, error_type or "passed"), view
