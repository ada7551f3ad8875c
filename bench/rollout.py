"""Benchmark: arena rollouts through the one loop — pooled sandboxes vs a fresh sandbox per
episode, 64 concurrent vs one at a time (issue 13).

A step is group size 8 × 32 prompts: the 24 training arenas (``eval/arenas/data/train.jsonl``),
cycled, each record padded with distractor tools (OpenAI schemas and plausible Python
sources: a data table, argument checks, filtering) to the published ASTRA-RL-1k size —
schemas 25–90k characters, sources 38–145k, spread over the prompts. Every episode replays
its task's reference chain (2–5 calls, then an answer) through ``run_episode`` against the
scripted OpenAI-compatible server in its own process, 50 ms per reply; every episode must
solve its task (``unsolved`` counts those that did not).

Printed: a sandbox's start and reset time at the published size (against an unpadded record);
per configuration, episodes/s, the mean episode, the time in the environment (setup —
acquire or start —, tool calls, give back or close) and the share of episode wall time spent
outside the model (the loop's ``model_s`` against the episode's wall time, setup included).
Configurations: pooled (``training.rl.pool.SandboxPool``, sized to hold a step's sandboxes;
step 1 fills it, later steps reuse) and a fresh ``ArenaEnvironment`` per episode, each 64
concurrent and one at a time (the first 64 episodes of a step: 8 prompts × their group).

Targets: outside the model < 5 % of rollout time at 50 ms per reply; 64 concurrent ≥ 20× the
one-at-a-time rate.

    .venv/bin/python bench/rollout.py            # ≈2-3 min on 2 cores
    .venv/bin/python bench/rollout.py --quick    # a smoke run: 8 prompts × 4, 16 concurrent
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from astra_agent.arena import ArenaEnvironment, ArenaTask, load_arena_file, trajectory_reward
from astra_agent.environment import ToolSpec
from astra_agent.episode import run_episode
from astra_agent.model import ChatModel, ModelConfig
from astra_agent.sandbox import Sandbox
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from eval.arenas import DATA_DIR, replay_script
from training.rl.pool import PoolStats, SandboxPool

TRAIN = DATA_DIR / "train.jsonl"

# ------------------------------------------------------------------ distractor tools

# Published ASTRA-RL-1k records: 25–90k characters of schemas, 38–145k of tool source.
SCHEMA_CHARS = (25_000, 90_000)
SOURCE_CHARS = (38_000, 145_000)

_NOUNS = (
    "invoice", "shipment", "ticket", "reservation", "employee", "warehouse", "sensor",
    "policy", "subscription", "vehicle", "patient", "course", "contract", "parcel", "meter",
    "playlist", "recipe", "listing", "device", "order", "account", "claim", "route", "asset",
    "campaign", "lease", "permit", "vendor", "budget", "forecast", "appointment", "voucher",
)  # fmt: skip
_VERBS = {
    "get": "Look up one {noun} by its id and return its stored fields",
    "list": "List the {nouns} that match the filters, newest first",
    "search": "Full-text search over {noun} records; returns the best matches with a score",
    "count": "Count the {nouns} that match the filters, grouped by status",
    "summarize": "Totals and averages over the {nouns} of a region and period",
    "validate": "Check a {noun} record against the business rules and list every violation",
    "estimate": "Estimate the cost of a {noun} from historical records of the same region",
    "archive": "Mark a {noun} as archived (it stays readable but leaves the active lists)",
}
_PARAMS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("region", {"type": "string", "enum": ["north", "south", "east", "west", "central"],
                "description": "Sales region the records belong to"}),
    ("status", {"type": "string", "enum": ["open", "pending", "closed", "on_hold"],
                "description": "Only records in this workflow status"}),
    ("start_date", {"type": "string", "description": "First day of the period, YYYY-MM-DD"}),
    ("end_date", {"type": "string", "description": "Last day of the period, YYYY-MM-DD "
                  "(inclusive); defaults to today"}),
    ("limit", {"type": "integer", "description": "At most this many results (1-100)"}),
    ("min_amount", {"type": "number", "description": "Smallest amount to include, in EUR"}),
    ("currency", {"type": "string", "description": "ISO 4217 code of the amounts returned, "
                  "e.g. 'EUR' or 'USD'"}),
    ("include_archived", {"type": "boolean", "description": "Also return archived records"}),
    ("sort_by", {"type": "string", "enum": ["date", "amount", "name"],
                 "description": "Sort key of the results"}),
    ("owner", {"type": "string", "description": "Full name of the responsible person"}),
)  # fmt: skip
_DEFAULTS = {"string": "''", "integer": "10", "number": "0.0", "boolean": "False"}
_CHECKS = {"string": "str", "integer": "int", "number": "(int, float)", "boolean": "bool"}

_BODY = '''

def {name}({signature}):
    """{description}."""
    args = {{{fields}}}
    kinds = {{{kinds}}}
    for field, value in args.items():
        if value is not None and not isinstance(value, kinds[field]):
            raise TypeError(f"{{field}} has the wrong type: {{type(value).__name__}}")
    rows = [r for r in {table} if args["{key}"] in (r["id"], "")]
    for field in ("region", "status"):
        if args.get(field):
            rows = [r for r in rows if r[field] == args[field]]
    rows.sort(key=lambda r: (r["date"], r["amount"]), reverse=True)
    total = sum(r["amount"] for r in rows)
    return {{"{noun}_count": len(rows), "total": _money(total), "items": rows[:10]}}
'''
_HELPERS = """def _money(cents):
    return "%d.%02d" % (cents // 100, cents % 100)

"""


def _plural(noun: str) -> str:
    return noun[:-1] + "ies" if noun.endswith("y") else noun + "s"


def _row(rng: random.Random, prefix: str, i: int) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{1000 + i}",
        "region": rng.choice(_PARAMS[0][1]["enum"]),
        "status": rng.choice(_PARAMS[1][1]["enum"]),
        "date": f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "amount": rng.randint(500, 990_000),
        "owner": rng.choice(["Ana Silva", "Kenji Mori", "Lena Vogt", "Omar Haddad"]),
    }


def _distractor_schema(rng: random.Random, name: str, verb: str, noun: str) -> ToolSpec:
    key = f"{noun}_id"
    props: dict[str, Any] = {
        key: {
            "type": "string",
            "description": f"Identifier of the {noun}, e.g. "
            f"'{noun[:3].upper()}-1042'; empty for all",
        }
    }
    for pname, pschema in rng.sample(_PARAMS, rng.randint(3, 7)):
        props[pname] = dict(pschema)
    description = (
        _VERBS[verb].format(noun=noun, nouns=_plural(noun))
        + f". Part of the {noun} management API; results are "
        "read from the system of record at call time, so repeated calls may differ. "
        f"Requires the {key} for single-record operations."
    )
    params = {"type": "object", "properties": props, "required": [key]}
    return ToolSpec(name=name, description=description, parameters=params)


def _distractor_source(rng: random.Random, spec: ToolSpec, noun: str, chars: int) -> str:
    """A plausible implementation of ``spec``: a data table (sized to make the source about
    ``chars`` long), argument checks, filtering, a summary."""
    props = spec.parameters["properties"]
    key = next(iter(props))
    optional = [p for p in props if p != key]
    signature = ", ".join([key, *(f"{p}={_DEFAULTS[props[p]['type']]}" for p in optional)])
    table = f"_{spec.name.upper()}_ROWS"
    body = _BODY.format(
        name=spec.name,
        signature=signature,
        description=spec.description.split(".")[0],
        fields=", ".join(f"{p!r}: {p}" for p in props),
        kinds=", ".join(f"{p!r}: {_CHECKS[props[p]['type']]}" for p in props),
        table=table,
        key=key,
        noun=noun,
    )
    prefix = noun[:3].upper()
    rows: list[dict[str, Any]] = []
    size = len(_HELPERS) + len(body) + len(table) + 8
    while size < chars or len(rows) < 2:
        rows.append(_row(rng, prefix, len(rows)))
        size += len(repr(rows[-1])) + 6
    listing = ",\n    ".join(repr(r) for r in rows)
    return f"{_HELPERS}{table} = [\n    {listing},\n]\n{body}"


def schema_chars(tools: list[ToolSpec]) -> int:
    """The length of a record's ``tool_schema`` field (JSON of the OpenAI schemas)."""
    return len(json.dumps([t.to_openai() for t in tools]))


def pad_task(task: ArenaTask, seed: int, schemas: int, sources: int) -> ArenaTask:
    """``task`` with distractor tools added (schemas and plausible Python sources) until its
    record holds about ``schemas`` characters of tool schema and ``sources`` of tool source;
    the targets, gold answers and reference chain stay the task's. Deterministic in ``seed``."""
    rng = random.Random(seed)
    tools, code = list(task.tools), dict(task.sources)
    added: list[tuple[ToolSpec, str]] = []
    while schema_chars(tools) < schemas:
        verb, noun = rng.choice(sorted(_VERBS)), rng.choice(_NOUNS)
        name = f"{verb}_{_plural(noun)}" if verb in ("list", "count") else f"{verb}_{noun}"
        while name in code or any(t.name == name for t in tools):
            name += f"_{rng.choice(['v2', 'ext', 'batch', 'legacy', 'detailed'])}"
        spec = _distractor_schema(rng, name, verb, noun)
        tools.append(spec)
        code[name] = ""
        added.append((spec, noun))
    per_tool = max(0, sources - sum(map(len, task.sources.values()))) // max(1, len(added))
    for spec, noun in added:
        code[spec.name] = _distractor_source(rng, spec, noun, per_tool)
    rng.shuffle(tools)  # targets among the distractors, as in the published records
    return replace(task, task_id=f"{task.task_id}+pad{seed}", tools=tools, sources=code)


def published_size(frac: float) -> tuple[int, int]:
    """(schema chars, source chars) at ``frac`` ∈ [0, 1] of the published ranges."""
    lo_s, hi_s = SCHEMA_CHARS
    lo_c, hi_c = SOURCE_CHARS
    return int(lo_s + frac * (hi_s - lo_s)), int(lo_c + frac * (hi_c - lo_c))


# ------------------------------------------------------------------ the scripted model


def serve(delay_s: float) -> None:
    """Run in a child process: the scripted server replaying every training task's reference
    chain, ``delay_s`` per reply, until stdin closes. Prints its base URL first."""
    script = replay_script(load_arena_file(TRAIN).tasks)

    def delayed(req: dict[str, Any]) -> Reply:
        return replace(script(req), delay_s=delay_s)

    with ScriptedServer(delayed) as srv:
        print(srv.base_url, flush=True)
        sys.stdin.read()


@contextlib.contextmanager
def scripted_server(delay_s: float) -> Iterator[tuple[str, int]]:
    """The replay server in its own process (as a real endpoint would be): (URL, pid)."""
    cmd = [sys.executable, __file__, "--serve", "--delay", str(delay_s)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"the scripted server did not start (said {url!r})")
        yield url, proc.pid
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------ rollouts

_TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu() -> dict[int, float]:
    """CPU seconds (own and reaped children's) of every live descendant of this process."""
    parent, cpu = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(stat.parent.name)
        parent[pid] = int(fields[1])
        cpu[pid] = sum(int(x) for x in fields[11:15]) / _TICK
    me, out = os.getpid(), {}
    for pid in cpu:
        p = pid
        while p in parent and p not in (me, 0, 1):
            p = parent[p]
        if p == me and pid != me:
            out[pid] = cpu[pid]
    return out


@dataclass(frozen=True)
class Cpu:
    """CPU seconds so far: this process, the model server, the sandboxes (the rest)."""

    host: float
    server: float
    sandboxes: float

    @classmethod
    def now(cls, server_pid: int) -> Cpu:
        tree = _tree_cpu()
        server = tree.pop(server_pid, 0.0)
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        return cls(
            time.process_time(), server, sum(tree.values()) + reaped.ru_utime + reaped.ru_stime
        )

    def __sub__(self, other: Cpu) -> Cpu:
        return Cpu(
            self.host - other.host, self.server - other.server, self.sandboxes - other.sandboxes
        )


OpenEnv = Callable[[ArenaTask], contextlib.AbstractAsyncContextManager[ArenaEnvironment]]


@dataclass(frozen=True)
class Episode:
    wall_s: float  # from asking for the environment to giving it back
    model_s: float  # waiting for the model's replies (the loop's own timing)
    env_s: float  # environment: setup (acquire or start), tool calls, give back (or close)
    solved: bool


@dataclass
class Run:
    name: str
    wall_s: float
    cpu: Cpu  # used meanwhile by this process (the loop, the HTTP client), server, sandboxes
    episodes: list[Episode] = field(default_factory=list)
    spawned: int = 0
    reused: int = 0
    closes_sandboxes: bool = False

    @property
    def rate(self) -> float:
        return len(self.episodes) / self.wall_s

    def share(self, part: Callable[[Episode], float]) -> float:
        return sum(map(part, self.episodes)) / sum(e.wall_s for e in self.episodes)

    @property
    def outside(self) -> float:
        """The share of episode wall time not spent waiting for the model."""
        return 1 - self.share(lambda e: e.model_s)

    def cpu_per_episode(self) -> float:
        return (self.cpu.host + self.cpu.server + self.cpu.sandboxes) / len(self.episodes)

    def _sandbox_cpu(self) -> str:
        """Measured on live sandboxes only: a closed one's CPU time is lost with it (its
        outer bubblewrap is killed, so nobody reaps the processes inside into our account)."""
        if self.closes_sandboxes:
            return "n/a"
        return f"{1e3 * self.cpu.sandboxes / len(self.episodes):.1f}"

    def row(self) -> str:
        n = len(self.episodes)
        mean = 1e3 * sum(e.wall_s for e in self.episodes) / n
        env = 1e3 * sum(e.env_s for e in self.episodes) / n
        return (
            f"| {self.name} | {n} | {self.wall_s:.1f} | {self.rate:.1f} | {mean:.0f} | "
            f"{env:.1f} | {100 * self.share(lambda e: e.env_s):.1f} % | "
            f"{100 * self.outside:.1f} % | {1e3 * self.cpu.host / n:.1f} / "
            f"{1e3 * self.cpu.server / n:.1f} / {self._sandbox_cpu()} | "
            f"{self.spawned} / {self.reused} | {sum(not e.solved for e in self.episodes)} |"
        )


async def _episode(model: ChatModel, task: ArenaTask, open_env: OpenEnv) -> Episode:
    t0 = time.perf_counter()
    async with open_env(task) as env:
        t1 = time.perf_counter()
        assert not env.sandbox.load_errors, env.sandbox.load_errors
        traj = await run_episode(model, env, task.prompt)
        t2 = time.perf_counter()
    wall = time.perf_counter() - t0
    env_s = (t1 - t0) + traj.timings.tools_s + (time.perf_counter() - t2)
    solved = trajectory_reward(task, traj).fully_solved and traj.termination == "stop"
    return Episode(wall, traj.timings.model_s, env_s, solved)


async def rollouts(
    name: str,
    model: ChatModel,
    tasks: list[ArenaTask],
    concurrency: int,
    open_env: OpenEnv,
    server_pid: int,
    pool: SandboxPool | None = None,
) -> Run:
    """Every task once (in order), at most ``concurrency`` episodes at a time."""
    sem = asyncio.Semaphore(concurrency)
    before = pool.stats if pool else PoolStats()

    async def one(task: ArenaTask) -> Episode:
        async with sem:
            return await _episode(model, task, open_env)

    cpu, t0 = Cpu.now(server_pid), time.perf_counter()
    done = await asyncio.gather(*(one(t) for t in tasks))
    if pool:  # the step is over when its sandboxes are ready again
        await pool.wait_resets()
    run = Run(name, time.perf_counter() - t0, Cpu.now(server_pid) - cpu, list(done))
    after = pool.stats if pool else PoolStats(spawned=len(tasks))
    run.spawned, run.reused = after.spawned - before.spawned, after.reused - before.reused
    run.closes_sandboxes = pool is None
    return run


def merge(name: str, runs: list[Run]) -> Run:
    cpu = Cpu(*(sum(getattr(r.cpu, f) for r in runs) for f in ("host", "server", "sandboxes")))
    out = Run(name, sum(r.wall_s for r in runs), cpu)
    for r in runs:
        out.episodes += r.episodes
        out.spawned += r.spawned
        out.reused += r.reused
    return out


# ------------------------------------------------------------------ the benchmark


def padded_tasks(prompts: int) -> list[ArenaTask]:
    """``prompts`` records (the training tasks, cycled), sizes spread over the published
    ranges (shuffled, so that size does not follow the order)."""
    train = load_arena_file(TRAIN).tasks
    fracs = [i / max(1, prompts - 1) for i in range(prompts)]
    random.Random(0).shuffle(fracs)
    return [pad_task(train[i % len(train)], i, *published_size(f)) for i, f in enumerate(fracs)]


async def sandbox_costs(tasks: list[ArenaTask], starts: int, resets: int) -> list[str]:
    """Start and reset times (p50, ms) of a sandbox for the given records."""
    rows = []
    for label, task in tasks_by_size(tasks):
        start_t, reset_t = [], []
        for _ in range(starts):
            t0 = time.perf_counter()
            sb = Sandbox(task.sources)
            await sb.start()
            start_t.append(time.perf_counter() - t0)
            if len(start_t) < starts:
                await sb.close()
        for _ in range(resets):
            t0 = time.perf_counter()
            await sb.reset()
            reset_t.append(time.perf_counter() - t0)
        await sb.close()
        rows.append(
            f"| {label} | {len(task.tools)} | {schema_chars(task.tools):,} | "
            f"{sum(map(len, task.sources.values())):,} | {_p50(start_t):.1f} | "
            f"{_p50(reset_t):.1f} |"
        )
    return rows


def tasks_by_size(tasks: list[ArenaTask]) -> list[tuple[str, ArenaTask]]:
    size = sorted(tasks, key=lambda t: schema_chars(t.tools))
    train = load_arena_file(TRAIN).tasks[0]
    return [
        (f"unpadded ({train.task_id})", train),
        ("smallest padded record", size[0]),
        ("median padded record", size[len(size) // 2]),
        ("largest padded record", size[-1]),
    ]


def _p50(xs: list[float]) -> float:
    return 1e3 * statistics.median(xs)


async def bench(args: argparse.Namespace) -> None:
    tasks = padded_tasks(args.prompts)
    batch = [t for t in tasks for _ in range(args.group)]  # a step: each prompt's group
    print(
        f"{args.prompts} prompts × group {args.group} = {len(batch)} episodes per step; "
        f"schemas {min(schema_chars(t.tools) for t in tasks):,}–"
        f"{max(schema_chars(t.tools) for t in tasks):,} characters, sources "
        f"{min(sum(map(len, t.sources.values())) for t in tasks):,}–"
        f"{max(sum(map(len, t.sources.values())) for t in tasks):,}; "
        f"{args.delay * 1e3:.0f} ms per model reply\n"
    )
    costs = await sandbox_costs(tasks, args.starts, args.resets)
    print("| record | tools | schema chars | source chars | start p50 ms | reset p50 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    print("\n".join(costs) + "\n")
    seq = batch[: args.sequential]
    with scripted_server(args.delay) as (url, pid):
        model = ChatModel(ModelConfig(base_url=url, model="scripted", temperature=0.0))
        try:
            runs = await _configurations(args, model, batch, seq, pid)
        finally:
            await model.close()
    _report(args, runs)


async def _configurations(
    args: argparse.Namespace,
    model: ChatModel,
    batch: list[ArenaTask],
    seq: list[ArenaTask],
    pid: int,
) -> dict[str, Run]:
    conc = args.concurrency
    fresh: OpenEnv = ArenaEnvironment
    async with SandboxPool(max_idle=args.max_idle or len(batch)) as pool:
        await _episode(model, batch[0], fresh)  # the HTTP connection, imports: not timed
        steps = []
        for i in range(args.steps):
            name = f"step {i + 1}"
            step = await rollouts(name, model, batch, conc, pool.environment, pid, pool)
            steps.append(step)
        runs = {"cold": merge(f"pooled, {conc} concurrent, step 1 (cold pool)", steps[:1])}
        if len(steps) > 1:
            name = f"pooled, {conc} concurrent, steps 2–{len(steps)} (warm pool)"
            runs["warm"] = merge(name, steps[1:])
        name = "pooled, one at a time (warm pool)"
        runs["seq"] = await rollouts(name, model, seq, 1, pool.environment, pid, pool)
        stats = pool.stats
    name = f"fresh sandbox per episode, {conc} concurrent"
    runs["fresh"] = await rollouts(name, model, batch, conc, fresh, pid)
    name = "fresh sandbox per episode, one at a time"
    runs["fresh_seq"] = await rollouts(name, model, seq, 1, fresh, pid)
    print(
        f"pool: {stats.spawned} spawned (mean {stats.mean_spawn_ms:.0f} ms), {stats.reused} "
        f"reused, {stats.resets} resets (mean {stats.mean_reset_ms:.1f} ms, in the background), "
        f"{stats.evicted} evicted, {stats.reset_failures} reset failures, peak idle ≤ "
        f"{args.max_idle or len(batch)}\n"
    )
    return runs


def _report(args: argparse.Namespace, runs: dict[str, Run]) -> None:
    print(
        "| configuration | episodes | wall s | episodes/s | mean episode ms | "
        "environment ms/ep | in the environment | outside the model | "
        "CPU ms/ep: host / server / sandboxes | "
        "spawned / reused | unsolved |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs.values():
        print(run.row())
    pooled = runs.get("warm", runs["cold"])
    seq, fresh, fresh_seq = runs["seq"], runs["fresh"], runs["fresh_seq"]
    speedup = pooled.rate / seq.rate
    print(
        f"\npooled vs fresh per episode: {pooled.rate / fresh.rate:.2f}x at {args.concurrency} "
        f"concurrent, {seq.rate / fresh_seq.rate:.2f}x one at a time"
    )
    print(
        f"{args.concurrency} concurrent vs one at a time: pooled {speedup:.1f}x, fresh "
        f"{fresh.rate / fresh_seq.rate:.1f}x; target ≥ 20x: {_verdict(speedup >= 20)}"
    )
    worst = max(pooled.outside, seq.outside)
    print(
        f"outside the model (pooled): {100 * pooled.outside:.1f} % concurrent, "
        f"{100 * seq.outside:.1f} % one at a time (fresh: {100 * fresh.outside:.1f} % / "
        f"{100 * fresh_seq.outside:.1f} %); target < 5 %: {_verdict(worst < 0.05)}"
    )
    env = [100 * r.share(lambda e: e.env_s) for r in (pooled, seq, fresh, fresh_seq)]
    print(
        f"of which in the environment (setup, tool calls, give back): pooled {env[0]:.1f} % / "
        f"{env[1]:.1f} %, fresh {env[2]:.1f} % / {env[3]:.1f} %"
    )
    cores = len(os.sched_getaffinity(0))
    ceiling = cores / pooled.cpu_per_episode()
    print(
        f"CPU-bound ceiling (pooled, warm): {1e3 * pooled.cpu_per_episode():.1f} CPU ms per "
        f"episode on {cores} cores = {ceiling:.0f} episodes/s = {ceiling / seq.rate:.1f}x the "
        "one-at-a-time rate; load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    )


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3, help="pooled steps (the first is cold)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--sequential", type=int, default=64, help="episodes run one at a time")
    ap.add_argument("--delay", type=float, default=0.05, help="seconds per model reply")
    ap.add_argument("--max-idle", type=int, default=0, help="pool bound (0: one batch)")
    ap.add_argument("--starts", type=int, default=5, help="sandbox starts per record size")
    ap.add_argument("--resets", type=int, default=30, help="resets per record size")
    ap.add_argument("--quick", action="store_true", help="a smoke run (≈30 s)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.delay)
        return
    if args.quick:
        args.prompts, args.group, args.steps, args.sequential = 8, 4, 2, 8
        args.starts, args.resets, args.concurrency = 2, 5, min(args.concurrency, 16)
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
