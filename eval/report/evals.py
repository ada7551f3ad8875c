"""The eval sections of a report: BFCL-V3 multi-turn, the RL arenas, general benchmarks (τ²:
:mod:`eval.report.tau2`), and the entry-by-entry comparison of two runs of one eval."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from eval.report import charts
from eval.report.blocks import (
    Block,
    Cell,
    Charts,
    Heading,
    Note,
    Page,
    Section,
    Table,
    counts,
    entry_list,
    num,
    pct,
)
from eval.report.entries import arena_view, bfcl_view, general_view
from eval.run import Run
from eval.stats import mean_ci

COMPARE_ROWS = 300  # changed entries listed in a comparison


# ------------------------------------------------------------------ BFCL


def bfcl_section(runs: list[Run], page: Page) -> Section:
    """Accuracy per category beside the paper's (an overall only over all four categories),
    failures by error type, and each run's entries."""
    from eval.bfcl.official import CATEGORIES
    from eval.bfcl.runner import PUBLISHED

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
    from eval.bfcl.runner import overall_label

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


# ------------------------------------------------------------------ arenas

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
    if grid := _by_set_and_model(runs):
        ids.insert(0, page.figure(grid))
    blocks.insert(1, Charts(ids))
    entries: list[Block] = []
    for run in runs:
        entries += [Heading(f"Tasks of {run.name}"), entry_list(page, run, arena_view)]
    return Section("arenas", "RL arenas", "arenas", blocks, entries)


def _by_set_and_model(runs: list[Run]) -> charts.Fig | None:
    """Mean reward with its 95% CI, task set (the data file) × model, where the runs span
    more than one of either (stages of a training run scored on several held-out sets)."""
    cells: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        data = str((r.summary or {}).get("data") or r.name)
        key = (Path(data).stem, str(r.model or r.name))
        graded = [float(x.get("reward", 0)) for x in r.records if not x.get("error_kind")]
        cells.setdefault(key, graded)
    sets = list(dict.fromkeys(k[0] for k in cells))
    models = list(dict.fromkeys(k[1] for k in cells))
    if len(sets) < 2 and len(models) < 2:
        return None
    series = []
    for m in models:
        stats = [mean_ci(cells.get((s, m), [])) or (None, None) for s in sets]
        series.append((m, [x[0] for x in stats], [x[1] for x in stats]))
    return charts.bars_ci(
        "Mean reward by task set and model (95% CI)", sets, series, ytitle="mean reward",
        xtitle="task set",
    )  # fmt: skip


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


# ------------------------------------------------------------------ general


def general_section(runs: list[Run], page: Page) -> Section:
    """Per task and metric, each run's value beside the paper's figure for that task where the
    summary carries one (``published``: {benchmark: {"figures", "models", "note"}} as
    ``astra-eval general`` writes it, or {task: {metric: value}})."""
    tasks = {r.name: _tasks(r.summary) for r in runs}
    published = _published(runs)
    keys = sorted({(t, m) for ts in tasks.values() for t in ts for m in ts[t]})
    rows = []
    for t, m in keys:
        pub = _published_for(published, t, m)
        rows.append(
            [
                Cell(t),
                Cell(m),
                *(
                    Cell(num(ts.get(t, {}).get(m), 4), f"tasks.{t}.{m}", run, "num")
                    for run, ts in tasks.items()
                ),
                *([Cell(pub, cls="num published")] if published else []),
            ]
        )
    cols = ["task", "metric", *tasks, *(["published (paper)"] if published else [])]
    blocks: list[Block] = [Table(cols, rows, "Metrics per task")]
    numeric = [
        (t, m)
        for t, m in keys
        if "_stderr" not in m
        and any(isinstance(ts.get(t, {}).get(m), int | float) for ts in tasks.values())
    ]
    if numeric:
        x = [f"{t} · {m}" for t, m in numeric]
        series = [(run, [ts.get(t, {}).get(m) for t, m in numeric]) for run, ts in tasks.items()]
        blocks.append(Charts([page.figure(charts.bars("Metrics per task", x, series, digits=3))]))
    if published:
        blocks.append(_published_table(published))
    blocks += _general_notes(runs)
    entries: list[Block] = []
    for run in runs:
        if run.records:
            entries += [Heading(f"Samples of {run.name}"), entry_list(page, run, general_view)]
    return Section("general", "General benchmarks", "general", blocks, entries)


def _general_notes(runs: list[Run]) -> list[Block]:
    """Samples that got no usable reply (left out of the metrics), and the summary's notes."""
    notes: list[Block] = []
    for run in runs:
        s = run.summary or {}
        if isinstance(s.get("errors"), int) and s["errors"] > 0:
            notes.append(
                Note(
                    f"{run.name}: {s['errors']} of {num(s.get('samples'))} samples got no usable "
                    "reply (inference errors): left out of the metrics",
                    "warn",
                )
            )
        notes += [Note(f"{run.name}: {n}", "warn") for n in s.get("notes") or []]
    return notes


def _tasks(summary: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    tasks = (summary or {}).get("tasks")
    if not isinstance(tasks, dict):
        return {}
    return {str(t): m if isinstance(m, dict) else {"value": m} for t, m in tasks.items()}


def _published(runs: list[Run]) -> dict[str, dict[str, Any]]:
    """The published figures the runs' summaries carry, by benchmark (or task)."""
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        pub = (run.summary or {}).get("published")
        if isinstance(pub, dict):
            out |= {str(k): v for k, v in pub.items() if isinstance(v, dict)}
    return out


def _figures(entry: dict[str, Any]) -> str:
    figures = entry.get("figures")
    if not isinstance(figures, list):
        return ""
    text = " / ".join(num(f) for f in figures)
    models = entry.get("models")
    return text + (f" ({' / '.join(map(str, models))})" if isinstance(models, list) else "")


def _published_for(published: dict[str, dict[str, Any]], task: str, metric: str) -> str:
    """The published figure for a task's metric: by the task's name, or a benchmark whose
    name the task's starts with (``aime24`` → ``AIME``)."""
    for name, entry in published.items():
        if task == name or task.lower().startswith(name.lower()):
            if "figures" in entry:
                return _figures(entry)
            value = entry.get(metric)
            return num(value, 4) if value is not None else ""
    return ""


def _published_table(published: dict[str, dict[str, Any]]) -> Table:
    rows = []
    for name, entry in published.items():
        if "figures" in entry:
            text = _figures(entry)
        else:
            text = ", ".join(f"{k}={num(v, 4)}" for k, v in entry.items() if k != "note")
        note = str(entry.get("note", ""))
        if entry.get("assignment_confirmed") is False:
            note = note or "which model has which figure is not confirmed"
        rows.append([Cell(name), Cell(text, cls="published"), Cell(note)])
    return Table(["benchmark", "figures", "note"], rows, "Published figures (paper)")


# ------------------------------------------------------------------ comparison


def comparison_blocks(a: Run, b: Run, data: dict[str, Any]) -> list[Block]:
    """``eval.compare`` of two runs of one eval, rendered from its JSON form (``data``; the
    kind's own blocks follow: :attr:`eval.evalkind.EvalKind.compare_blocks`)."""
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
