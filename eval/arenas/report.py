"""The RL arenas' part of a report: their section (the summaries side by side, reward and
calls distributions, domains, errors and terminations, each run's tasks) and their entry view
(the reward's parts and the trajectory)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from eval.report import charts
from eval.report.blocks import (
    Block,
    Cell,
    Charts,
    Entry,
    Heading,
    Page,
    Section,
    Table,
    counts,
    num,
    pct,
)
from eval.report.entries import clip, entry_list, trajectory_facts, turns
from eval.report.scores import by_set_and_model
from eval.run import Run

_ARENA_ROWS = (
    ("tasks", "tasks", num),
    ("mean reward", "mean_reward", lambda v: num(v, 4)),
    ("fully solved", "fully_solved", pct),
    ("mean recall", "mean_recall", lambda v: num(v, 4)),
    ("mean precision", "mean_precision", lambda v: num(v, 4)),
    ("tool calls per task", "tool_calls_per_task", num),
    ("errors", "errors", counts),
    ("terminations", "terminations", counts),
    ("wall time (s)", "wall_s", num),
)


def arenas_section(runs: list[Run], page: Page) -> Section:
    """The summary side by side, rewards, solved share, recall and precision, tool calls,
    domains, errors and terminations, and each run's tasks."""
    rows = [[Cell("model"), *(Cell(r.model) for r in runs)]]
    for title, key, fmt in _ARENA_ROWS:
        cells = [Cell(fmt((r.summary or {}).get(key)), key, r.name, "num") for r in runs]
        rows.append([Cell(title), *cells])
    blocks: list[Block] = [Table(["", *(r.name for r in runs)], rows, "Summary")]
    ids = _arena_charts(runs, page)
    domains = {r.name: (r.summary or {}).get("domains") or {} for r in runs}
    names = sorted({d for ds in domains.values() for d in ds})
    if names:
        by_domain = [
            (run, [ds.get(d, {}).get("mean_reward") for d in names]) for run, ds in domains.items()
        ]
        fig = charts.bars("Mean reward by domain", names, by_domain, ytitle="mean reward", digits=3)
        ids.append(page.figure(fig))
        blocks.append(_domain_table(names, domains))
    problems = {r.name: _arena_problems(r.summary or {}) for r in runs}
    kinds = sorted({k for p in problems.values() for k in p})
    if kinds:
        counts_ = [(run, [p.get(k, 0) for k in kinds]) for run, p in problems.items()]
        fig = charts.bars(
            "Errors and terminations by kind", kinds, counts_, xtitle="count", horizontal=True
        )
        ids.append(page.figure(fig))
    if grid := by_set_and_model(runs, "mean reward"):
        ids.insert(0, page.figure(grid))
    blocks.insert(1, Charts(ids))
    entries: list[Block] = []
    for run in runs:
        entries += [Heading(f"Tasks of {run.name}"), entry_list(page, run, arena_view)]
    return Section("arenas", "RL arenas", "arenas", blocks, entries)


def _arena_charts(runs: list[Run], page: Page) -> list[str]:
    """Distributions over the tasks that got a verdict (not the run errors), and the means."""
    graded = {r.name: [x for x in r.records if not x.get("error_kind")] for r in runs}
    rewards = [(n, [x.get("reward", 0) for x in rs]) for n, rs in graded.items()]
    calls = [(n, [x.get("tool_calls", 0) for x in rs]) for n, rs in graded.items()]
    most = max((c for _, cs in calls for c in cs), default=1)
    means = [
        (
            r.name,
            [(r.summary or {}).get(k) for k in ("fully_solved", "mean_recall", "mean_precision")],
        )
        for r in runs
    ]
    return [
        page.figure(
            charts.histogram(
                "Reward distribution", rewards, xtitle="reward", start=-0.025, end=1.025, size=0.05
            )
        ),
        page.figure(
            charts.bars(
                "Solved share, recall and precision",
                ["fully solved", "recall", "precision"],
                means,
                ytitle="mean over tasks",
                digits=3,
            )
        ),
        page.figure(
            charts.histogram(
                "Tool calls per task",
                calls,
                xtitle="tool calls",
                start=-0.5,
                end=most + 0.5,
                size=1,
            )
        ),
    ]


def _arena_problems(summary: dict[str, Any]) -> dict[str, int]:
    """Tool-call errors by kind, and episodes that ended other than by the model's answer."""
    out: Counter[str] = Counter(
        {f"error: {k}": v for k, v in (summary.get("errors") or {}).items()}
    )
    for k, v in (summary.get("terminations") or {}).items():
        if k != "stop":
            out[f"ended: {k}"] += v
    return dict(out)


def _domain_table(names: list[str], domains: dict[str, dict[str, Any]]) -> Table:
    rows = []
    for d in names:
        cells = [Cell(d)]
        for run, ds in domains.items():
            row = ds.get(d) or {}
            cells += [
                Cell(num(row.get("tasks")), f"domains.{d}.tasks", run, "num"),
                Cell(num(row.get("mean_reward"), 4), f"domains.{d}.mean_reward", run, "num"),
                Cell(pct(row.get("fully_solved")), f"domains.{d}.fully_solved", run, "num"),
            ]
        rows.append(cells)
    cols = ["domain"] + [f"{run}: {c}" for run in domains for c in ("tasks", "reward", "solved")]
    return Table(cols, rows, "By domain")


def arena_status(r: dict[str, Any]) -> str:
    if r.get("error_kind"):
        return "error"
    if r.get("fully_solved"):
        return "pass"
    return "part" if (r.get("reward") or 0) > 0 else "fail"


def arena_view(r: dict[str, Any]) -> tuple[Entry, dict[str, Any]]:
    """An arena record's line and drill-down: the reward's parts and the trajectory."""
    status = arena_status(r)
    solved = r.get("solved") or []
    view = {
        "id": r["id"],
        "status": status,
        "facts": [
            ["domain", str(r.get("domain", ""))],
            ["reward", num(r.get("reward"), 3)],
            ["recall", num(r.get("recall"), 3)],
            ["precision", num(r.get("precision"), 3)],
            [
                "solved",
                f"{', '.join(map(str, solved)) or 'none'} "
                f"({len(solved)} of {r.get('required', '?')})",
            ],
            ["errors", ", ".join(f"{k}={v}" for k, v in (r.get("errors") or {}).items()) or "none"],
            *trajectory_facts(r.get("trajectory")),
        ],
        "error": clip(r.get("error") or ""),
        "turns": turns(r.get("trajectory")),
    }
    label = f"reward {num(r.get('reward'), 3)}"
    if r.get("error_kind"):
        label += f" · {r['error_kind']} error"
    return Entry(str(r["id"]), status, label), view
