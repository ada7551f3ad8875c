"""``astra-eval general``: lm-eval generation tasks (ours, or any ``--include-path`` YAML)
against an OpenAI-compatible chat endpoint, through lm-eval's ``local-chat-completions``
backend with the chat template applied by the server and the model's thinking handled
(:mod:`eval.general.backend`).

The run directory has the layout of the other evals: ``config.json`` (the fingerprint: served
model, sampling, tasks, limit), ``results.jsonl`` (one record per task sample, from lm-eval's
logged samples) and ``summary.json`` (metrics per task, the paper's figures for reference).
lm-eval holds every answer in memory and scores at the end, so a run is all or nothing: the
results and the summary are written (each atomically) only once it has finished; a run that
fails leaves ``config.json`` alone, and nothing claims a result. For the same reason there is
no ``--resume`` (lm-eval's request cache skips sampled generations, which these runs are).

A sample whose reply was not a chat completion (after the retries) is an inference error, as in
the other evals: recorded with ``error``/``error_kind``, without metric values, left out of the
task's figures (:mod:`eval.general.scores`) and counted (``errors``, ``errors_by_task``;
``scored`` samples remain). ``--retry-errors`` re-runs just those samples (lm-eval's
``samples``) and replaces their records. A task of which no sample could be scored fails the
run (exit 1) once the results are written.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
import time
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from astra_agent.errors import AstraError, ConfigError, ServerError
from astra_agent.model import ChatModel, ModelConfig
from astra_agent.runio import write_json_atomic, write_lines_atomic
from eval.general.scores import metric_names, number, summarize_tasks
from eval.general.tasks import TASKS_DIR
from eval.results import (
    CONFIG,
    RESULTS,
    SUMMARY,
    EvalRecord,
    RunMeta,
    ensure_writable_dir,
    model_fingerprint,
    prepare_results_dir,
)
from eval.runner import EndpointDied
from eval.summaries import EvalSummary

if TYPE_CHECKING:
    from eval.general.backend import AstraChatLM, Generation

log = logging.getLogger(__name__)

NAME = "general"  # the eval kind (eval/kinds.py)
DEFAULT_TASKS = ["astra_arith"]
PROMPT_EXCERPT = 500  # characters of the prompt kept per record

# The paper's figures, for reference beside a measured run. The issue quotes AIME 73.40 vs
# 73.45 for ASTRA-14B-Thinking-v1 vs Qwen3-14B; the project README (LianjiaTech/astra) lists
# BFCL only, and the paper's table could not be read here: which model has which figure, and
# which AIME year, are unconfirmed.
PUBLISHED: dict[str, Any] = {
    "AIME": {
        "figures": [73.40, 73.45],
        "models": ["ASTRA-14B-Thinking-v1", "Qwen3-14B"],
        "assignment_confirmed": False,
        "note": "paper (arXiv 2601.21558): RL leaves AIME unchanged, 73.40 vs 73.45; which "
        "model has which figure, and the AIME year, are not confirmed",
    }
}


class GeneralEvalConfig(BaseModel):
    """``astra-eval general``: the endpoint and sampling, the tasks, and where results go."""

    model_config = ConfigDict(extra="forbid")

    out: Path = Field(Path("runs/general"), description="results directory (checked writable)")
    model: ModelConfig = Field(default_factory=ModelConfig)
    tasks: list[str] = Field(default_factory=lambda: list(DEFAULT_TASKS), min_length=1)
    include_path: list[Path] = Field(
        default_factory=list, description="a directory of your own lm-eval task YAMLs (repeatable)"
    )
    limit: int | None = Field(None, ge=1, description="first N samples of each task")
    concurrency: int = Field(4, ge=1, description="requests at once (lm-eval's num_concurrent)")
    overwrite: bool = Field(
        False, description="replace results in --out (no --resume: lm-eval scores at the end)"
    )
    retry_errors: bool = Field(
        False, description="re-run the samples recorded as inference errors in --out"
    )

    @field_validator("include_path")
    @classmethod
    def _dirs(cls, paths: list[Path]) -> list[Path]:
        for p in paths:
            if not p.exists():
                raise ValueError(f"{p} does not exist")
        return paths


class GeneralRecord(EvalRecord):
    """One task sample. Every field beyond the declared ones is a metric value (a number),
    named as in ``summary.json``'s ``tasks``."""

    model_config = ConfigDict(extra="allow")

    task: str
    index: int  # the sample's index in the task (lm-eval's doc_id)
    prompt: str  # the last user message, cut to PROMPT_EXCERPT characters
    response: str  # the reply's content as the endpoint returned it (think block included)
    reasoning: str | None = None  # reasoning the endpoint returned separately
    finish_reason: str | None = None
    answer: str  # what the task's filters saw: the text after </think>
    extracted: str  # the (first) filter's result, which the metrics compared with the target
    target: str
    filters: dict[str, str] | None = None  # every filter's result, where a task has several
    responses: list[str] | None = None  # every reply, where a task samples several (repeats)


class GeneralSummary(EvalSummary):
    tasks: dict[str, dict[str, float]] = Field(default_factory=dict)
    published: dict[str, dict[str, Any]] = Field(default_factory=dict)
    samples: int | None = None
    scored: int | None = None
    errors: int | None = None
    errors_by_task: dict[str, int] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


# ------------------------------------------------------------------ tasks


def require_lm_eval() -> str:
    """lm-eval's version; a clear error where it is not installed."""
    try:
        import lm_eval  # noqa: F401

        return metadata.version("lm_eval")
    except ImportError:
        raise ConfigError(
            "lm-eval is not installed: `astra-eval general` runs its tasks",
            hint="pip install 'astra-harness[train]' (lm-eval==0.4.13)",
        ) from None


def quiet_lm_eval() -> None:
    """lm-eval logs every step at INFO and task-config notes at WARNING; keep its other
    warnings. Failed requests are ours to report (the backend retries them and says so), not
    its request logger's. Not called with --verbose."""
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    logging.getLogger("lm_eval.api.task").setLevel(logging.ERROR)
    logging.getLogger("lm_eval.config.task").setLevel(logging.ERROR)  # e.g. "no `until`": unused
    logging.getLogger("lm_eval.models.api_models").setLevel(logging.CRITICAL)


def task_manager(names: list[str], include: list[Path]) -> Any:
    """A TaskManager that knows ``names``: ours and ``include`` first (fast: lm-eval's own
    ~15,000 task configs take seconds to index), lm-eval's tasks only when needed. An unknown
    name is a ConfigError naming close matches."""
    from lm_eval.tasks import TaskManager

    paths = [str(TASKS_DIR), *(str(p) for p in include)]
    tm = TaskManager(include_path=paths, include_defaults=False)
    if not set(names) - set(tm.all_tasks):
        return tm
    tm = TaskManager(include_path=paths)
    unknown = [n for n in names if n not in tm.all_tasks]
    if unknown:
        close = sorted(
            {m for n in unknown for m in difflib.get_close_matches(n, tm.all_tasks, n=5)}
        )
        raise ConfigError(
            f"unknown task{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}"
            + (f" (close matches: {', '.join(close)})" if close else ""),
            hint="`lm-eval ls tasks` lists lm-eval's tasks; --include-path DIR adds your own "
            "task YAMLs",
        )
    return tm


# ------------------------------------------------------------------ the run


def _old_results(cfg: GeneralEvalConfig) -> list[Path]:
    """The results already in --out (summary first): refused without --overwrite or
    --retry-errors (which continues them)."""
    if cfg.overwrite and cfg.retry_errors:
        raise ConfigError(
            "--overwrite and --retry-errors exclude each other",
            hint="--retry-errors re-runs the samples recorded as errors and keeps the others; "
            "--overwrite replaces every result",
        )
    ensure_writable_dir(cfg.out)
    old = [cfg.out / f for f in (SUMMARY, RESULTS) if (cfg.out / f).exists()]
    if old and not (cfg.overwrite or cfg.retry_errors):
        raise ConfigError(
            f"{cfg.out} already holds results",
            hint="pass --retry-errors to re-run the samples recorded as errors, --overwrite to "
            "replace them all (this eval cannot resume: lm-eval scores at the end), or choose "
            "another --out",
        )
    return old


async def _served_model(config: ModelConfig) -> str:
    model = ChatModel(config)
    try:
        return await model.check_model()
    finally:
        await model.close()


def _sampling(c: ModelConfig) -> dict[str, Any]:
    values = {"temperature": c.temperature, "top_p": c.top_p, "top_k": c.top_k, "min_p": c.min_p}
    return {**{k: v for k, v in values.items() if v is not None}, **c.extra_body}


def _backend(cfg: GeneralEvalConfig, served: str) -> AstraChatLM:
    from eval.general.backend import AstraChatLM

    c = cfg.model
    header = {"Authorization": f"Bearer {c.api_key}"} if c.api_key else None
    return AstraChatLM(
        base_url=c.base_url.rstrip("/") + "/chat/completions",
        model=served,
        sampling=_sampling(c),
        max_tokens=c.max_tokens,
        timeout_s=c.request_timeout_s,
        num_concurrent=cfg.concurrency,
        retries=c.max_retries,
        backoff_s=c.retry_backoff_s,
        header=header,
    )


def evaluate_general(cfg: GeneralEvalConfig) -> GeneralSummary:
    """Check --out, the tasks and the endpoint; run the tasks (with --retry-errors, only the
    samples recorded as errors in --out); write results.jsonl and summary.json (only when the
    run completes) and return the summary. A task of which no sample could be scored is a
    ServerError (exit 1), raised once both files are written."""
    version = require_lm_eval()
    old = _old_results(cfg)
    tm = task_manager(cfg.tasks, cfg.include_path)
    served = asyncio.run(_served_model(cfg.model))
    fingerprint = {
        "kind": NAME,
        **model_fingerprint(cfg.model, served),
        "tasks": cfg.tasks,
        "limit": cfg.limit,
        "include_path": [str(p.resolve()) for p in cfg.include_path],
        "lm_eval": version,
    }
    meta = RunMeta(kind=NAME, fingerprint=fingerprint, base_url=cfg.model.base_url)
    if cfg.retry_errors and old:
        return _retry_errors(cfg, meta, tm)
    for f in old:  # --overwrite, once the tasks and the endpoint are known good
        f.unlink()
    write_json_atomic(cfg.out / CONFIG, meta.written())
    t0 = time.monotonic()
    lm = _backend(cfg, served)
    results = _run(lm, cfg, tm)
    records = build_records(results, lm)
    groups = {g: list(ts) for g, ts in (results.get("group_subtasks") or {}).items() if ts}
    tasks, notes = summarize_tasks(records, results, groups=groups)
    base = {
        "kind": NAME,
        "model": served,
        "published": PUBLISHED,
        "lm_eval": version,
        "n_samples": results.get("n-samples", {}),
        "limit": cfg.limit,
        "groups": groups,
    }
    return _finish(cfg.out, base, records, tasks, notes, t0)


def _retry_errors(cfg: GeneralEvalConfig, meta: RunMeta, tm: Any) -> GeneralSummary:
    """--retry-errors: the samples of --out recorded as errors, run again (lm-eval's
    ``samples``); their new records replace the old, and the tasks they belong to are
    recomputed over the merged records."""
    done = prepare_results_dir(cfg.out, meta, True, GeneralRecord)  # same run, or refused
    old = _old_summary(cfg.out)
    todo: dict[str, list[int]] = {}
    for r in done.values():
        if r.error_kind is not None:
            todo.setdefault(r.task, []).append(r.index)
    if not todo:
        log.warning("%s: no sample is recorded as an error: nothing to retry", cfg.out)
        return GeneralSummary.model_validate(old)
    t0 = time.monotonic()
    selected = {t: sorted(set(ids)) for t, ids in todo.items()}
    lm = _backend(cfg, str(meta.fingerprint["model"]))
    results = _run(lm, cfg, tm, samples=selected)
    merged = {**done, **{r.id: r for r in build_records(results, lm, selected)}}
    records = list(merged.values())
    groups = old.get("groups")
    groups = groups if isinstance(groups, dict) else {}
    tasks, notes = summarize_tasks(records, results, groups=groups, old=old["tasks"])
    base = {**old, "retried": sum(map(len, selected.values()))}
    return _finish(cfg.out, base, records, tasks, notes, t0)


def _old_summary(out: Path) -> dict[str, Any]:
    """The summary of the run in ``out``, as written (the retry's summary keeps its fields)."""
    try:
        old = json.loads((out / SUMMARY).read_text(encoding="utf-8"))
        GeneralSummary.model_validate(old)
    except (OSError, ValueError):  # ValidationError included
        old = None
    if not isinstance(old, dict) or not isinstance(old.get("tasks"), dict):
        raise ConfigError(
            f"{out / SUMMARY} is missing or not a summary of `astra-eval general`: the figures "
            "of the tasks not retried are unknown",
            hint="pass --overwrite to run every sample again",
        )
    return old


def _finish(
    out: Path,
    base: dict[str, Any],
    records: list[GeneralRecord],
    tasks: dict[str, dict[str, float]],
    notes: list[str],
    t0: float,
) -> GeneralSummary:
    """Write results.jsonl and summary.json; a task with no scored sample fails the run."""
    write_lines_atomic(out / RESULTS, (r.model_dump_json() + "\n" for r in records))
    errors = Counter(r.task for r in records if r.error_kind is not None)
    summary = {
        **base,
        "tasks": tasks,
        "samples": len(records),
        "scored": len(records) - sum(errors.values()),
        "errors": sum(errors.values()),
        "errors_by_task": dict(sorted(errors.items())),
        "notes": notes,
        "complete": True,
        "wall_s": round(time.monotonic() - t0, 2),
    }
    write_json_atomic(out / SUMMARY, summary)
    totals = Counter(r.task for r in records)
    unscored = [t for t, n in totals.items() if errors[t] == n]
    if unscored:
        first = next(r.error for r in records if r.task in unscored and r.error)
        raise ServerError(
            f"no sample of {', '.join(unscored)} could be scored: every reply was unusable "
            f"({errors.total()} of {len(records)} samples; the first: {first})",
            hint="is --base-url an OpenAI-compatible chat endpoint? the errors are in "
            f"{out / RESULTS}; --retry-errors re-runs them",
        )
    return GeneralSummary.model_validate(summary)


def _run(
    lm: AstraChatLM, cfg: GeneralEvalConfig, tm: Any, samples: dict[str, list[int]] | None = None
) -> dict[str, Any]:
    """lm-eval's simple_evaluate (over ``samples``' docs of their tasks where given); its
    failures as our errors: the endpoint's (EndpointDied, exit 1), the tasks' before any
    request ran (ConfigError: a data set that cannot load), anything after (exit 1, the
    traceback at debug level)."""
    from lm_eval.evaluator import simple_evaluate

    try:
        results = simple_evaluate(
            model=lm,
            tasks=list(samples) if samples else list(cfg.tasks),
            task_manager=tm,
            limit=None if samples else cfg.limit,
            samples=samples,
            apply_chat_template=True,
            log_samples=True,
        )
    except EndpointDied as exc:
        again = "--retry-errors" if samples else "--overwrite"
        raise EndpointDied(
            f"the endpoint failed during the run: {exc.message}",
            hint=f"nothing was recorded (lm-eval scores at the end): rerun with {again} "
            "once the endpoint is back",
        ) from exc
    except AstraError:
        raise
    except Exception as exc:
        log.debug("lm-eval failed", exc_info=True)
        if lm.started:
            raise AstraError(
                f"lm-eval failed after the requests: {type(exc).__name__}: {str(exc)[:500]}",
                hint="a task's own code (filters, process_results) may be at fault; "
                "--verbose shows the traceback",
            ) from exc
        raise ConfigError(
            f"the tasks could not be loaded: {type(exc).__name__}: {str(exc)[:500]}",
            hint="tasks whose data is on the Hugging Face Hub need network access or a filled "
            "HF cache; local tasks: check dataset_kwargs.data_files",
        ) from exc
    if not isinstance(results, dict):
        raise AstraError("lm-eval returned no results")
    return results


# ------------------------------------------------------------------ results


def _prompt(chat: str) -> str:
    """The last user message of a chat prompt (lm-eval's JSON list of messages), cut."""
    try:
        messages = json.loads(chat)
        users = [m.get("content", "") for m in messages if m.get("role") == "user"]
        text = str(users[-1] if users else messages[-1].get("content", ""))
    except (ValueError, TypeError, AttributeError, IndexError):
        text = chat
    return text[:PROMPT_EXCERPT]


def _record(
    task: str,
    doc_id: int,
    samples: list[dict[str, Any]],
    gens: list[Generation],
    prompt: str,
    names: dict[str, str],
) -> GeneralRecord:
    """One record from a doc's logged samples (one per filter) and its replies. A sample one of
    whose replies was unusable (or missing) is an inference error, without metric values
    (lm-eval scored an empty answer, which is not the model's)."""
    first = samples[0]
    failed = next((g for g in gens if g.error), None)
    error = failed.error if failed else (None if gens else "no reply was recorded for this sample")
    extracted = {str(s.get("filter")): str((s.get("filtered_resps") or [""])[0]) for s in samples}
    metrics: dict[str, float] = {}
    for s in samples if error is None else []:
        for m in s.get("metrics", []):
            value = number(s.get(m))
            if value is not None:
                metrics[names.get(f"{m},{s.get('filter')}", m)] = value
    gen = gens[0] if gens else None
    return GeneralRecord.model_validate(
        {
            "id": f"{task}/{doc_id}",
            "task": task,
            "index": doc_id,
            "prompt": _prompt(prompt),
            "response": gen.content if gen else "",
            "reasoning": gen.reasoning if gen else None,
            "finish_reason": gen.finish_reason if gen else None,
            "answer": gen.answer if gen else "",
            "extracted": "" if error else next(iter(extracted.values()), ""),
            "target": str(first.get("target", "")),
            "filters": extracted if len(extracted) > 1 and not error else None,
            "responses": [g.content for g in gens] if len(gens) > 1 else None,
            "error": error,
            "error_kind": "inference" if error else None,
            "endpoint_failure": "other" if failed else None,
            **metrics,
        }
    )


def build_records(
    results: dict[str, Any], lm: AstraChatLM, selected: dict[str, list[int]] | None = None
) -> list[GeneralRecord]:
    """One record per task sample (lm-eval's logged samples, one per filter, and the replies
    ``lm`` kept), in task order, then sample order. ``selected``: the docs a --retry-errors
    run asked for, by task (lm-eval numbers their requests 0, 1, … in that order)."""
    records = []
    for task, logged in (results.get("samples") or {}).items():
        names = metric_names(list((results.get("results") or {}).get(task, {})))
        by_doc: dict[int, list[dict[str, Any]]] = {}
        for s in logged:
            by_doc.setdefault(int(s["doc_id"]), []).append(s)
        chosen = (selected or {}).get(task)
        position = {d: i for i, d in enumerate(chosen)} if chosen else {d: d for d in by_doc}
        for doc_id in sorted(by_doc):
            key = (task, position[doc_id])
            gens = lm.generations.get(key, [])
            prompt = lm.prompts.get(key, "")
            records.append(_record(task, doc_id, by_doc[doc_id], gens, prompt, names))
    return records
