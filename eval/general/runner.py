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
"""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
import os
import time
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from astra_agent.errors import AstraError, ConfigError
from astra_agent.model import ChatModel, ModelConfig
from eval.general.tasks import TASKS_DIR
from eval.results import (
    CONFIG,
    RESULTS,
    SUMMARY,
    EvalRecord,
    RunMeta,
    ensure_writable_dir,
    model_fingerprint,
    write_json_atomic,
)
from eval.runner import EndpointDied

if TYPE_CHECKING:
    from eval.general.backend import AstraChatLM

log = logging.getLogger(__name__)

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

    out: Path
    model: ModelConfig = Field(default_factory=ModelConfig)
    tasks: list[str] = Field(default_factory=lambda: list(DEFAULT_TASKS), min_length=1)
    include_path: list[Path] = Field(default_factory=list)
    limit: int | None = Field(None, ge=1, description="first N samples of each task")
    concurrency: int = Field(4, ge=1, description="requests at once (lm-eval's num_concurrent)")
    overwrite: bool = False

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
    """The results already in --out (summary first): refused without --overwrite."""
    ensure_writable_dir(cfg.out)
    old = [cfg.out / f for f in (SUMMARY, RESULTS) if (cfg.out / f).exists()]
    if old and not cfg.overwrite:
        raise ConfigError(
            f"{cfg.out} already holds results",
            hint="pass --overwrite to replace them (this eval cannot resume: lm-eval scores at "
            "the end), or choose another --out",
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


def evaluate_general(cfg: GeneralEvalConfig) -> dict[str, Any]:
    """Check --out, the tasks and the endpoint; run the tasks; write results.jsonl and
    summary.json (only when the run completes) and return the summary."""
    version = require_lm_eval()
    old = _old_results(cfg)
    tm = task_manager(cfg.tasks, cfg.include_path)
    served = asyncio.run(_served_model(cfg.model))
    for f in old:  # --overwrite, once the tasks and the endpoint are known good
        f.unlink()
    fingerprint = {
        "kind": "general",
        **model_fingerprint(cfg.model, served),
        "tasks": cfg.tasks,
        "limit": cfg.limit,
        "include_path": [str(p.resolve()) for p in cfg.include_path],
        "lm_eval": version,
    }
    meta = RunMeta(fingerprint=fingerprint, base_url=cfg.model.base_url)
    write_json_atomic(cfg.out / CONFIG, meta.model_dump(mode="json"))
    t0 = time.monotonic()
    lm = _backend(cfg, served)
    results = _run(lm, cfg, tm)
    records = build_records(results, lm)
    _write_records(cfg.out / RESULTS, records)
    summary = {
        "kind": "general",
        "model": served,
        "tasks": task_metrics(results),
        "published": PUBLISHED,
        "lm_eval": version,
        "samples": len(records),
        "n_samples": results.get("n-samples", {}),
        "limit": cfg.limit,
        "errors": sum(r.error is not None for r in records),
        "complete": True,
        "wall_s": round(time.monotonic() - t0, 2),
    }
    write_json_atomic(cfg.out / SUMMARY, summary)
    return summary


def _run(lm: AstraChatLM, cfg: GeneralEvalConfig, tm: Any) -> dict[str, Any]:
    """lm-eval's simple_evaluate; its failures as our errors: the endpoint's (EndpointDied,
    exit 1), the tasks' before any request ran (ConfigError: a data set that cannot load),
    anything after (exit 1, the traceback at debug level)."""
    from lm_eval.evaluator import simple_evaluate

    try:
        results = simple_evaluate(
            model=lm,
            tasks=list(cfg.tasks),
            task_manager=tm,
            limit=cfg.limit,
            apply_chat_template=True,
            log_samples=True,
        )
    except EndpointDied as exc:
        raise EndpointDied(
            f"the endpoint failed during the run: {exc.message}",
            hint="nothing was recorded (lm-eval scores at the end): rerun with --overwrite "
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


def _metric_names(keys: list[str]) -> dict[str, str]:
    """lm-eval's ``metric,filter`` keys → our names: the bare metric where the task has one
    filter, ``metric,filter`` where it has several."""
    pairs = [k.split(",", 1) for k in keys if "," in k]
    single = len({f for _, f in pairs}) <= 1
    return {f"{m},{f}": m if single else f"{m},{f}" for m, f in pairs}


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


def task_metrics(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``summary.json``'s ``tasks``: per task (and group), each metric and its stderr."""
    out: dict[str, dict[str, float]] = {}
    for task, row in (results.get("results") or {}).items():
        names = _metric_names(list(row))
        metrics = {names[k]: v for k, v in row.items() if k in names and _number(v) is not None}
        out[task] = {k: float(v) for k, v in metrics.items()}
    return out


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
    samples: list[dict[str, Any]],
    lm: AstraChatLM,
    names: dict[str, str],
) -> GeneralRecord:
    """One record from a doc's logged samples (one per filter) and its replies."""
    first = samples[0]
    key = (task, int(first["doc_id"]))
    gens = lm.generations.get(key, [])
    extracted = {s["filter"]: str((s.get("filtered_resps") or [""])[0]) for s in samples}
    metrics: dict[str, float] = {}
    for s in samples:
        for m in s.get("metrics", []):
            value = _number(s.get(m))
            if value is not None:
                metrics[names.get(f"{m},{s['filter']}", m)] = value
    gen = gens[0] if gens else None
    return GeneralRecord.model_validate(
        {
            "id": f"{task}/{first['doc_id']}",
            "task": task,
            "index": int(first["doc_id"]),
            "prompt": _prompt(lm.prompts.get(key, "")),
            "response": gen.content if gen else "",
            "reasoning": gen.reasoning if gen else None,
            "finish_reason": gen.finish_reason if gen else None,
            "answer": gen.answer if gen else "",
            "extracted": next(iter(extracted.values()), ""),
            "target": str(first.get("target", "")),
            "filters": extracted if len(extracted) > 1 else None,
            "responses": [g.content for g in gens] if len(gens) > 1 else None,
            "error": gen.error if gen else "no reply was recorded for this sample",
            "error_kind": "inference" if gen is None or gen.error else None,
            **metrics,
        }
    )


def build_records(results: dict[str, Any], lm: AstraChatLM) -> list[GeneralRecord]:
    """One record per task sample (lm-eval's logged samples, one per filter, and the replies
    ``lm`` kept), in task order, then sample order."""
    records = []
    for task, logged in (results.get("samples") or {}).items():
        names = _metric_names(list((results.get("results") or {}).get(task, {})))
        by_doc: dict[int, list[dict[str, Any]]] = {}
        for s in logged:
            by_doc.setdefault(int(s["doc_id"]), []).append(s)
        for doc_id in sorted(by_doc):
            records.append(_record(task, by_doc[doc_id], lm, names))
    return records


def _write_records(path: Path, records: list[GeneralRecord]) -> None:
    """results.jsonl, whole: through a temp file and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(r.model_dump_json() + "\n")
    os.replace(tmp, path)
