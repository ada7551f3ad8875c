"""Entries' scores across runs of any eval kind (:attr:`eval.run.EvalKind.score`): the
scores of a run, and the grid of mean scores by task set and model that a report shows where
runs span several of either (stages of a training run scored on several held-out sets)."""

from __future__ import annotations

from pathlib import Path

from eval.report import charts
from eval.run import Run
from eval.stats import mean_ci


def scores(run: Run) -> list[float]:
    """The scores of the run's entries that have one (an error has none; a kind without
    per-entry scores gives none)."""
    kind = run.eval_kind
    if kind is None or kind.score is None:
        return []
    return [s for r in run.records if (s := kind.score(r)) is not None]


def solved(run: Run) -> int:
    """How many of the run's entries were fully solved."""
    kind = run.eval_kind
    return 0 if kind is None else sum(kind.is_solved(r) for r in run.records)


def by_set_and_model(runs: list[Run], what: str) -> charts.Fig | None:
    """``what`` (the score's name: "mean reward") with its 95% CI, task set (the summary's
    ``data`` file, else the run's name) × model, where the runs span more than one of either."""
    cells: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        data = str((r.summary or {}).get("data") or r.name)
        cells.setdefault((Path(data).stem, str(r.model or r.name)), scores(r))
    sets = list(dict.fromkeys(k[0] for k in cells))
    models = list(dict.fromkeys(k[1] for k in cells))
    if len(sets) < 2 and len(models) < 2:
        return None
    series = []
    for m in models:
        stats = [mean_ci(cells.get((s, m), [])) or (None, None) for s in sets]
        series.append((m, [x[0] for x in stats], [x[1] for x in stats]))
    title = f"{what[0].upper()}{what[1:]} by task set and model (95% CI)"
    return charts.bars_ci(title, sets, series, ytitle=what, xtitle="task set")
