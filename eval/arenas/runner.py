"""``astra-eval arenas``: run every arena task through the episode loop, score, resume."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.arena import ArenaEnvironment, ArenaTask, LoadReport, load_arena_file
from astra_agent.arena import trajectory_reward as reward_of
from astra_agent.episode import EpisodeLimits, run_episode
from astra_agent.errors import ConfigError
from astra_agent.model import ChatModel
from astra_agent.sandbox import SandboxLimits, bwrap_available
from astra_agent.trajectory import Termination, Trajectory
from eval.arenas.checks import task_findings
from eval.results import EvalRecord
from eval.runner import EvalSpec, ProgressHook, RunConfig, run_eval
from eval.summaries import EvalSummary

NAME = "arenas"  # the eval kind (eval/kinds.py)


class ArenaEvalConfig(RunConfig):
    out: Path = Field(Path("runs/arenas"), description="results directory (checked writable)")
    data: Path = Field(description="tasks: JSONL or parquet")
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    limits: EpisodeLimits = Field(default_factory=EpisodeLimits)
    limit: int | None = Field(None, ge=1, description="only the first N tasks")
    unsafe_no_sandbox: bool = Field(
        False, description="run tool code WITHOUT isolation (trusted code only)"
    )

    def fingerprint(self) -> dict[str, Any]:
        """What the results depend on besides the model and sampling."""
        return {
            "data_sha256": hashlib.sha256(self.data.read_bytes()).hexdigest(),
            "limits": self.limits.model_dump(),
            "sandbox": self.sandbox.model_dump(),
        }


class ArenaRecord(EvalRecord):
    """One task's result: ``id`` is the task's ``task_id`` (``index`` too where a file repeats
    a task_id), its reward's parts, errors by kind, the trajectory."""

    index: int
    task_id: str
    domain: str = ""
    reward: float
    recall: float
    precision: float
    solved: list[str]
    required: int
    tool_calls: int
    fully_solved: bool
    termination: Termination
    errors: dict[str, int] = Field(default_factory=dict)
    trajectory: Trajectory | None = None


class ArenaDomain(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    tasks: int | None = None
    mean_reward: float | None = None
    fully_solved: float | None = None


class ArenaSummary(EvalSummary):
    tasks: int | None = None
    mean_reward: float | None = None
    fully_solved: float | None = None
    mean_recall: float | None = None
    mean_precision: float | None = None
    tool_calls_per_task: float | None = None
    errors: dict[str, int] = Field(default_factory=dict)
    terminations: dict[str, int] = Field(default_factory=dict)
    domains: dict[str, ArenaDomain] = Field(default_factory=dict)


def task_ids(tasks: list[ArenaTask]) -> dict[int, str]:
    """Each task's record id, by index: its task_id, or ``task_id@index`` where the file
    repeats that task_id."""
    seen = Counter(t.task_id for t in tasks)
    return {t.index: t.task_id if seen[t.task_id] == 1 else f"{t.task_id}@{t.index}" for t in tasks}


def _record(task: ArenaTask, rec_id: str, traj: Trajectory, **fields: Any) -> ArenaRecord:
    r = reward_of(task, traj)
    return ArenaRecord(
        id=rec_id, index=task.index, task_id=task.task_id, domain=task.domain,
        reward=round(r.reward, 6), recall=r.recall, precision=round(r.precision, 6),
        solved=list(r.solved), required=r.required, tool_calls=r.tool_calls,
        fully_solved=r.fully_solved, **fields,
    )  # fmt: skip


async def run_task(
    task: ArenaTask, rec_id: str, model: ChatModel, cfg: ArenaEvalConfig
) -> ArenaRecord:
    """Run one task; its failure to run is recorded (``error_kind="run"``), not raised."""
    try:
        async with ArenaEnvironment(
            task, cfg.sandbox, unsafe_no_sandbox=cfg.unsafe_no_sandbox
        ) as env:
            traj = await run_episode(model, env, task.prompt, limits=cfg.limits)
    except Exception as exc:  # one task's failure is recorded, the run goes on
        return _record(
            task, rec_id, Trajectory(), termination="error", error_kind="run",
            error=f"{type(exc).__name__}: {exc}", errors={"task_error": 1},
        )  # fmt: skip
    errors = {k: v for k, v in traj.counts().items() if k not in ("ok", "recovered")}
    failed = traj.termination == "model_error"
    if failed:
        errors["inference_error"] = 1
    return _record(
        task, rec_id, traj, termination=traj.termination, errors=errors, trajectory=traj,
        error=traj.termination_detail if failed else None,
        error_kind="inference" if failed else None,
        endpoint_failure=traj.model_failure if failed else None,
    )  # fmt: skip


def _domain(records: list[ArenaRecord]) -> ArenaDomain:
    """Tasks, and the means of their reward and fully solved share."""
    n = len(records)
    return ArenaDomain(
        tasks=n,
        mean_reward=round(sum(r.reward for r in records) / n, 4),
        fully_solved=round(sum(r.fully_solved for r in records) / n, 4),
    )


def summarize(records: list[ArenaRecord]) -> ArenaSummary:
    """Means over the tasks (each id once), errors and terminations by kind, and the same
    means per domain."""
    n = len(records)
    if not n:
        return ArenaSummary(tasks=0)
    errors: Counter[str] = Counter()
    for r in records:
        errors.update(r.errors)
    by_domain: dict[str, list[ArenaRecord]] = {}
    for r in records:
        by_domain.setdefault(r.domain or "(none)", []).append(r)
    whole = _domain(records)
    return ArenaSummary(
        tasks=n,
        mean_reward=whole.mean_reward,
        fully_solved=whole.fully_solved,
        mean_recall=round(sum(r.recall for r in records) / n, 4),
        mean_precision=round(sum(r.precision for r in records) / n, 4),
        tool_calls_per_task=round(sum(r.tool_calls for r in records) / n, 3),
        errors=dict(sorted(errors.items())),
        terminations=dict(Counter(r.termination for r in records)),
        domains={d: _domain(rs) for d, rs in sorted(by_domain.items())},
    )


def load_tasks(path: Path) -> LoadReport:
    """The tasks of ``path``; none valid (an empty file included) is a ConfigError."""
    report = load_arena_file(path)
    if not report.tasks:
        what = "no record" if not report.records else "no valid task"
        raise ConfigError(f"{path} has {what}:\n" + _problems(report))
    return report


async def evaluate_arenas(
    cfg: ArenaEvalConfig, progress: ProgressHook[ArenaRecord] | None = None
) -> ArenaSummary:
    """Run every task (append one whole record per task, resume), write summary.json."""
    report = load_tasks(cfg.data)
    if not cfg.unsafe_no_sandbox and not bwrap_available():
        raise ConfigError(
            "bubblewrap (bwrap) is not installed",
            hint="apt-get install bubblewrap, or --unsafe-no-sandbox for code you trust",
        )
    tasks = report.tasks[: cfg.limit] if cfg.limit else report.tasks
    ids = task_ids(report.tasks)
    skipped = len({p.index for p in report.errors})

    def summary_of(records: list[ArenaRecord]) -> ArenaSummary:
        extra = {"skipped_records": skipped, "data": str(cfg.data)}
        return summarize(records).model_copy(update=extra)

    spec = EvalSpec(
        items=tasks,
        key=lambda t: ids[t.index],
        one=lambda t, model: run_task(t, ids[t.index], model, cfg),
        record=ArenaRecord,
        fingerprint=cfg.fingerprint(),
        summarize=summary_of,
        kind=NAME,
    )
    summary, _ = await run_eval(cfg, spec, progress)
    return summary


def _problems(report: LoadReport) -> str:
    return "\n".join(f"  [{p.severity}] {p}" for p in report.problems) or "  (none)"


async def validate_arenas(
    path: Path, sandbox: SandboxLimits | None = None, *, unsafe_no_sandbox: bool = False
) -> tuple[LoadReport, list[str], list[str]]:
    """Load, then run each task's reference chain in the sandbox: all gold answers reached,
    and none of them reachable without the task (:mod:`eval.arenas.checks`: blind calls,
    answers in arguments, code that tried what the sandbox refused, left threads running or
    printed more than the sandbox keeps). Returns the load report, failures and warnings
    found at run time."""
    report = load_tasks(path)
    limits = sandbox or SandboxLimits()
    failures: list[str] = []
    warnings: list[str] = []
    for task in report.tasks:
        where = f"record {task.index} ({task.task_id})"
        async with ArenaEnvironment(task, limits, unsafe_no_sandbox=unsafe_no_sandbox) as env:
            if not task.reference:
                failures += [
                    f"{where}: tool {name!r} does not load in the sandbox: {why}"
                    for name, why in env.sandbox.load_errors.items()
                ]
                warnings.append(f"{where}: no reference chain, gold answers not checked")
                continue
            found = await task_findings(task, env, limits.output_cap_chars)
        failures += [f"{where}: {f}" for f in found]
    return report, failures, warnings
