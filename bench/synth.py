"""Benchmark: the tool-chain half of the synthesis pipeline — ``synth tasks`` → ``synth
interact`` → ``synth judge`` — 64 units at a time against one at a time (issue #10).

The world: a generated pool of 300 tools on 60 servers (5 each, varied descriptions and
schemas, a third with an output schema) and 500 distinct chains of 2–4 of them over one or two
servers. The stages run in this process through their library functions (``synth_tasks``,
``synth_interact``, ``synth_judge``: what the CLI calls), one mode per chain (``diverse``: one
question, hence one trajectory, per chain), tools simulated by the teacher, injected failures
at the default rate (0.2). The teacher is the scripted teacher
(``training.testing:script``) served by ``astra_agent.testing.scripted_server`` in its
own process with 50 ms added to every reply — the agent's steps, the simulated tools, the
question writer and both judges alike — so that its CPU is not counted as the pipeline's.

Measured per configuration: trajectories judged per second over the three stages' wall time,
each stage's wall time, the teacher's replies, and CPU: this process's ``time.process_time()``
(the pipeline: prompts, parsing, the loop, HTTP client, journals) and the server's (from
/proc), per trajectory. The one-at-a-time baseline runs on the first ``--sequential`` chains
(50 by default: 500 would take ≈5 min, ≈10 replies of ≈56 ms per trajectory), in the same run,
after an untimed warm-up (imports, the BFCL decontamination index, connections; the index's
build time is printed on its own). Also measured in the same run, to tell the pipeline from
its HTTP client: the CPU per reply of ``ChatModel.complete`` alone (the stages' client) and
of a bare ``aiohttp`` POST, 64 at a time, on a short prompt (``bench/client.py`` measures the
client on its own).

Targets: 64 at a time ≥ 30× the one-at-a-time rate; the pipeline's own CPU < 10 ms per
trajectory, 64 at a time (issue 18: the throughput configuration).

    .venv/bin/python bench/synth.py             # ≈1-2 min on 2 cores
    .venv/bin/python bench/synth.py --quick     # a smoke run: 64 chains, 16 one at a time
    .venv/bin/python bench/synth.py --profile   # where the pipeline's CPU goes (64 at a time;
                                                # its CPU figures then include the profiler)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import itertools
import os
import pstats
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import cpu_per_reply

from astra_agent.testing.scripted_server import in_subprocess
from training.synth.stage import StageStats
from training.synth.tools.chains import ToolChain
from training.synth.tools.interact import InteractConfig, synth_interact
from training.synth.tools.judge import JudgeConfig, JudgeStats, synth_judge
from training.synth.tools.pool import ToolRecord
from training.synth.tools.tasks import TasksConfig, bfcl_index, synth_tasks

MODEL = "scripted-teacher"
REPO = Path(__file__).resolve().parents[1]
_TICK = os.sysconf("SC_CLK_TCK")

# ------------------------------------------------------------------ the world

_VERBS = (
    "fetch", "list", "summarize", "validate", "estimate", "archive", "rank", "merge", "audit",
    "schedule", "reconcile", "forecast", "tag", "export", "flag", "price", "route", "inspect",
    "renew", "assign",
)  # fmt: skip
_ADJECTIVES = (
    "overdue", "regional", "pending", "archived", "weekly", "priority", "draft", "shared",
    "external", "seasonal", "disputed", "recurring", "flagged", "trial", "bulk", "unpaid",
)  # fmt: skip
_NOUNS = (
    "invoice", "shipment", "ticket", "reservation", "employee", "warehouse", "sensor", "policy",
    "subscription", "vehicle", "patient", "course", "contract", "parcel", "meter", "playlist",
    "recipe", "listing", "device", "order", "account", "claim", "route", "asset", "campaign",
    "lease", "permit", "vendor", "budget", "voucher",
)  # fmt: skip
_PLACES = (
    "branch office", "customer portal", "billing ledger", "partner network", "field team",
    "support queue", "audit trail", "quarterly report", "loyalty programme", "night shift",
)  # fmt: skip


def make_pool(servers: int, per_server: int, seed: int = 0) -> list[ToolRecord]:
    """``servers × per_server`` tools, each with a distinct first sentence (what the scripted
    teacher builds questions from) and a small schema."""
    rng = random.Random(seed)
    combos = list(itertools.product(_VERBS, _ADJECTIVES, _NOUNS, _PLACES))
    rng.shuffle(combos)
    tools = []
    for k, (verb, adj, noun, place) in enumerate(combos[: servers * per_server]):
        server = f"srv{k // per_server:02d}"
        name = f"{verb}_{adj}_{noun}_{k % per_server}"
        props: dict[str, Any] = {
            f"{noun}_id": {"type": "string", "description": f"Identifier of the {noun}"},
            "limit": {"type": "integer", "description": "At most this many results"},
        }
        if k % 2:
            props["region"] = {"type": "string", "enum": ["north", "south", "east", "west"]}
        output = None
        if k % 3 == 0:
            output = {
                "type": "object",
                "properties": {"id": {"type": "string"}, "status": {"type": "string"},
                               "total": {"type": "number"}, f"{noun}_count": {"type": "integer"}},
                "required": ["id", "status"],
            }  # fmt: skip
        tools.append(
            ToolRecord(
                id=f"{server}/{name}", server=server, name=name, domain="bench",
                description=f"{verb.capitalize()} the {adj} {noun} records of the {place}. "
                f"Reads the system of record at call time.",
                input_schema={"type": "object", "properties": props,
                              "required": [f"{noun}_id"]},
                output_schema=output,
            )
        )  # fmt: skip
    return tools


def make_chains(tools: list[ToolRecord], count: int, seed: int = 0) -> list[ToolChain]:
    """``count`` distinct chains of 2-4 tools over one or two servers."""
    rng = random.Random(seed)
    by_server: dict[str, list[ToolRecord]] = {}
    for t in tools:
        by_server.setdefault(t.server, []).append(t)
    servers = sorted(by_server)
    seen: set[tuple[str, ...]] = set()
    chains: list[ToolChain] = []
    while len(chains) < count:
        picked = rng.sample(servers, rng.choice((1, 2)))
        offered = [t for s in picked for t in by_server[s]]
        ids = tuple(t.id for t in rng.sample(offered, rng.randint(2, 4)))
        if ids in seen:
            continue
        seen.add(ids)
        edges = [f"{a}->{b}" for a, b in itertools.pairwise(ids)]
        chains.append(
            ToolChain(
                id=f"chain-{len(chains):04d}", tools=list(ids), edges=edges,
                scores=[0.8] * len(edges), score=0.8 ** len(edges),
                servers=sorted({i.split("/")[0] for i in ids}), domain="bench",
            )
        )  # fmt: skip
    return chains


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(r.model_dump_json() + "\n" for r in records))
    return path


# ------------------------------------------------------------------ the teacher's process


def teacher_server(delay_s: float) -> contextlib.AbstractContextManager[tuple[str, int]]:
    """The scripted teacher in its own process, ``delay_s`` per reply: (base URL, pid)."""
    script = "training.testing:script"
    return in_subprocess(script, model=MODEL, delay_s=delay_s, cwd=str(REPO))


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


# ------------------------------------------------------------------ the runs


@dataclass(frozen=True)
class Stage:
    name: str
    wall_s: float
    cpu_s: float
    replies: int  # the teacher's (calls in the stage's token accounting)
    records: int
    rejections: dict[str, int]


@dataclass
class Run:
    name: str
    chains: int
    concurrency: int
    server_cpu_s: float = 0.0
    stages: list[Stage] = field(default_factory=list)
    trajectories: int = 0  # judged (the judge's input)
    kept: int = 0

    @property
    def wall_s(self) -> float:
        return sum(s.wall_s for s in self.stages)

    @property
    def rate(self) -> float:
        return self.trajectories / self.wall_s

    @property
    def cpu_ms(self) -> float:
        """The pipeline's CPU per trajectory."""
        return 1e3 * sum(s.cpu_s for s in self.stages) / self.trajectories

    @property
    def replies(self) -> int:
        return sum(s.replies for s in self.stages)

    def row(self) -> str:
        n = self.trajectories
        per_stage = " / ".join(f"{s.wall_s:.1f}" for s in self.stages)
        cpu_stage = " / ".join(f"{1e3 * s.cpu_s / n:.1f}" for s in self.stages)
        return (
            f"| {self.name} | {self.chains} | {n} ({self.kept}) | {self.replies} "
            f"({self.replies / n:.1f}) | {self.wall_s:.1f} | {per_stage} | {self.rate:.2f} | "
            f"{self.cpu_ms:.1f} ({cpu_stage}) | {1e3 * self.server_cpu_s / n:.1f} |"
        )


async def _timed(
    name: str, call: Callable[[], Awaitable[StageStats]], pid: int
) -> tuple[Stage, StageStats, float]:
    server0, cpu0, t0 = process_cpu(pid), time.process_time(), time.perf_counter()
    stats = await call()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    replies = sum(t.calls for t in getattr(stats, "tokens", {}).values())
    stage = Stage(name, wall, cpu, replies, stats.records, stats.rejections)
    return stage, stats, process_cpu(pid) - server0


async def pipeline(
    name: str, chains: Path, pool: Path, out: Path, url: str, pid: int, concurrency: int
) -> Run:
    """tasks → interact → judge on ``chains`` into ``out``, ``concurrency`` units at a time."""
    model = {"base_url": url, "model": MODEL}
    n = sum(1 for _ in chains.open())
    run = Run(name, n, concurrency)
    tasks_cfg = TasksConfig(chains=[chains], pool=[pool], out=out / "tasks", model=model,
                            modes=["diverse"], concurrency=concurrency)  # fmt: skip
    interact_cfg = InteractConfig(tasks=[tasks_cfg.out], pool=[pool], out=out / "interact",
                                  model=model, simulate=True, concurrency=concurrency)  # fmt: skip
    judge_cfg = JudgeConfig(interactions=[interact_cfg.out], out=out / "judge", model=model,
                            concurrency=concurrency)  # fmt: skip
    calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("tasks", lambda: synth_tasks(tasks_cfg)),
        ("interact", lambda: synth_interact(interact_cfg)),
        ("judge", lambda: synth_judge(judge_cfg)),
    ]
    for stage_name, call in calls:
        stage, stats, server_cpu = await _timed(stage_name, call, pid)
        run.stages.append(stage)
        run.server_cpu_s += server_cpu
        if isinstance(stats, JudgeStats):
            run.trajectories, run.kept = stats.trajectories, stats.kept
    return run


_PROMPT = [{"role": "user", "content": "[astra-synth:trajectory_judge.v1]\nCalls (JSON, in "
            'order): [{"name": "a", "ok": true}]'}]  # fmt: skip


async def client_cost(url: str, calls: int, concurrency: int) -> tuple[float, float]:
    """The HTTP client alone, for comparison: CPU ms of this process per reply to a short
    prompt (the same server and delay), through ``ChatModel.complete`` (the stages' client)
    and through a bare ``aiohttp`` POST + ``json.loads`` (what the
    transport itself costs)."""
    import json

    import aiohttp

    from astra_agent.model import ChatModel, ModelConfig

    async def measured(one: Callable[[], Awaitable[Any]]) -> float:
        await one()  # the connection, imports
        return await cpu_per_reply(one, calls, concurrency)

    model = ChatModel(ModelConfig(base_url=url, model=MODEL))
    try:
        sdk = await measured(lambda: model.complete(_PROMPT))
    finally:
        await model.close()
    body = json.dumps({"model": MODEL, "messages": _PROMPT})
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:

        async def post() -> Any:
            async with session.post(f"{url}/chat/completions", data=body, headers=headers) as r:
                return json.loads(await r.read())

        bare = await measured(post)
    return sdk, bare


def bench(args: argparse.Namespace) -> None:
    cores = len(os.sched_getaffinity(0))
    print(
        f"{args.chains} chains (one question each), {args.servers} servers × {args.per_server} "
        f"tools, {1e3 * args.delay:.0f} ms per teacher reply; {cores} cores, load average "
        + " ".join(f"{x:.1f}" for x in os.getloadavg())
    )
    t0 = time.perf_counter()
    bfcl_index(0.5, 3)
    print(f"BFCL decontamination index (once per process): {time.perf_counter() - t0:.2f} s\n")
    with tempfile.TemporaryDirectory(prefix="bench-synth-") as tmp:
        root = Path(tmp)
        tools = make_pool(args.servers, args.per_server)
        chains = make_chains(tools, args.chains)
        pool = write_jsonl(root / "pool.jsonl", tools)
        every = write_jsonl(root / "chains.jsonl", chains)
        first = write_jsonl(root / "chains-seq.jsonl", chains[: args.sequential])
        warm = write_jsonl(root / "chains-warm.jsonl", chains[-8:])
        prof = cProfile.Profile() if args.profile else None
        with teacher_server(args.delay) as (url, pid):
            conc = args.concurrency
            asyncio.run(pipeline("warm-up", warm, pool, root / "warm", url, pid, 8))
            if prof is not None:
                prof.enable()
            concurrent = asyncio.run(
                pipeline(f"{conc} at a time", every, pool, root / "conc", url, pid, conc)
            )
            if prof is not None:
                prof.disable()
            sequential = asyncio.run(
                pipeline("one at a time", first, pool, root / "seq", url, pid, 1)
            )
            runs = [concurrent, sequential]
            client = asyncio.run(client_cost(url, 10 * args.sequential, args.concurrency))
    report(args, runs, client)
    if prof is not None:
        top(prof)


def report(args: argparse.Namespace, runs: list[Run], client: tuple[float, float]) -> None:
    print(
        "| configuration | chains | trajectories (kept) | teacher replies (per trajectory) | "
        "wall s | tasks / interact / judge s | trajectories/s | pipeline CPU ms/trajectory "
        "(tasks / interact / judge) | server CPU ms/trajectory |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        print(run.row())
    for run in runs:
        left = "; ".join(f"{s.name} {s.rejections}" for s in run.stages if s.rejections)
        print(f"rejected, {run.name}: {left or 'nothing'}")
    conc, seq = runs
    speedup = conc.rate / seq.rate
    per_reply = seq.wall_s / seq.replies
    print(
        f"\n{conc.name} vs one at a time: {speedup:.1f}x; target ≥ 30x: {_verdict(speedup >= 30)}"
        f" (the one-at-a-time run waits {1e3 * per_reply:.0f} ms per teacher reply, "
        f"{1e3 * args.delay:.0f} ms of it the delay)"
    )
    print(
        f"pipeline CPU per trajectory: {conc.cpu_ms:.1f} ms {conc.name} (target < 10 ms: "
        f"{_verdict(conc.cpu_ms < 10)}), {seq.cpu_ms:.1f} ms one at a time (each lone request "
        "wakes the event loop and the server alone)"
    )
    per = conc.replies / conc.trajectories
    print(
        f"the HTTP client alone, {args.concurrency} at a time (a short prompt, measured here): "
        f"ChatModel.complete {client[0]:.2f} ms per reply × {per:.1f} replies = "
        f"{client[0] * per:.1f} ms per trajectory; a bare aiohttp POST {client[1]:.2f} ms "
        f"per reply = {client[1] * per:.1f} ms"
    )
    cores = len(os.sched_getaffinity(0))
    both = conc.cpu_ms + 1e3 * conc.server_cpu_s / conc.trajectories
    ceiling = 1e3 * cores / both
    ideal = args.concurrency / (seq.wall_s / seq.trajectories)
    print(
        f"CPU-bound ceiling ({conc.name}, pipeline + teacher server): {both:.1f} CPU ms per "
        f"trajectory on {cores} cores = {ceiling:.0f} trajectories/s = "
        f"{ceiling / seq.rate:.0f}x one at a time; the delay alone allows {ideal:.0f}/s "
        f"({ideal / seq.rate:.0f}x); load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    )


def top(prof: cProfile.Profile, n: int = 25) -> None:
    """Own time by package (where the CPU goes), then the top functions."""
    stats = pstats.Stats(prof)
    by: dict[str, float] = {}
    for (path, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        by[_package(path)] = by.get(_package(path), 0.0) + tottime
    total = sum(by.values())
    print(f"\nprofile of the concurrent run: own time by package ({total:.2f} s profiled)")
    for name, t in sorted(by.items(), key=lambda kv: -kv[1])[:n]:
        print(f"  {100 * t / total:5.1f} %  {t:6.2f} s  {name}")
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(n)
        text = buf.getvalue()
        print(f"\nprofile of the concurrent run, by {key}:\n" + text[text.find("   ncalls") :])


def _package(path: str) -> str:
    """``openai``, ``training/synth/tools/interact.py``, ``stdlib json``, ``builtins``."""
    if path.startswith("~") or path.startswith("<"):
        return "builtins (C)"
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if path.startswith(str(REPO)):
        return str(Path(path).relative_to(REPO))
    parts = Path(path).parts
    lib = parts.index("lib") if "lib" in parts else -1
    return f"stdlib {parts[lib + 2].removesuffix('.py')}" if 0 <= lib < len(parts) - 2 else path


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--chains", type=int, default=500)
    ap.add_argument("--sequential", type=int, default=50, help="chains run one at a time")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--delay", type=float, default=0.05, help="seconds per teacher reply")
    ap.add_argument("--servers", type=int, default=60)
    ap.add_argument("--per-server", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="cProfile the concurrent run")
    ap.add_argument("--quick", action="store_true", help="a smoke run (≈30 s)")
    args = ap.parse_args()
    if args.quick:
        args.chains, args.sequential = 64, 16
    bench(args)


if __name__ == "__main__":
    main()
