"""The figures of a general run, per task: lm-eval's own where every sample got a usable reply;
otherwise recomputed from the records over the samples that were scored, so that a reply that
never came (an inference error: not a chat completion, after the retries) is left out rather
than counted as a wrong answer.

Only a metric that lm-eval aggregates as a mean (``exact_match``, ``acc``: most generation
tasks) can be recomputed from per-sample values; any other (a corpus-level BLEU, a group's
figure) is left out of a task that had errors, and a note says so. A ``--retry-errors`` run
recomputes the tasks it re-ran the same way, over the merged records.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

STDERR = "_stderr"


def number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def metric_names(keys: Iterable[str]) -> dict[str, str]:
    """lm-eval's ``metric,filter`` keys → our names: the bare metric where the task has one
    filter, ``metric,filter`` where it has several."""
    pairs = [k.split(",", 1) for k in keys if "," in k]
    single = len({f for _, f in pairs}) <= 1
    return {f"{m},{f}": m if single else f"{m},{f}" for m, f in pairs}


def lm_eval_metrics(results: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per task (and group) of an lm-eval result, each numeric metric and its stderr."""
    out: dict[str, dict[str, float]] = {}
    for task, row in (results.get("results") or {}).items():
        names = metric_names(list(row))
        values = ((names[k], number(v)) for k, v in row.items() if k in names)
        out[task] = {k: v for k, v in values if v is not None}
    return out


def mean_metrics(results: Mapping[str, Any]) -> dict[str, set[str]]:
    """Per task, the metrics lm-eval aggregates as a mean (its task configs say so, or the
    metric's registered default does)."""
    from lm_eval.api.metrics import mean

    out: dict[str, set[str]] = {}
    for task, config in (results.get("configs") or {}).items():
        means = out.setdefault(task, set())
        for entry in (config or {}).get("metric_list") or []:
            name = entry.get("metric") if isinstance(entry, dict) else None
            if not isinstance(name, str):
                continue
            agg = entry.get("aggregation")
            if agg is None:
                agg = _default_aggregation(name)
            if agg == "mean" or agg is mean or getattr(agg, "__name__", None) == "mean":
                means.add(name)
    return out


def _default_aggregation(metric: str) -> Any:
    from lm_eval.api.registry import get_metric_aggregation

    try:
        return get_metric_aggregation(metric)
    except Exception:  # an unregistered metric (a task's own function): unknown
        return None


def _stderr_name(name: str) -> str:
    metric, _, filt = name.partition(",")
    return metric + STDERR + (f",{filt}" if filt else "")


def recompute(records: list[Any], means: set[str]) -> tuple[dict[str, float], list[str]]:
    """A task's metrics over its scored records (those without ``error_kind``): the mean of
    each mean-aggregated metric and its standard error (as lm-eval computes them: sample
    standard deviation over √n, from two samples on), and the names of the other metrics the
    records carry, which cannot be recomputed."""
    scored = [r for r in records if r.error_kind is None]
    values: dict[str, list[float]] = {}
    for r in scored:
        for name, value in (r.model_extra or {}).items():
            v = number(value)
            if v is not None:
                values.setdefault(name, []).append(v)
    out: dict[str, float] = {}
    left_out = []
    for name, xs in values.items():
        if name.partition(",")[0] not in means:
            left_out.append(name)
            continue
        mu = sum(xs) / len(xs)
        out[name] = mu
        if len(xs) > 1:
            var = sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)
            out[_stderr_name(name)] = math.sqrt(var) / math.sqrt(len(xs))
    return out, left_out


def summarize_tasks(
    records: list[Any],
    results: Mapping[str, Any],
    *,
    groups: Mapping[str, list[str]],
    old: Mapping[str, dict[str, float]] | None = None,
) -> tuple[dict[str, dict[str, float]], list[str]]:
    """``summary.json``'s ``tasks`` and its notes. ``results`` is this lm-eval run's,
    ``groups`` each group's tasks; ``old`` the previous summary's tasks when this run re-ran
    only the errors (its figures stand for the tasks this run did not touch; each task it
    touched is recomputed over the merged records)."""
    errors = Counter(r.task for r in records if r.error_kind is not None)
    ran = [t for t in (results.get("samples") or {}) if isinstance(t, str)]
    lm = lm_eval_metrics(results)
    means = mean_metrics(results)
    fresh = old is None
    out: dict[str, dict[str, float]] = {} if fresh else dict(old or {})
    notes: list[str] = []
    for task in ran:
        if fresh and not errors[task]:
            out[task] = lm.get(task, {})
            continue
        mine = [r for r in records if r.task == task]
        out[task], left_out = recompute(mine, means.get(task, set()))
        if not any(r.error_kind is None for r in mine):
            notes.append(f"{task}: no sample was scored ({len(mine)} got no usable reply)")
        elif left_out:
            notes.append(
                f"{task}: {', '.join(sorted(left_out))} left out (not a mean: it cannot be "
                f"computed without the {errors[task]} samples that got no usable reply)"
            )
    leaves = {r.task for r in records} | set(ran)
    for group in [g for g in (lm if fresh else old or {}) if g not in leaves]:
        subtasks = groups.get(group) or list(leaves)
        hit = any(errors[t] for t in subtasks) if fresh else bool(set(subtasks) & set(ran))
        if hit:
            out.pop(group, None)
            notes.append(
                f"{group}: the group's figures are left out (its tasks had samples with no "
                "usable reply; --overwrite reruns them all)"
            )
        elif fresh:
            out[group] = lm[group]
    return out, notes
