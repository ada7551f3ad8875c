"""Stage B.6–B.7, arenas: the environments of ``synth env-code`` as ASTRA-RL arena records,
with distractors, validated in the sandbox and split into train and held-out files.

For each environment (one unit), in the format of :mod:`astra_agent.arena` (what
``astra-eval arenas`` and RL read):

``prompt``
    the main question as one user message;
``tool_schema`` / ``tool_dict``
    the environment's tools and ``near`` + ``far`` distractors
    (:mod:`training.synth.envs.distract`: BM25 bands over the tools of the *other*
    environments of the same split, so that no held-out tool, and none of its answers, is
    ever offered in training), sorted by name, each with its source;
``sub_qa_dict``
    per tool, the answers of the sub-questions it serves (a merged tool has several: the
    arena reward counts it solved when its output holds one of them);
``reference``
    the reference chain: per sub-question, in dependency order, ``name`` and ``arguments``
    (plus ``subquestion`` and ``answer``);

and ``task_id`` (the record id), ``domain``, ``answer`` (the final answer), ``split`` and
``provenance``. A record is kept only when it loads without a problem
(:func:`~astra_agent.arena.parse_record`), every tool (distractors too) loads in the sandbox,
the reference chain solves every sub-question there, and no answer is reachable without the
task nor any tool code misbehaves (:func:`eval.arenas.checks.task_findings`: blind calls,
refused operations, threads left, output beyond the sandbox's cap) — what ``astra-eval arenas
validate`` checks; otherwise it is rejected as ``invalid_arena`` with the problems.

The split is by record id: the ``round(heldout × N)`` ids (at least one when ``heldout`` > 0
and N ≥ 2) of the lowest ``sha256("<seed>:<id>")`` go to held-out. Output (``OUT``):
``arenas.jsonl`` (every record), ``train.jsonl``, ``heldout.jsonl``, ``rejections.jsonl``,
``stats.json`` (:class:`ArenaStats`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.arena import ArenaEnvironment, parse_record
from astra_agent.sandbox import SandboxLimits
from eval.arenas.checks import task_findings
from training.synth.envs.code import ENVS_FILE, EnvRecord
from training.synth.envs.code import STAGE as ENV_CODE_STAGE
from training.synth.envs.distract import DistractorIndex, Entry, Pick
from training.synth.envs.sandboxed import EnvTool, cut, require_sandbox
from training.synth.inputs import read_stage_output
from training.synth.runner import StageConfig
from training.synth.stage import (
    Progress,
    Provenance,
    Rejection,
    StageStats,
    UnitOutcome,
    open_run,
    provenance,
    run_units,
    tally,
)

STAGE = "arenas"
ARENAS_FILE = "arenas.jsonl"
TRAIN_FILE = "train.jsonl"
HELDOUT_FILE = "heldout.jsonl"
Split = Literal["train", "heldout"]


class ArenaConfig(StageConfig):
    """``astra-train synth arenas``."""

    KNOBS = StageConfig.KNOBS | {"concurrency"}

    envs: list[Path] = Field(
        min_length=1, description="`synth env-code` outputs or JSONL files (repeatable)"
    )
    near: int = Field(2, ge=0, description="distractors from the near band")
    far: int = Field(1, ge=0, description="distractors from the far band")
    near_pool: int = Field(10, ge=1, description="the near band: this many best-ranked")
    far_ratio: float = Field(0.0, ge=0, le=1, description="the far band: score ≤ this × best")
    heldout: float = Field(0.1, ge=0, lt=1, description="share of the records held out")
    seed: int = Field(0, description="seed of the split and the draws")
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    concurrency: int = Field(4, ge=1, description="records validated at once")


class ArenaRecordOut(BaseModel):
    """One arena record (ASTRA-RL's four fields and ours)."""

    model_config = ConfigDict(extra="forbid")

    prompt: list[dict[str, str]]
    tool_schema: str  # JSON: OpenAI function schemas
    tool_dict: str  # JSON: name → source
    sub_qa_dict: str  # JSON: name → answers
    task_id: str
    domain: str
    reference: list[dict[str, Any]]
    answer: str = ""
    split: Split
    provenance: Provenance


class ArenaStats(StageStats):
    environments: int = 0
    train: int = 0
    heldout: int = 0
    distractors: dict[str, int] = Field(default_factory=dict)  # by band
    short_of_distractors: int = 0  # records offered fewer than near + far
    tools_offered: dict[str, int] = Field(default_factory=dict)  # tools per record → records

    def summary(self) -> list[tuple[str, Any]]:
        rows: list[tuple[str, Any]] = [
            ("environments", self.environments),
            ("arena records", self.records),
            ("  train.jsonl", self.train),
            ("  heldout.jsonl", self.heldout),
        ]
        rows += [(f"distractors, {band} band", n) for band, n in self.distractors.items()]
        return [*rows, ("records short of distractors", self.short_of_distractors)]

    def warning(self) -> str | None:
        return None if self.records else "no arena record was kept"


def heldout_ids(ids: Sequence[str], fraction: float, seed: int) -> set[str]:
    """The held-out ids (see the module): the same for the same ids, fraction and seed."""
    if fraction <= 0 or len(ids) < 2:
        return set()
    k = min(len(ids) - 1, max(1, round(fraction * len(ids))))
    ranked = sorted(ids, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
    return set(ranked[:k])


def _entry(record: str, tool: EnvTool) -> Entry:
    return Entry(record, tool.name, f"{tool.name} {tool.description}")


def arena_record(
    env: EnvRecord, distractors: Sequence[EnvTool], split: Split, provenance: Provenance
) -> ArenaRecordOut:
    """The arena record of ``env`` with ``distractors`` offered beside its tools."""
    tools = sorted([*env.tools, *distractors], key=lambda t: t.name)
    sub_qa: dict[str, list[str]] = {}
    for s in env.steps:
        answers = sub_qa.setdefault(s.tool, [])
        if s.answer not in answers:
            answers.append(s.answer)
    reference = [
        {"name": s.tool, "arguments": s.arguments, "subquestion": s.subquestion,
         "answer": s.answer}
        for s in env.steps
    ]  # fmt: skip
    return ArenaRecordOut(
        prompt=[{"role": "user", "content": env.question}],
        tool_schema=json.dumps([t.spec().to_openai() for t in tools], ensure_ascii=False),
        tool_dict=json.dumps({t.name: t.source for t in tools}, ensure_ascii=False),
        sub_qa_dict=json.dumps(sub_qa, ensure_ascii=False),
        task_id=env.id,
        domain=env.domain,
        reference=reference,
        answer=env.answer,
        split=split,
        provenance=provenance,
    )


async def arena_problem(record: ArenaRecordOut, limits: SandboxLimits) -> str | None:
    """What ``astra-eval arenas validate`` would find wrong with ``record``, or None."""
    task, problems = parse_record(record.model_dump(mode="json"), 0)
    if problems or task is None:
        return "; ".join(f"{p.field}: {p.message}" for p in problems)
    async with ArenaEnvironment(task, limits) as env:
        found = await task_findings(task, env, limits.output_cap_chars)
    return "; ".join(cut(f, 600) for f in found) or None


class ArenaStage:
    def __init__(self, cfg: ArenaConfig, envs: Sequence[EnvRecord], run_id: str) -> None:
        self.cfg, self.run_id = cfg, run_id
        self.held = heldout_ids([e.id for e in envs], cfg.heldout, cfg.seed)
        self.tools = {(e.id, t.name): t for e in envs for t in e.tools}
        self.index: dict[Split, DistractorIndex] = {
            split: DistractorIndex([_entry(e.id, t) for e in envs for t in e.tools
                                    if self.split(e.id) == split])
            for split in ("train", "heldout")
        }  # fmt: skip

    def split(self, rid: str) -> Split:
        return "heldout" if rid in self.held else "train"

    def distractors(self, env: EnvRecord) -> list[Pick]:
        c = self.cfg
        return self.index[self.split(env.id)].choose(
            env.id, [_entry(env.id, t) for t in env.tools], near=c.near, far=c.far,
            seed=c.seed, near_pool=c.near_pool, far_ratio=c.far_ratio,
        )  # fmt: skip

    async def process(self, key: str, env: EnvRecord) -> UnitOutcome[ArenaRecordOut]:
        picks = self.distractors(env)
        prov = provenance(
            STAGE,
            self.run_id,
            [env.id],
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            detail={
                "split": self.split(env.id),
                "distractors": [{"name": p.entry.name, "record": p.entry.record,
                                 "band": p.band, "score": p.score} for p in picks],
            },
        )  # fmt: skip
        others = [self.tools[(p.entry.record, p.entry.name)] for p in picks]
        record = arena_record(env, others, self.split(env.id), prov)
        problem = await arena_problem(record, self.cfg.sandbox)
        if problem is not None:
            reject = Rejection(stage=STAGE, source=env.id, id=env.id, reason="invalid_arena",
                               detail=problem)  # fmt: skip
            return UnitOutcome(rejections=[reject])
        return UnitOutcome([record])


async def build_arenas(cfg: ArenaConfig, progress: Progress | None = None) -> ArenaStats:
    """Arena records of the environments of ``cfg.envs`` (this shard's) into ``cfg.out``."""
    require_sandbox()
    got = read_stage_output(
        cfg.envs, EnvRecord, stage=STAGE, producer=ENV_CODE_STAGE, file=ENVS_FILE,
        duplicate="duplicate_record",
    )  # fmt: skip
    envs, rejected = [e for _, e in got.records], got.rejected
    selected = [e for e in envs if cfg.holds(e.id)]
    run, stats = open_run(
        cfg.out, STAGE, output=ARENAS_FILE, record_type=ArenaRecordOut, stats=ArenaStats,
        inputs=got.files, params=cfg.params(), overwrite=cfg.overwrite,
        resume=cfg.resume, extra_outputs=(TRAIN_FILE, HELDOUT_FILE),
        environments=len(selected),
    )  # fmt: skip
    if run.complete:
        return stats
    stage = ArenaStage(cfg, envs, run.fingerprint)
    await run_units(
        run, [(e.id, e) for e in selected], stage.process, concurrency=cfg.concurrency,
        progress=progress,
    )  # fmt: skip
    order = [e.id for e in selected]
    kept = [r for unit in order for r in run.records(unit)]
    stats.train = sum(r.split == "train" for r in kept)
    stats.heldout = sum(r.split == "heldout" for r in kept)
    picks = [r.provenance.detail.get("distractors", []) for r in kept]
    stats.distractors = tally(p["band"] for ps in picks for p in ps)
    stats.short_of_distractors = sum(len(ps) < cfg.near + cfg.far for ps in picks)
    stats.tools_offered = tally((str(len(json.loads(r.tool_schema))) for r in kept), int)
    extra = {
        TRAIN_FILE: [r for r in kept if r.split == "train"],
        HELDOUT_FILE: [r for r in kept if r.split == "heldout"],
    }
    return run.finish(stats, order, rejections=rejected, extra=extra)
