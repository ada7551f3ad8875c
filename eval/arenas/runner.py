"""``astra-eval arenas``: run every arena task through the episode loop, score, resume."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.arena import (
    ArenaEnvironment,
    ArenaTask,
    LoadReport,
    load_arena_file,
    run_reference,
)
from astra_agent.arena import trajectory_reward as reward_of
from astra_agent.episode import EpisodeLimits, run_episode
from astra_agent.errors import ConfigError
from astra_agent.model import ChatModel, ModelConfig
from astra_agent.sandbox import SandboxLimits, bwrap_available
from astra_agent.trajectory import append_jsonl
from eval.results import RESULTS, prepare_results_dir


class ArenaEvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data: Path
    out: Path
    model: ModelConfig = Field(default_factory=ModelConfig)
    limits: EpisodeLimits = Field(default_factory=EpisodeLimits)
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    concurrency: int = Field(4, ge=1)
    limit: int | None = Field(None, ge=1)
    resume: bool = False
    unsafe_no_sandbox: bool = False

    def fingerprint(self) -> dict[str, Any]:
        """What must match for --resume to continue a results directory."""
        digest = hashlib.sha256(self.data.read_bytes()).hexdigest()
        return {
            "data_sha256": digest,
            **self.model.fingerprint(),
            "limits": self.limits.model_dump(),
            "sandbox": self.sandbox.model_dump(),
        }


def _prepare_out(cfg: ArenaEvalConfig) -> dict[int, dict[str, Any]]:
    return prepare_results_dir(cfg.out, cfg.fingerprint(), cfg.resume, key="index")


async def _one(task: ArenaTask, model: ChatModel, cfg: ArenaEvalConfig) -> dict[str, Any]:
    rec: dict[str, Any] = {"index": task.index, "task_id": task.task_id, "domain": task.domain}
    try:
        async with ArenaEnvironment(
            task, cfg.sandbox, unsafe_no_sandbox=cfg.unsafe_no_sandbox
        ) as env:
            traj = await run_episode(model, env, task.prompt, limits=cfg.limits)
    except Exception as exc:  # one task's failure is recorded, the run goes on
        r = reward_of(task, _empty())
        rec.update(
            _reward_fields(r),
            termination="error",
            error=f"{type(exc).__name__}: {exc}",
            errors={"task_error": 1},
            trajectory=None,
        )
        return rec
    r = reward_of(task, traj)
    errors = {k: v for k, v in traj.counts().items() if k not in ("ok", "recovered")}
    if traj.termination == "model_error":
        errors["inference_error"] = 1
    rec.update(
        _reward_fields(r),
        termination=traj.termination,
        errors=errors,
        error=traj.termination_detail if traj.termination == "model_error" else None,
        trajectory=traj.model_dump(mode="json"),
    )
    return rec


def _empty() -> Any:
    from astra_agent.trajectory import Trajectory

    return Trajectory()


def _reward_fields(r: Any) -> dict[str, Any]:
    return {
        "reward": round(r.reward, 6),
        "recall": r.recall,
        "precision": round(r.precision, 6),
        "solved": list(r.solved),
        "required": r.required,
        "tool_calls": r.tool_calls,
        "fully_solved": r.fully_solved,
    }


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(records)
    if not n:
        return {"tasks": 0}
    errors: Counter[str] = Counter()
    for r in records:
        errors.update(r.get("errors") or {})
    mean = lambda key: sum(float(r[key]) for r in records) / n  # noqa: E731
    return {
        "tasks": n,
        "mean_reward": round(mean("reward"), 4),
        "fully_solved": round(sum(1 for r in records if r["fully_solved"]) / n, 4),
        "mean_recall": round(mean("recall"), 4),
        "mean_precision": round(mean("precision"), 4),
        "tool_calls_per_task": round(mean("tool_calls"), 3),
        "errors": dict(sorted(errors.items())),
        "terminations": dict(Counter(r["termination"] for r in records)),
    }


Progress = Callable[[dict[str, Any], dict[str, Any]], None]  # (record, running summary)


async def evaluate_arenas(cfg: ArenaEvalConfig, progress: Progress | None = None) -> dict:
    """Run, append one record per task (whole), resume, and write summary.json."""
    report = load_arena_file(cfg.data)
    if not report.tasks:
        raise ConfigError(f"{cfg.data} has no valid task:\n" + _problems(report))
    if not cfg.unsafe_no_sandbox and not bwrap_available():
        raise ConfigError(
            "bubblewrap (bwrap) is not installed",
            hint="apt-get install bubblewrap, or --unsafe-no-sandbox for code you trust",
        )
    tasks = report.tasks[: cfg.limit] if cfg.limit else report.tasks
    model = ChatModel(cfg.model)
    try:
        await model.check_model()
        done = _prepare_out(cfg)
        records = [done[t.index] for t in tasks if t.index in done]
        todo = [t for t in tasks if t.index not in done]
        sem = asyncio.Semaphore(cfg.concurrency)
        lock = asyncio.Lock()

        async def run(task: ArenaTask) -> None:
            async with sem:
                rec = await _one(task, model, cfg)
            async with lock:
                append_jsonl(cfg.out / RESULTS, rec, fsync=False)
                records.append(rec)
                if progress:
                    progress(rec, summarize(records))

        t0 = time.monotonic()
        await asyncio.gather(*(run(t) for t in todo))
    finally:
        await model.close()
    summary = {
        **summarize(records),
        "wall_s": round(time.monotonic() - t0, 2),
        "skipped_records": len(report.errors and {p.index for p in report.errors}),
        "model": model.name,
        "data": str(cfg.data),
    }
    tmp = cfg.out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, cfg.out / "summary.json")
    return summary


def _problems(report: LoadReport) -> str:
    return "\n".join(f"  [{p.severity}] {p}" for p in report.problems) or "  (none)"


async def validate_arenas(
    path: Path, sandbox: SandboxLimits | None = None, *, unsafe_no_sandbox: bool = False
) -> tuple[LoadReport, list[str], list[str]]:
    """Load, then run each task's reference chain in the sandbox: all gold answers reached?
    Returns the load report, failures and warnings found at run time."""
    report = load_arena_file(path)
    failures: list[str] = []
    warnings: list[str] = []
    for task in report.tasks:
        async with ArenaEnvironment(task, sandbox, unsafe_no_sandbox=unsafe_no_sandbox) as env:
            for name, why in env.sandbox.load_errors.items():
                failures.append(
                    f"record {task.index} ({task.task_id}): tool {name!r} does "
                    f"not load in the sandbox: {why}"
                )
            if not task.reference:
                warnings.append(
                    f"record {task.index} ({task.task_id}): no reference chain, "
                    "gold answers not checked"
                )
                continue
            reward, outputs = await run_reference(task, env)
        if not reward.fully_solved:
            missing = sorted(set(task.sub_qa) - set(reward.solved))
            detail = "; ".join(
                f"{c['name']} → {o[:120]!r}"
                for c, o in zip(task.reference, outputs, strict=True)
                if c["name"] in missing
            )
            failures.append(
                f"record {task.index} ({task.task_id}): reference chain misses "
                f"{', '.join(missing)}: {detail}"
            )
    return report, failures, warnings
