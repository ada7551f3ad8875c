"""The general benchmarks' part of a report (lm-eval tasks): their section (metrics per task
beside the paper's figures, notes) and their entry view (prompt, reply, extracted answer
against the target)."""

from __future__ import annotations

from typing import Any

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
from eval.report.entries import clip, entry_list
from eval.run import Run


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


_GENERAL_FIELDS = {
    "id",
    "task",
    "index",
    "prompt",
    "response",
    "reasoning",
    "finish_reason",
    "answer",
    "extracted",
    "target",
    "filters",
    "responses",
    "error",
    "error_kind",
    "endpoint_failure",
}


def general_view(r: dict[str, Any]) -> tuple[Entry, dict[str, Any]]:
    """A general-benchmark sample: its prompt and reply, what was extracted against the
    target, its metric values (pass: the first metric is above 0)."""
    metrics = {
        k: v
        for k, v in r.items()
        if k not in _GENERAL_FIELDS and isinstance(v, int | float) and not isinstance(v, bool)
    }
    first = next(iter(metrics.values()), None)
    status = "error" if r.get("error_kind") else ("pass" if first and first > 0 else "fail")
    reply: dict[str, Any] = {"role": "assistant", "content": clip(r.get("response") or "")}
    if r.get("reasoning"):
        reply["reasoning"] = clip(r["reasoning"])
    view = {
        "id": r["id"],
        "status": status,
        "facts": [
            ["task", str(r.get("task", ""))],
            ["extracted", clip(r.get("extracted", ""))],
            ["target", clip(r.get("target", ""))],
            *([k, num(v, 4)] for k, v in metrics.items()),
            ["finish reason", str(r.get("finish_reason") or "")],
        ],
        "error": clip(r.get("error") or ""),
        "turns": [[{"role": "user", "content": clip(r.get("prompt", ""))}, reply]],
    }
    label = (
        f"extracted {str(r.get('extracted', ''))[:40]!r} · target {str(r.get('target', ''))[:40]!r}"
    )
    return Entry(str(r["id"]), status, label), view
