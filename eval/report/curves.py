"""The training sections of a report: SFT and RL runs' metrics over steps, overlaid where
several runs are given, beside a table of where each run got to.

Metric names are those of ``astra-train``'s TRL backends (``metrics.jsonl``); verl's file logger
names some of them differently (``train/loss``, ``actor/lr``, ``critic/score/mean``,
``training/abf/…``): each curve takes the first name a run has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from eval.report import charts
from eval.report.blocks import Block, Cell, Charts, Note, Page, Section, Table, num
from eval.run import Run

ALIASES: dict[str, tuple[str, ...]] = {
    "loss": ("loss", "train/loss", "actor/pg_loss"),
    "learning_rate": ("learning_rate", "train/lr", "actor/lr"),
    "grad_norm": ("grad_norm", "train/grad_norm", "actor/grad_norm"),
    "reward_mean": ("reward_mean", "critic/score/mean"),
    "tokens_per_s": ("tokens_per_s", "perf/throughput"),
}
ABF_KEYS = (
    "sampled",
    "valid",
    "dropped_flat",
    "from_buffer",
    "dropped_stale",
    "buffered",
    "rounds",
)


def value(m: dict[str, Any], key: str) -> float | None:
    """A step's value of ``key`` (by its aliases; ``abf.KEY`` inside the ABF statistics)."""
    if key.startswith("abf."):
        name = key[4:]
        abf = m.get("abf")
        v = abf.get(name) if isinstance(abf, dict) else m.get(f"training/abf/{name}")
    else:
        v = next((m[k] for k in ALIASES.get(key, (key,)) if k in m), None)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def series(run: Run, key: str, name: str | None = None) -> tuple[str, list[Any], list[Any]]:
    """(name, steps, values) over the steps that logged ``key``."""
    xs, ys = [], []
    for m in run.metrics:
        v = value(m, key)
        if v is not None and isinstance(m.get("step"), int | float):
            xs.append(m["step"])
            ys.append(v)
    return (name or run.name, xs, ys)


def _curves(
    page: Page, runs: list[Run], specs: Sequence[tuple[str, str, Sequence[str]]]
) -> list[str]:
    """One chart per spec (title, y title, keys): each run's curve of each key; a chart no run
    has data for is left out."""
    ids = []
    for title, ytitle, keys in specs:
        lines = []
        for run in runs:
            for key in keys:
                label = (
                    run.name
                    if len(keys) == 1
                    else (key if len(runs) == 1 else f"{run.name}: {key}")
                )
                s = series(run, key, label)
                if s[1]:
                    lines.append(s)
        if lines:
            ids.append(page.figure(charts.lines(title, lines, ytitle=ytitle)))
    return ids


def _last(run: Run, key: str) -> float | None:
    s = series(run, key)[2]
    return s[-1] if s else None


def _agg(run: Run, key: str, fn: Callable[[list[float]], float]) -> float | None:
    s = series(run, key)[2]
    return fn(s) if s else None


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _progress(run: Run) -> str:
    s = run.summary or {}
    planned = f" of {s['planned_steps']}" if s.get("planned_steps") else ""
    done = "finished" if s.get("finished") else "not finished"
    return f"{num(s.get('last_step'))}{planned} ({done})"


def _table(runs: list[Run], rows: list[tuple[str, str, Callable[[Run], Any], int]]) -> Table:
    out = [
        [Cell("model"), *(Cell(r.model) for r in runs)],
        [Cell("backend"), *(Cell(str((r.config or {}).get("backend", "–"))) for r in runs)],
        [Cell("steps"), *(Cell(_progress(r), "steps", r.name) for r in runs)],
    ]
    for title, key, get, digits in rows:
        out.append([Cell(title), *(Cell(num(get(r), digits), key, r.name, "num") for r in runs)])
    return Table(["", *(r.name for r in runs)], out, "Where each run got to")


def _problems(runs: list[Run]) -> list[Block]:
    return [Note(f"{r.name}: no metrics logged yet", "warn") for r in runs if not r.metrics]


def sft_section(runs: list[Run], page: Page) -> Section:
    table = _table(
        runs,
        [
            ("last loss", "loss.last", lambda r: _last(r, "loss"), 4),
            ("lowest loss", "loss.min", lambda r: _agg(r, "loss", min), 4),
            ("peak learning rate", "learning_rate.max", lambda r: _agg(r, "learning_rate", max), 6),
            ("tokens", "tokens_total", lambda r: _last(r, "tokens_total"), 0),
            (
                "trained tokens",
                "trained_tokens_total",
                lambda r: _last(r, "trained_tokens_total"),
                0,
            ),
            ("tokens/s (mean)", "tokens_per_s.mean", lambda r: _agg(r, "tokens_per_s", _mean), 1),
            ("epochs", "epoch", lambda r: _last(r, "epoch"), 2),
            ("elapsed (s)", "elapsed_s", lambda r: _last(r, "elapsed_s"), 1),
        ],
    )
    ids = _curves(
        page,
        runs,
        [
            ("Loss", "loss", ["loss"]),
            ("Learning rate", "learning rate", ["learning_rate"]),
            ("Gradient norm", "grad norm", ["grad_norm"]),
            ("Throughput", "tokens/s", ["tokens_per_s"]),
        ],
    )
    return Section("sft", "SFT training", "sft", [table, Charts(ids), *_problems(runs)])


def rl_section(runs: list[Run], page: Page) -> Section:
    table = _table(
        runs,
        [
            ("last reward (mean)", "reward_mean.last", lambda r: _last(r, "reward_mean"), 4),
            ("best reward (mean)", "reward_mean.max", lambda r: _agg(r, "reward_mean", max), 4),
            ("last solved share", "solved.last", lambda r: _last(r, "solved"), 3),
            ("last tool calls per episode", "calls_mean.last", lambda r: _last(r, "calls_mean"), 2),
            ("last held-out reward", "eval_reward.last", lambda r: _last(r, "eval_reward"), 4),
            ("last held-out solved", "eval_solved.last", lambda r: _last(r, "eval_solved"), 3),
            ("ABF groups sampled", "abf.sampled", lambda r: _agg(r, "abf.sampled", sum), 0),
            (
                "ABF groups dropped (flat)",
                "abf.dropped_flat",
                lambda r: _agg(r, "abf.dropped_flat", sum),
                0,
            ),
            ("re-render mismatch share", "rerender", _mismatch_share, 3),
            ("rollout s/step (mean)", "rollout_s.mean", lambda r: _agg(r, "rollout_s", _mean), 2),
            ("update s/step (mean)", "update_s.mean", lambda r: _agg(r, "update_s", _mean), 2),
        ],
    )
    ids = _curves(
        page,
        runs,
        [
            ("Reward (rollouts)", "mean reward", ["reward_mean"]),
            ("Solved share (rollouts)", "fully solved", ["solved"]),
            ("Tool calls per episode (rollouts)", "calls", ["calls_mean"]),
            (
                "ASTRA's reward and its parts (rollouts)",
                "mean",
                ["f1_mean", "recall_mean", "precision_mean"],
            ),
            ("Held-out evaluation", "greedy", ["eval_reward", "eval_solved"]),
            ("Loss", "loss", ["loss"]),
            ("Adaptive Batch Filling", "groups", [f"abf.{k}" for k in ABF_KEYS]),
            ("Learning rate", "learning rate", ["learning_rate"]),
            ("Gradient norm", "grad norm", ["grad_norm"]),
            ("Clipped share of tokens", "clip fraction", ["clip_fraction"]),
            ("Sampler vs trainer log-prob gap", "mean |Δ log p|", ["logp_gap"]),
            ("Time per step", "s", ["rollout_s", "update_s"]),
            ("Re-render mismatches", "episodes", ["rerender_mismatches", "rerender_checked"]),
        ],
    )
    return Section("rl", "RL training", "rl", [table, Charts(ids), *_problems(runs)])


def _mismatch_share(run: Run) -> float | None:
    """Episodes whose re-rendered template differed from the sampled ids, of those checked."""
    bad = _agg(run, "rerender_mismatches", sum)
    checked = _agg(run, "rerender_checked", sum)
    return bad / checked if bad is not None and checked else None
