"""The experiment's table: each model (base, SFT, SFT+RL) on each held-out set, with n, the mean
reward and its 95% confidence interval, the fully solved share, and the paired tests of each
stage against the one before it (``astra-eval compare``'s Wilcoxon signed-rank and McNemar),
per set and pooled over the generated splits a–c. Written as ``OUT/table2.json`` and
``OUT/table2.md``; the comparisons as ``OUT/compare/*.json``; the reward ablation's runs step by
step (tool calls per episode, solved share, F1); the HTML report of every eval run and of the
SFT, RL and ablation runs (their loss, reward and calls curves) as ``OUT/report.html``."""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from astra_agent.runio import write_json_atomic, write_text_atomic
from eval.bfcl.categories import LIVE_AST, MEMORY, MULTI_TURN, NON_LIVE_AST, resolve
from eval.compare import mean_ci
from eval.rundir import load_run
from training.table2.directory import MODELS, Experiment

POOLED = ("a", "b", "c")
SPLIT_TITLES = {
    "a": "a: same domains, new values",
    "b": "b: held-out chain signatures",
    "c": "c: unseen domains",
    "heldout": "hand-written held-out arenas",
}
BFCL_SETS = {  # the rows the one BFCL run gives: the leaderboard's groups, each scored apart
    "bfcl-non-live": NON_LIVE_AST,
    "bfcl-live": LIVE_AST,
    "bfcl-irrelevance": ("irrelevance", "live_irrelevance"),
    "bfcl-relevance": ("live_relevance",),
    "bfcl-multi-turn": MULTI_TURN,
    "bfcl-memory": MEMORY,
}
SPLIT_TITLES |= {
    "bfcl-non-live": "BFCL non-live AST",
    "bfcl-live": "BFCL live AST",
    "bfcl-irrelevance": "BFCL irrelevance (no call)",
    "bfcl-relevance": "BFCL relevance (a call)",
    "bfcl-multi-turn": "BFCL-V3 multi-turn",
    "bfcl-memory": "BFCL memory",
}


def bfcl_sets(x: Experiment) -> list[str]:
    """The BFCL rows of the table: the groups of ``BFCL_SETS`` the slice's categories meet."""
    ev = x.cfg.eval
    if not ev.bfcl_limit:
        return []
    cats = set(resolve([c.strip() for c in ev.bfcl_categories.split(",") if c.strip()]))
    return [s for s, members in BFCL_SETS.items() if cats & set(members)]


def run_dir(x: Experiment, stage: str, s: str) -> Path:
    """The eval run that holds set ``s`` of ``stage``'s model (every BFCL set: the one run)."""
    return x.eval_dir(stage, "bfcl" if s in BFCL_SETS else s)


def cell(run: Path, categories: tuple[str, ...] | None = None) -> dict[str, Any] | None:
    """One eval run's figures (None where it is not there): the scores its kind gives the
    entries that got one (an arena task's reward, a BFCL verdict as 1/0), the errors apart;
    of a BFCL run, those of ``categories`` only (None where none of them ran)."""
    if not (run / "summary.json").is_file():
        return None
    loaded = load_run(run)
    kind = loaded.eval_kind
    records = [r for r in loaded.records if categories is None or r.get("category") in categories]
    if not records:  # a BFCL group none of whose categories ran
        return None
    got = [v for r in records if kind and kind.score and (v := kind.score(r)) is not None]
    m, half = mean_ci(got) or (0.0, 0.0)
    n = len(got)
    done = sum(kind.is_solved(r) for r in records) if kind else 0
    return {
        "n": n,
        "errors": len(records) - n,
        "mean": round(m, 4),
        "ci95": round(half, 4),
        "solved": round(done / n, 4) if n else 0.0,
    }


def paired(x: Experiment, a: str, b: str, sets: list[str]) -> dict[str, Any]:
    """Stage ``b`` against stage ``a`` on each set (and pooled over a–c): the mean paired
    difference with its 95% CI, and the tests of ``astra-eval compare`` (on a BFCL set, over
    its categories' entries)."""
    from eval.compare import compare_runs, wilcoxon_rewards, write_comparison

    out: dict[str, Any] = {}
    pooled: list[float] = []
    done: dict[Path, Any] = {}
    for s in sets:
        da, db = run_dir(x, a, s), run_dir(x, b, s)
        if not ((da / "summary.json").is_file() and (db / "summary.json").is_file()):
            continue
        if da not in done:
            done[da] = c = compare_runs(da, db)
            dest = x.path("compare", f"{b}-vs-{a}-{'bfcl' if s in BFCL_SETS else s}.json")
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_comparison(c, dest, overwrite=True)
        c = done[da]
        members = BFCL_SETS.get(s)
        rows = [r for r in c.rows if r.compared and (members is None or r.group in members)]
        if not rows:
            continue
        diffs = [float(r.b or 0) - float(r.a or 0) for r in rows]
        if s in POOLED:
            pooled += diffs
        tests = c.tests if members is None else c.pairing.tests(rows)[0]
        out[s] = _diff(diffs, [asdict(t) for t in tests])
    if pooled:
        out["pooled a-c"] = _diff(pooled, [asdict(wilcoxon_rewards(pooled))])
    return out


def _diff(diffs: list[float], tests: list[dict[str, Any]]) -> dict[str, Any]:
    m, half = mean_ci(diffs) or (0.0, 0.0)
    return {"n": len(diffs), "mean_diff": round(m, 4), "ci95": round(half, 4), "tests": tests}


ABLATION_FIGURES = {  # the ablation's name of a figure: its key in metrics.jsonl
    "calls": "calls_mean",
    "solved": "solved",
    "f1": "f1_mean",
    "recall": "recall_mean",
    "precision": "precision_mean",
    "trained_reward": "reward_mean",
}


def ablation(x: Experiment) -> dict[str, list[dict[str, Any]]]:
    """Each ablation run's rollouts step by step (the runs that logged a step): tool calls per
    episode, solved share, ASTRA's F1 and its parts, and the reward it trained on. Step 1's
    rollouts are sampled before any update: the SFT model's, the same in every run."""
    from training.metrics import MetricsLog

    out: dict[str, list[dict[str, Any]]] = {}
    for reward in x.cfg.ablation.rewards:
        lines = MetricsLog.read(x.ablation_dir(reward) / "metrics.jsonl")
        rows = [
            {"step": m["step"], **{k: m.get(key) for k, key in ABLATION_FIGURES.items()}}
            for m in lines
            if isinstance(m.get("step"), int)
        ]
        if rows:
            out[reward] = rows
    return out


def build_table(x: Experiment) -> dict[str, Any]:
    sets = [*x.cfg.eval.splits, *bfcl_sets(x)]
    cells = {st: {s: cell(run_dir(x, st, s), BFCL_SETS.get(s)) for s in sets} for st in MODELS}
    steps = itertools.pairwise(MODELS)  # each model against the one before it
    comparisons = {f"{b} vs {a}": paired(x, a, b, sets) for a, b in steps}
    table = {"sets": sets, "cells": cells, "comparisons": comparisons}
    if runs := ablation(x):
        table["ablation"] = runs
    return table


def _p(tests: list[dict[str, Any]], name: str) -> str:
    t = next((t for t in tests if t["name"].startswith(name)), None)
    if t is None or t["p_value"] is None:
        return "–"
    return f"{t['p_value']:.2g}"


def render_markdown(table: dict[str, Any]) -> str:
    sets = table["sets"]
    lines = [
        "| set | n | base | SFT | SFT+RL |",
        "|---|---:|---:|---:|---:|",
    ]
    for s in sets:
        cs = [table["cells"][st].get(s) for st in MODELS]
        n = next((c["n"] for c in cs if c), 0)
        shown = [
            f"{c['mean']:.3f} ± {c['ci95']:.3f} ({c['solved']:.0%} solved)" if c else "–"
            for c in cs
        ]
        lines.append(f"| {SPLIT_TITLES.get(s, s)} | {n} | " + " | ".join(shown) + " |")
    lines += [
        "",
        "| comparison | set | n | mean difference (95% CI) | Wilcoxon p | McNemar p |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, per in table["comparisons"].items():
        for s, d in per.items():
            lines.append(
                f"| {name} | {SPLIT_TITLES.get(s, s)} | {d['n']} | {d['mean_diff']:+.3f} ± "
                f"{d['ci95']:.3f} | {_p(d['tests'], 'Wilcoxon')} | {_p(d['tests'], 'McNemar')} |"
            )
    if runs := table.get("ablation"):
        lines += ["", *render_ablation(runs)]
    return "\n".join(lines) + "\n"


def _fig(v: Any, digits: int) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def render_ablation(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The ablation as Markdown: where each run started and ended, then step by step."""
    lines = [
        "| trained on | steps | calls per episode | solved share | F1 | recall | precision |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for reward, rows in runs.items():
        first, last = rows[0], rows[-1]
        cols = [
            f"{_fig(first[k], d)} → {_fig(last[k], d)}"
            for k, d in (("calls", 2), ("solved", 3), ("f1", 3), ("recall", 3), ("precision", 3))
        ]
        lines.append(f"| {reward} | {len(rows)} | " + " | ".join(cols) + " |")
    names = list(runs)
    lines += [
        "",
        "| step | " + " | ".join(f"{r}: calls / solved / F1" for r in names) + " |",
        "|---:|" + "---:|" * len(names),
    ]
    by_step = {r: {row["step"]: row for row in rows} for r, rows in runs.items()}
    for step in sorted({step for rows in by_step.values() for step in rows}):
        cells = [
            f"{_fig(row['calls'], 2)} / {_fig(row['solved'], 3)} / {_fig(row['f1'], 3)}"
            if (row := by_step[r].get(step))
            else "–"
            for r in names
        ]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return lines


def write_table(x: Experiment) -> dict[str, Any]:
    """Write the table (JSON and Markdown) and the report; print the Markdown."""
    from astra_agent.console import console

    table = build_table(x)
    write_json_atomic(x.path("table2.json"), table)
    md = render_markdown(table)
    write_text_atomic(x.path("table2.md"), md)
    console.print(md, soft_wrap=True, markup=False, highlight=False)
    runs = list(
        dict.fromkeys(
            str(run_dir(x, st, s))
            for st in MODELS
            for s in table["sets"]
            if (run_dir(x, st, s) / "summary.json").is_file()
        )
    )
    trained = [x.path(t) for t in ("sft", "rl")]
    trained += [x.ablation_dir(r) for r in x.cfg.ablation.rewards]
    runs += [str(p) for p in trained if (p / "metrics.jsonl").is_file()]
    if runs:
        x.run(
            "table",
            "eval",
            "report",
            *runs,
            "--out",
            str(x.path("report.html")),
            "--overwrite",
            "--title",
            "Table 2 in miniature",
        )
    return table


def read_table(out: Path) -> dict[str, Any]:
    return json.loads((out / "table2.json").read_text(encoding="utf-8"))
