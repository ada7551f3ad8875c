"""Stage 5, interaction: the teacher, as the agent, works each task through the one episode
loop (:func:`~astra_agent.episode.run_episode`), over live MCP servers or simulated tools.

Per task the agent is offered the tools of its chain's servers (``offer="servers"``, every
pool tool of those servers) or the chain's tools alone (``offer="chain"``), under the names
:func:`~astra_agent.mcp_env.assign_names` gives them, and gets the task's question as the
user message. A tool whose server is in ``--mcp-config`` (and started) runs live; the others
are played by the teacher (``--simulate``, see :mod:`training.synth.tools.environments`) or,
without it, left out of the offer (a chain tool left out rejects the task). A share of the
calls (``--failure-rate``, 0.2 as in the paper) fails on purpose, seeded per task and call
index, so that trajectories show recovery. Calls run one after another (the simulator sees
every earlier result; the injected calls are the same in every run).

Output (``OUT``): ``interactions.jsonl``, one :class:`~astra_agent.trajectory.Trajectory`
per kept episode (id: the task's id) with ``metadata`` {``task``, ``chain``, ``task_mode``,
``tools`` (pool ids), ``chain_names`` (as offered), ``environment`` (live / simulated /
mixed), ``simulated`` (the tools the teacher played), ``injected_failures``
(:class:`~training.synth.tools.environments.InjectedFailure`), ``failure_rate``, ``seed``,
``provenance``}; ``rejections.jsonl``: ``unknown_tool`` (a chain tool not in the pool),
``server_unavailable`` (a chain tool that can neither run live nor be simulated),
``episode_limit`` (ended at ``max_steps``/``max_tokens``/``max_time``/``length``),
``episode_error`` (``empty_reply``, ``undecodable``, a model error that is not the
endpoint's), ``no_tool_call``, ``off_chain`` (no call of a chain tool),
``simulate_tool:<problem>`` (the teacher could not play a tool; raw reply kept). An endpoint
that fails (unreachable, 5xx, 429) is never data: the task stays undone for ``--resume``.
``stats.json`` (:class:`InteractStats`): environments, calls by status, injected failures and
recoveries, agent and simulator tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from astra_agent.episode import EpisodeLimits, run_episode
from astra_agent.errors import ServerError
from astra_agent.mcp_config import load_mcp_config
from astra_agent.mcp_env import MCPEnvironment, assign_names
from astra_agent.model import ChatModel, DeltaHook, EndpointError, Model, ModelTurn
from astra_agent.trajectory import Trajectory
from training.synth.inputs import read_stage_output
from training.synth.runner import (
    StageContext,
    TeacherStage,
    TeacherStageConfig,
    TeacherStageStats,
    run_teacher_stage,
)
from training.synth.stage import (
    Progress,
    Rejection,
    StageRun,
    UnitOutcome,
    tally,
)
from training.synth.teacher import Teacher, TokenCount, count_usage
from training.synth.tools.environments import (
    SIMULATE,
    FailureInjection,
    InjectedFailure,
    Route,
    TaskTools,
)
from training.synth.tools.pool import PoolInputs, ToolRecord, not_in_pool, read_tools
from training.synth.tools.tasks import TASKS_FILE, TaskRecord

STAGE = "interact"
INTERACTIONS_FILE = "interactions.jsonl"
AGENT = "agent"  # the token account of the teacher acting as the agent
LIMITS = ("max_steps", "max_tokens", "max_time", "length")
EnvironmentKind = Literal["live", "simulated", "mixed"]


class InteractConfig(TeacherStageConfig):
    """``astra-train synth interact``."""

    tasks: list[Path] = Field(
        min_length=1, description="`synth tasks` outputs or JSONL files (repeatable)"
    )
    pool: PoolInputs
    mcp_config: Path | None = Field(None, description="mcpServers config: these servers run live")
    simulate: bool = Field(False, description="the teacher plays the tools that cannot run live")
    offer: Literal["servers", "chain"] = Field(
        "servers", description="tools offered: servers (all of the chain's) or chain"
    )
    failure_rate: float = Field(0.2, ge=0, le=1, description="share of calls made to fail")
    seed: int = Field(0, description="seed of the injected failures")
    max_steps: int = Field(16, ge=1, description="model calls per episode")
    max_time_s: float | None = Field(None, gt=0)
    tool_timeout_s: float = Field(120.0, gt=0, description="a live call (a simulated one: more)")
    max_tool_output_chars: int = Field(20_000, ge=200)
    history_chars: int = Field(2_000, ge=100, description="of each earlier result, simulating")
    system_prompt: str | None = None

    @model_validator(mode="after")
    def _tools_somewhere(self) -> InteractConfig:
        if self.mcp_config is None and not self.simulate:
            raise ValueError("give mcp_config (live servers), simulate, or both")
        return self


class InteractStats(TeacherStageStats):
    tasks: int = 0
    trajectories: int = 0
    by_environment: dict[str, int] = Field(default_factory=dict)
    calls: int = 0  # tool calls in the kept trajectories
    by_status: dict[str, int] = Field(default_factory=dict)
    injected: int = 0
    recovered: int = 0  # injected failures followed by a success of the same tool
    mean_steps: float = 0.0
    servers_live: list[str] = Field(default_factory=list)
    servers_failed: dict[str, str] = Field(default_factory=dict)

    def summary(self) -> list[tuple[str, Any]]:
        rows: list[tuple[str, Any]] = [("tasks", self.tasks), ("trajectories", self.trajectories)]
        rows += [(f"  {kind}", n) for kind, n in self.by_environment.items()]
        rows += [("tool calls", self.calls)]
        rows += [(f"  {status}", n) for status, n in self.by_status.items()]
        return [*rows, ("injected failures (recovered)", f"{self.injected} ({self.recovered})")]

    def warning(self) -> str | None:
        return None if self.trajectories else "no trajectory was kept"


# ------------------------------------------------------------------ the agent


class _Agent(Model):
    """The teacher as the agent: counts its tokens (``agent``) and keeps its endpoint's
    failure (the loop turns it into ``model_error``; the stage decides what it means)."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        self.failure: ServerError | None = None

    @property
    def name(self) -> str:
        return self.inner.name

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        on_delta: DeltaHook | None = None,
    ) -> ModelTurn:
        try:
            turn = await self.inner.complete(messages, tools, on_delta)
        except ServerError as exc:
            self.failure = exc
            raise
        count = TokenCount(
            prompt_tokens=turn.prompt_tokens, completion_tokens=turn.completion_tokens, calls=1
        )
        count_usage(AGENT, count)
        return turn

    async def close(self) -> None:
        return None


def endpoint_failed(exc: ServerError | None) -> bool:
    """Is this the endpoint failing (retry the task later), not the episode's own fault?"""
    if not isinstance(exc, EndpointError):
        return False
    if exc.kind in ("unreachable", "timeout", "dropped"):
        return True
    code = exc.status_code or 0
    return exc.kind == "status" and (code == 429 or code >= 500)


# ------------------------------------------------------------------ the stage


def _metadata_failures(traj: Trajectory, failures: list[InjectedFailure]) -> list[dict[str, Any]]:
    """The injected failures with their event index and whether the tool later succeeded."""
    reached = [i for i, e in enumerate(traj.events) if e.status in ("ok", "tool_error", "timeout")]
    out = []
    for f in failures:
        event = reached[f.call] if f.call < len(reached) else None
        later = traj.events[event + 1 :] if event is not None else []
        ok = any(e.name == f.tool and e.status == "ok" for e in later)
        out.append(f.model_copy(update={"event": event, "recovered": ok}).model_dump(mode="json"))
    return out


class InteractStage:
    """The per-task work; the live environment and the models are the run's."""

    def __init__(
        self,
        cfg: InteractConfig,
        ctx: StageContext[Trajectory],
        pool: dict[str, ToolRecord],
        simulator: Teacher | None,
        live: MCPEnvironment | None,
    ) -> None:
        self.cfg, self.ctx, self.pool, self.agent = cfg, ctx, pool, ctx.model
        self.simulator, self.live = simulator, live
        self.live_names = {v: k for k, v in live.routes().items()} if live is not None else {}
        self.by_server: dict[str, list[ToolRecord]] = {}
        for tool in pool.values():
            self.by_server.setdefault(tool.server, []).append(tool)

    def _reject(self, task: TaskRecord, reason: str, detail: str = "", **kw: Any) -> Rejection:
        return Rejection(stage=STAGE, source=task.chain, id=task.id, reason=reason,
                         detail=detail, **kw)  # fmt: skip

    def routes(self, task: TaskRecord) -> tuple[dict[str, Route], list[str]]:
        """The offer (public name → route) and the chain tools that cannot be offered."""
        if self.cfg.offer == "chain":
            offered = [self.pool[t] for t in task.tools]
        else:
            servers = dict.fromkeys(self.pool[t].server for t in task.tools)
            offered = [r for s in servers for r in self.by_server[s]]
        runnable = [r for r in offered
                    if (r.server, r.name) in self.live_names or self.cfg.simulate]  # fmt: skip
        ids = {r.id for r in runnable}
        missing = [t for t in task.tools if t not in ids]
        grouped: dict[str, list[ToolRecord]] = {}
        for r in runnable:
            grouped.setdefault(r.server, []).append(r)
        routes = {}
        for public, where in assign_names(grouped).items():
            record = self.pool[f"{where.server}/{where.tool}"]
            routes[public] = Route(record, self.live_names.get((where.server, where.tool)))
        return routes, missing

    def _limits(self, routes: dict[str, Route]) -> EpisodeLimits:
        timeout = self.cfg.tool_timeout_s
        if any(r.live is None for r in routes.values()) and self.simulator is not None:
            model = self.simulator.model
            request = model.config.request_timeout_s if isinstance(model, ChatModel) else 600.0
            timeout += request * self.simulator.config.max_attempts
        return EpisodeLimits(
            max_steps=self.cfg.max_steps,
            max_time_s=self.cfg.max_time_s,
            tool_timeout_s=timeout,
            max_tool_output_chars=self.cfg.max_tool_output_chars,
            parallel_tool_calls=False,
        )

    async def process(self, key: str, task: TaskRecord) -> UnitOutcome[Trajectory]:
        if why := not_in_pool(task.tools, self.pool):
            return UnitOutcome(rejections=[self._reject(task, "unknown_tool", why)])
        routes, missing = self.routes(task)
        if missing:
            why = f"neither live nor simulated (pass --simulate): {', '.join(missing)}"
            return UnitOutcome(rejections=[self._reject(task, "server_unavailable", why)])
        tools = TaskTools(
            routes, simulator=self.simulator, live=self.live, history_chars=self.cfg.history_chars
        )
        env = FailureInjection(tools, rate=self.cfg.failure_rate, seed=self.cfg.seed, key=task.id)
        agent = _Agent(self.agent)
        messages = [{"role": "user", "content": task.question}]
        if self.cfg.system_prompt:
            messages.insert(0, {"role": "system", "content": self.cfg.system_prompt})
        traj = await run_episode(
            agent, env, messages, limits=self._limits(routes), trajectory=Trajectory(id=task.id)
        )
        if tools.fault is not None:
            raise tools.fault  # a bug of ours (a template, a schema): never data
        for failure in (agent.failure, tools.endpoint_error):
            if failure is not None and endpoint_failed(failure):
                raise failure  # not data: the task stays undone for --resume
        rejection = self._verdict(task, traj, tools, routes)
        if rejection is not None:
            return UnitOutcome(rejections=[rejection])
        traj.metadata = self._metadata(task, traj, tools, env, routes)
        return UnitOutcome([traj])

    def _verdict(
        self, task: TaskRecord, traj: Trajectory, tools: TaskTools, routes: dict[str, Route]
    ) -> Rejection | None:
        raw = traj.final_answer or None
        if tools.rejected is not None:
            exc = tools.rejected
            return self._reject(task, exc.code, exc.detail, raw=exc.raw_text)
        if tools.endpoint_error is not None:
            detail = f"simulating a tool: {tools.endpoint_error.message}"
            return self._reject(task, "episode_error", detail, raw=raw)
        if traj.termination != "stop":
            reason = "episode_limit" if traj.termination in LIMITS else "episode_error"
            detail = f"{traj.termination}: {traj.termination_detail}".rstrip(": ")
            return self._reject(task, reason, detail, raw=raw)
        if not traj.events:
            return self._reject(task, "no_tool_call", "the agent answered without a call", raw=raw)
        chain = set(_chain_names(task, routes))
        if not any(e.name in chain for e in traj.events):
            called = ", ".join(dict.fromkeys(e.name for e in traj.events))
            return self._reject(task, "off_chain", f"called {called}; the chain: "
                                f"{', '.join(_chain_names(task, routes))}", raw=raw)  # fmt: skip
        return None

    def _metadata(
        self,
        task: TaskRecord,
        traj: Trajectory,
        tools: TaskTools,
        env: FailureInjection,
        routes: dict[str, Route],
    ) -> dict[str, Any]:
        simulated = [n for n, r in routes.items() if r.live is None]
        kind: EnvironmentKind = (
            "live" if not simulated else "simulated" if len(simulated) == len(routes) else "mixed"
        )
        prompts = {SIMULATE: self.simulator.prompt(SIMULATE).ref} if self.simulator else {}
        provenance = self.ctx.provenance(
            [task.id],
            prompts=prompts if tools.simulated_calls else {},
            detail={"environment": kind, "simulated_calls": tools.simulated_calls},
        )
        return {
            "task": task.id,
            "chain": task.chain,
            "task_mode": task.mode,
            "tools": list(task.tools),
            "chain_names": _chain_names(task, routes),
            "environment": kind,
            "simulated": simulated,
            "injected_failures": _metadata_failures(traj, env.failures),
            "failure_rate": self.cfg.failure_rate,
            "seed": self.cfg.seed,
            "provenance": provenance.model_dump(mode="json"),
        }


def _chain_names(task: TaskRecord, routes: dict[str, Route]) -> list[str]:
    by_id = {r.record.id: name for name, r in routes.items()}
    return [by_id[t] for t in task.tools if t in by_id]


# ------------------------------------------------------------------ the run


async def _start_live(path: Path, servers: dict[str, Any]) -> MCPEnvironment | None:
    env = MCPEnvironment(load_mcp_config(path))
    try:
        await env.start()
    except ServerError as exc:  # every server failed
        servers["servers_failed"] = dict(env.failures) or {"*": str(exc)}
        return None
    servers["servers_failed"] = dict(env.failures)
    servers["servers_live"] = sorted({server for server, _ in env.routes().values()})
    return env


async def synth_interact(cfg: InteractConfig, progress: Progress | None = None) -> InteractStats:
    """Episodes for the tasks of ``cfg.tasks`` (this shard's) into ``cfg.out``."""
    tasks = read_stage_output(
        cfg.tasks, TaskRecord, stage=STAGE, producer="tasks", file=TASKS_FILE,
        duplicate="duplicate_task",
    )  # fmt: skip
    pool, pool_files = read_tools(cfg.pool, STAGE)
    selected = [(t.id, t) for _, t in tasks.records if cfg.holds(t.id)]
    extra = [cfg.mcp_config] if cfg.mcp_config is not None else []
    servers: dict[str, Any] = {}  # live and failed, for the stats

    async def start(ctx: StageContext[Trajectory]) -> Any:
        simulator = None
        if cfg.simulate:  # the teacher plays the tools on a model of its own
            simulator_model = ChatModel(cfg.model, recover_calls=False)
            ctx.closers.append(simulator_model.close)
            simulator = Teacher(simulator_model, cfg.teacher)
        live = None
        if cfg.mcp_config is not None and any(not ctx.run.done(k) for k, _ in selected):
            live = await _start_live(cfg.mcp_config, servers)
            if live is not None:
                ctx.closers.insert(0, live.close)
        return InteractStage(cfg, ctx, pool, simulator, live).process

    def count(stats: InteractStats, run: StageRun[Trajectory], order: list[str]) -> None:
        _count(stats, run, order)
        for name, value in servers.items():
            setattr(stats, name, value)

    spec = TeacherStage(
        name=STAGE, units=selected, inputs=[*tasks.files, *pool_files, *extra],
        prompts=(SIMULATE,) if cfg.simulate else (), output=INTERACTIONS_FILE,
        record=Trajectory, stats=InteractStats, start=start, count=count,
        rejected=tasks.rejected, stats_fields={"tasks": len(selected)}, agent=True,
    )  # fmt: skip
    return await run_teacher_stage(cfg, spec, progress)


def _count(stats: InteractStats, run: StageRun[Trajectory], order: Sequence[str]) -> None:
    records = [r for unit in order for r in run.records(unit)]
    stats.trajectories = len(records)
    stats.by_environment = tally(str(r.metadata.get("environment", "")) for r in records)
    stats.by_status = dict(sum((Counter(r.counts()) for r in records), Counter()))
    failures = [f for r in records for f in r.metadata.get("injected_failures", [])]
    stats.injected = len(failures)
    stats.recovered = sum(bool(f.get("recovered")) for f in failures)
    stats.calls = sum(len(r.events) for r in records)
    stats.mean_steps = round(sum(r.steps for r in records) / len(records), 3) if records else 0.0
