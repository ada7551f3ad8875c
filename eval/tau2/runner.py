"""``astra-eval tau2``: τ²-bench (retail, telecom; airline too) against any OpenAI-compatible
endpoint, with the user simulator on a second one.

τ² itself — its tasks, databases, policies, tools, user-simulator loop and scorers — is
inspect_evals' (:data:`DATA_VERSION`), run unchanged by inspect_ai; what is ours is the
endpoint path (:mod:`eval.tau2.provider`), the run directory (one whole record per conversation
appended as it ends, ``--resume``, ``--retry-errors``, the fingerprint that refuses another
model, simulator or data version), trials and pass^k, and the conversations as
:class:`~astra_agent.trajectory.Trajectory` records.

How the two runners meet: :func:`eval.runner.run_items` waits for each conversation's record,
while one inspect_ai eval (inspect_ai runs one at a time in a process) plays the conversations
still to run, ``concurrency`` at once, each ending in :func:`_recorded`, which builds the record
from the sample's state and hands it over.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from astra_agent.errors import ConfigError
from astra_agent.model import ChatModel, ModelConfig
from astra_agent.trajectory import Trajectory, Usage
from eval.results import (
    RESULTS,
    EvalRecord,
    RunMeta,
    ensure_writable_dir,
    model_fingerprint,
    prepare_results_dir,
    read_results,
)
from eval.runner import (
    EndpointDied,
    ProgressHook,
    RunConfig,
    refuse_all_failed,
    run_items,
    to_run,
    write_summary,
)
from eval.summaries import Tau2Domain, Tau2Summary

if TYPE_CHECKING:
    from inspect_ai import Task
    from inspect_ai.solver import TaskState

log = logging.getLogger(__name__)
NAME = "tau2"  # the eval kind (eval/kinds.py)

Domain = Literal["retail", "telecom", "airline"]
DOMAINS: tuple[Domain, ...] = ("retail", "telecom", "airline")
PAPER_DOMAINS: tuple[Domain, ...] = ("retail", "telecom")

# ASTRA's Table 1 (pass^1 × 100, 4 trials, temperature 0, user simulator GPT-5.1).
PUBLISHED: dict[str, dict[str, float]] = {
    "ASTRA-14B-Thinking-v1": {"retail": 68.00, "telecom": 47.37, "overall": 57.69},
    "ASTRA-32B-Thinking-v1": {"retail": 75.20, "telecom": 52.19, "overall": 63.70},
    "Qwen3-14B": {"retail": 55.00, "telecom": 37.10, "overall": 46.05},
}


def require_inspect_evals() -> None:
    """A clear error where inspect_evals (τ²'s tasks, tools and scorers) is not installed."""
    try:
        import inspect_evals.tau2  # noqa: F401
    except ImportError:
        raise ConfigError(
            "inspect-evals is not installed: `astra-eval tau2` runs its τ² tasks",
            hint="pip install 'astra-harness[tau2]' (inspect-evals==0.26.0)",
        ) from None


def data_version() -> dict[str, str]:
    """What τ²'s tasks and scoring are: the inspect-evals and inspect-ai versions and
    inspect_evals' τ² task version (runs are comparable only when all three agree)."""
    from inspect_evals.metadata import load_eval_metadata

    return {
        "inspect_evals": metadata.version("inspect-evals"),
        "inspect_ai": metadata.version("inspect-ai"),
        "tau2_task_version": str(load_eval_metadata("tau2").version),
    }


def _zero_temperature(value: Any) -> Any:
    """τ² is run at temperature 0 (the paper's setting) unless one is given."""
    if isinstance(value, dict) and "temperature" not in value:
        return {**value, "temperature": 0.0}
    return value


class Tau2Config(RunConfig):
    out: Path = Field(Path("runs/tau2"), description="results directory (checked writable)")
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(temperature=0.0))
    user: ModelConfig | None = Field(
        None, description="the user simulator's endpoint (default: the agent's)"
    )
    domains: list[Domain] = Field(default_factory=lambda: list(PAPER_DOMAINS), min_length=1)
    trials: int = Field(4, ge=1, le=64, description="conversations per task (pass^k up to k)")
    split: Literal["base", "train", "test"] = Field(
        "base",
        description="the split of τ²'s tasks: base (all of them, the paper's) or its train and "
        "test parts (train: conversations to learn from, e.g. as SFT data)",
    )
    tasks: list[str] | None = Field(None, description="only these task ids")
    limit: int | None = Field(None, ge=1, description="only the first N tasks of each domain")
    message_limit: int = Field(
        100, ge=1, description="user-simulator turns per conversation (τ²'s default)"
    )
    max_steps: int = Field(
        200,
        ge=1,
        description="model calls per conversation, the agent's and the simulator's together "
        "(τ²'s own bound is 200 messages); a conversation that reaches it ends, scored as it "
        "stands",
    )
    inspect_log: bool = Field(
        False,
        description="also keep inspect_ai's own log of every conversation under OUT/inspect "
        "(its transcript, store changes included: large, and 2.5x the CPU), for `inspect view`",
    )

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        """Temperature 0 for both endpoints unless given; the user simulator's endpoint is the
        agent's unless its own URL is given (a ``--user-model`` alone names another model
        served there)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        agent = _zero_temperature(data.get("model", {}))
        data["model"] = agent
        user = data.get("user")
        if isinstance(user, dict):
            inherited = {k: agent[k] for k in ("base_url", "api_key") if k in agent}
            data["user"] = _zero_temperature({**inherited, **user})
        return data

    @property
    def user_model(self) -> ModelConfig:
        return self.user or self.model


class Tau2Record(EvalRecord):
    """One conversation: ``id`` is ``domain/task_id/trial``; ``reward`` 1.0 when every check
    of the task passed, ``None`` when the conversation could not be played (an error)."""

    domain: str
    task_id: str
    trial: int
    reward: float | None = None
    explanation: str = ""
    turns: int = 0  # user-simulator messages
    tool_calls: int = 0  # the agent's
    user_tool_calls: int = 0
    # "stop", "transfer", "out_of_scope", "message_limit", "max_steps", "error"
    termination: str = ""
    usage: dict[str, dict[str, int]] = Field(default_factory=dict)
    trajectory: Trajectory | None = None  # the agent's side: policy, user turns, calls, results
    user_side: list[dict[str, Any]] = Field(default_factory=list)  # the simulator's messages


@dataclass(frozen=True)
class Item:
    domain: Domain
    task_id: str
    trial: int

    @property
    def id(self) -> str:
        return f"{self.domain}/{self.task_id}/{self.trial}"


def error_record(item: Item, error: str) -> Tau2Record:
    """A conversation that could not be played or scored (``run`` error: not scored)."""
    return Tau2Record(
        id=item.id, domain=item.domain, task_id=item.task_id, trial=item.trial,
        termination="error", error_kind="run", error=error,
    )  # fmt: skip


# ------------------------------------------------------------------ tasks


def load_task(domain: Domain) -> Task:
    """inspect_evals' τ² task of ``domain``, unshuffled."""
    from inspect_evals.tau2 import tau2

    make = {"retail": tau2.tau2_retail, "telecom": tau2.tau2_telecom, "airline": tau2.tau2_airline}
    return make[domain](shuffle=False)


def split_ids(domain: Domain, split: str) -> list[str]:
    """The task ids of one of τ²'s splits of ``domain`` (its ``split_tasks.json``)."""
    import json

    from inspect_evals.tau2.utils import TAU2_DATA_DIR

    path = TAU2_DATA_DIR / "domains" / domain / "split_tasks.json"
    return [str(i) for i in json.loads(path.read_text(encoding="utf-8"))[split]]


def select_items(cfg: Tau2Config, tasks: dict[Domain, Task]) -> list[Item]:
    """Each selected task × trial, in the data's order; ``--tasks`` naming no task is an
    error that lists what exists."""
    wanted = set(cfg.tasks or [])
    items: list[Item] = []
    found: set[str] = set()
    for domain in cfg.domains:
        ids = [str(s.id) for s in tasks[domain].dataset]
        if cfg.split != "base":
            chosen = set(split_ids(domain, cfg.split))
            ids = [i for i in ids if i in chosen]
        if wanted:
            ids = [i for i in ids if i in wanted]
            found.update(ids)
        if cfg.limit:
            ids = ids[: cfg.limit]
        items += [Item(domain, i, t) for i in ids for t in range(1, cfg.trials + 1)]
    if wanted - found:
        missing = sorted(wanted - found)
        raise ConfigError(
            f"--tasks: {', '.join(map(repr, missing[:5]))} is not a task of "
            f"{', '.join(cfg.domains)} (split {cfg.split})",
            hint="task ids are as τ² names them: retail and airline '0', '1', …; telecom "
            "'[mobile_data_issue]…'",
        )
    return items


# ------------------------------------------------------------------ one conversation's record


def _termination(state: TaskState, failed: bool) -> str:
    from eval.tau2.provider import OVER

    if failed:
        return "error"
    if state.store.get(OVER):
        return "max_steps"
    text = state.output.completion if state.output else ""
    for mark, name in (("###STOP###", "stop"), ("###TRANSFER###", "transfer")):
        if mark in text:
            return name
    return "out_of_scope" if "###OUT-OF-SCOPE###" in text else "message_limit"


def _calls(messages: list[Any]) -> int:
    from inspect_ai.model import ChatMessageAssistant

    return sum(len(m.tool_calls or []) for m in messages if isinstance(m, ChatMessageAssistant))


def _trajectory(agent_messages: list[Any], tools: list[dict[str, Any]], model: str) -> Trajectory:
    from eval.tau2.provider import to_messages

    messages = to_messages(agent_messages)
    return Trajectory(
        model=model,
        messages=messages,
        tools=tools,
        steps=sum(1 for m in messages if m["role"] == "assistant"),
    )


async def _record(item: Item, state: TaskState, score: Any, model: str) -> Tau2Record:
    from inspect_ai.model import ChatMessageAssistant, ChatMessageUser
    from inspect_ai.util import store_as
    from inspect_evals.tau2.common.agents import StoredAgentState
    from inspect_evals.tau2.common.metadata import Tau2MetaData

    from eval.tau2.provider import AGENT_TOOLS, FAILURE, USAGE, to_messages

    meta = Tau2MetaData.model_validate(state.metadata)
    agent = store_as(StoredAgentState, meta.instance)
    failure = state.store.get(FAILURE)
    error = state.store.get(RUN_ERROR)
    usage = state.store.get(USAGE) or {}
    traj = _trajectory(agent.messages, state.store.get(AGENT_TOOLS) or [], model)
    traj.usage = Usage(
        prompt_tokens=usage.get("agent", {}).get("prompt_tokens", 0),
        completion_tokens=usage.get("agent", {}).get("completion_tokens", 0),
    )
    fields: dict[str, Any] = {
        "id": item.id,
        "domain": item.domain,
        "task_id": item.task_id,
        "trial": item.trial,
        "turns": sum(1 for m in state.messages if isinstance(m, ChatMessageAssistant)),
        "tool_calls": _calls(agent.messages),
        "user_tool_calls": _calls(state.messages),
        "termination": _termination(state, failure is not None or error is not None),
        "usage": usage,
        "trajectory": traj,
        # the simulator's own messages (its prompt, replies, tool calls and results); the
        # agent's, which it sees as user turns, are the trajectory's
        "user_side": to_messages([m for m in state.messages if not isinstance(m, ChatMessageUser)]),
    }
    if failure is not None:
        traj.termination, traj.model_failure = "model_error", failure["kind"]
        traj.termination_detail = f"{failure['side']}: {failure['error']}"
        return Tau2Record(
            **fields, error=traj.termination_detail, error_kind="inference",
            endpoint_failure=failure["kind"],
        )  # fmt: skip
    if error is not None:
        traj.termination, traj.termination_detail = "error", error
        return Tau2Record(**fields, error=error, error_kind="run")
    if fields["termination"] in ("message_limit", "max_steps"):
        traj.termination = "max_steps"
    from inspect_ai.scorer import CORRECT

    passed = score.value == CORRECT
    return Tau2Record(**fields, reward=1.0 if passed else 0.0, explanation=score.explanation or "")


RUN_ERROR = "astra_tau2_run_error"  # an exception of the conversation outside τ²'s loop


# ------------------------------------------------------------------ the bridge


class _Bridge:
    """The conversations still to run, played by one inspect_ai eval; each one's record is
    handed to the worker of :func:`run_items` that waits for it."""

    def __init__(self, items: Sequence[Item], model: str) -> None:
        loop = asyncio.get_running_loop()
        self.model = model
        self.futures: dict[str, asyncio.Future[Tau2Record]] = {
            i.id: loop.create_future() for i in items
        }
        self.items = {i.id: i for i in items}

    async def wait(self, item: Item) -> Tau2Record:
        return await self.futures[item.id]

    def deliver(self, rec: Tau2Record) -> None:
        future = self.futures.get(rec.id)
        if future is not None and not future.done():
            future.set_result(rec)

    def end(self, exc: BaseException | None) -> None:
        """The eval is over: a conversation it ended without a record is a run error (or
        the eval's own exception)."""
        for rid, future in self.futures.items():
            if future.done():
                continue
            if isinstance(exc, asyncio.CancelledError):
                future.cancel()
            elif exc is not None:
                future.set_exception(exc)
            else:
                error = "inspect_ai ended the conversation without a score"
                future.set_result(error_record(self.items[rid], error))

    def task(self, domain: Domain, source: Task, items: list[Item], track: bool) -> Task:
        """``source`` (τ²'s task) for ``items``: a sample per conversation (its id is the
        record's), τ²'s solver inside a guard, τ²'s scorer followed by :meth:`deliver`."""
        from inspect_ai import Task
        from inspect_ai.dataset import MemoryDataset
        from inspect_ai.scorer import Score, Target, accuracy, scorer
        from inspect_ai.solver import Generate, solver
        from inspect_ai.util._store import suspend_store_events

        from eval.tau2.provider import FAILURE, SAMPLE

        by_id = {str(s.id): s for s in source.dataset}
        samples = [by_id[i.task_id].model_copy(update={"id": i.id}) for i in items]
        inner_solver = source.solver
        inner_scorer = source.scorer[0] if source.scorer else None
        bridge = self

        @solver
        def guarded() -> Any:
            async def solve(state: TaskState, generate: Generate) -> TaskState:
                state.store.set(SAMPLE, f"tau2:{state.sample_id}")
                try:
                    # inspect_ai diffs the whole store (retail: a 2.6 MB database) at every
                    # step for its transcript, which we do not keep: 2/3 of the CPU of a
                    # conversation. The store itself works as usual.
                    with suspend_store_events() if not track else nullcontext():
                        return await inner_solver(state, generate)
                except Exception as exc:  # recorded as the conversation's error, not scored
                    state.store.set(RUN_ERROR, f"{type(exc).__name__}: {exc}")
                    return state

            return solve

        @scorer(metrics=[accuracy()])
        def recorded() -> Any:
            async def score(state: TaskState, target: Target) -> Score:
                item = bridge.items[str(state.sample_id)]
                result = None
                failed = state.store.get(RUN_ERROR) or state.store.get(FAILURE)
                if not failed and inner_scorer is not None:
                    try:
                        result = await inner_scorer(state, target)
                    except Exception as exc:
                        state.store.set(RUN_ERROR, f"scoring: {type(exc).__name__}: {exc}")
                try:
                    rec = await _record(item, state, result, bridge.model)
                except Exception as exc:
                    rec = error_record(item, f"recording: {type(exc).__name__}: {exc}")
                bridge.deliver(rec)
                return result or Score(value=0, explanation=rec.error or "")

            return score

        return Task(
            dataset=MemoryDataset(samples, name=f"tau2_{domain}"),
            solver=guarded(),
            scorer=recorded(),
            name=f"tau2_{domain}",
        )


async def _play(
    bridge: _Bridge,
    tasks: list[Task],
    agent: ChatModel,
    user: ChatModel,
    cfg: Tau2Config,
) -> None:
    import inspect_ai._util.entrypoints as entrypoints
    from inspect_ai import eval_async
    from inspect_ai.util._display import init_display_type

    from eval.tau2.provider import inspect_model

    init_display_type("none")  # our progress bar, not inspect_ai's
    # At start inspect_ai loads every installed package's inspect_ai entry point (to find
    # hooks): inspect_evals' imports all of its evals, 780 modules and 2 s of a run's start.
    # τ²'s modules are imported directly and our provider registers itself; nothing else is
    # needed.
    entrypoints._inspect_ai_eps_loaded_all = True
    n = cfg.concurrency  # conversations at once: a domain at a time, n of its conversations
    try:
        await eval_async(
            tasks, model=inspect_model(agent, "agent", n, cfg.max_steps),
            model_roles={"user": inspect_model(user, "user", n, cfg.max_steps)},
            log_dir=str(cfg.out / "inspect"), log_samples=cfg.inspect_log, log_realtime=False,
            fail_on_error=False, max_samples=n, max_tasks=1, max_connections=n,
            score_display=False,
        )  # fmt: skip
    except BaseException as exc:
        bridge.end(exc)
        raise
    bridge.end(None)


# ------------------------------------------------------------------ summary


def pass_hat_k(successes: int, trials: int, k: int) -> float:
    """τ-bench's pass^k of one task: the chance that k of its trials drawn without
    replacement all pass, C(c, k) / C(n, k)."""
    return math.comb(successes, k) / math.comb(trials, k) if trials >= k else float("nan")


def _domain(records: list[Tau2Record], trials: int) -> Tau2Domain:
    scored = [r for r in records if r.reward is not None]
    by_task: dict[str, list[float]] = defaultdict(list)
    for r in scored:
        by_task[r.task_id].append(r.reward or 0.0)
    complete = [int(sum(rs)) for rs in by_task.values() if len(rs) == trials]
    pass_k = {}
    if complete:
        for k in range(1, trials + 1):
            mean = sum(pass_hat_k(c, trials, k) for c in complete) / len(complete)
            pass_k[str(k)] = round(mean, 4)
    mean_reward = sum(r.reward or 0.0 for r in scored) / len(scored) if scored else None
    return Tau2Domain(
        tasks=len({r.task_id for r in records}),
        conversations=len(records),
        scored=len(scored),
        errors=len(records) - len(scored),
        mean_reward=None if mean_reward is None else round(mean_reward, 4),
        pass_hat_k=pass_k,
        tasks_with_all_trials=len(complete),
    )


def summarize(records: list[Tau2Record], trials: int) -> Tau2Summary:
    """Per domain: conversations, errors (not scored), the mean reward of the scored ones and
    pass^k over the tasks whose every trial was scored; overall pass^1: the mean of the
    domains' (as the paper's overall)."""
    by_domain: dict[str, list[Tau2Record]] = defaultdict(list)
    for r in records:
        by_domain[r.domain].append(r)
    domains = {d: _domain(rs, trials) for d, rs in sorted(by_domain.items())}
    ones = [d.pass_hat_k.get("1") for d in domains.values()]
    overall = round(sum(ones) / len(ones), 4) if ones and None not in ones else None  # type: ignore[arg-type]
    errors = sum(d.errors or 0 for d in domains.values())
    return Tau2Summary(
        conversations=len(records), errors=errors, trials=trials, overall_pass_1=overall,
        domains=domains,
    )  # fmt: skip


# ------------------------------------------------------------------ the run


async def evaluate_tau2(
    cfg: Tau2Config, progress: ProgressHook[Tau2Record] | None = None
) -> Tau2Summary:
    """Check ``--out`` and both endpoints, play every conversation not yet recorded (or, with
    ``--retry-errors``, recorded as an error), append each record as it ends, write
    summary.json."""
    require_inspect_evals()
    ensure_writable_dir(cfg.out)
    t0 = time.monotonic()
    sources = {d: load_task(d) for d in cfg.domains}
    items = select_items(cfg, sources)
    agent, user = ChatModel(cfg.model), ChatModel(cfg.user_model)
    try:
        served = await agent.check_model()
        user_served = await user.check_model()
        user_fp = model_fingerprint(cfg.user_model, user_served)
        meta = RunMeta(
            kind=NAME,
            fingerprint={
                **model_fingerprint(cfg.model, served),
                "user_simulator": user_fp,
                "data": data_version(),
                "message_limit": cfg.message_limit,
                "max_steps": cfg.max_steps,
            },
            base_url=cfg.model.base_url,
        )
        resume = cfg.resume or cfg.retry_errors
        done = prepare_results_dir(cfg.out, meta, resume, Tau2Record)
        todo = to_run(items, lambda i: i.id, done, cfg.retry_errors)  # what run_items runs
        extra = {"data": meta.fingerprint["data"], "user_simulator": user_fp,
                 "base_url": cfg.model.base_url}  # fmt: skip
        bridge = _Bridge(todo, served)
        by_domain: dict[Domain, list[Item]] = defaultdict(list)
        for i in todo:
            by_domain[i.domain].append(i)
        tasks = [bridge.task(d, sources[d], its, cfg.inspect_log) for d, its in by_domain.items()]
        player = asyncio.create_task(_play(bridge, tasks, agent, user, cfg)) if tasks else None
        try:
            result = await run_items(
                items, lambda i: i.id, bridge.wait, out=cfg.out, done=done,
                concurrency=max(1, len(todo)), retry_errors=cfg.retry_errors,
                max_connection_failures=cfg.max_connection_failures, progress=progress,
            )  # fmt: skip
        except EndpointDied:
            await _stop(player)
            _write(cfg, items, t0, served, extra)  # what is recorded is summarized
            raise
        except BaseException:
            await _stop(player)
            raise
        if player is not None:
            await player
    finally:
        await agent.close()
        await user.close()
    summary = _write(cfg, items, t0, served, extra, result.records)
    refuse_all_failed(result.records, cfg.out)
    return summary


async def _stop(player: asyncio.Task[None] | None) -> None:
    if player is not None:
        player.cancel()
        await asyncio.gather(player, return_exceptions=True)


def _write(
    cfg: Tau2Config,
    items: list[Item],
    t0: float,
    model: str,
    extra: dict[str, Any],
    records: list[Tau2Record] | None = None,
) -> Tau2Summary:
    if records is None:  # the run stopped: what is recorded is summarized
        done = read_results(cfg.out / RESULTS, Tau2Record)
        records = [done[i.id] for i in items if i.id in done]
    figures = summarize(records, cfg.trials).model_copy(update=extra)
    return write_summary(cfg.out, figures, len(records), len(items), model, t0)
