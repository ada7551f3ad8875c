"""Stage 3b, the teacher's checks on the tool chains: a vote, then a back-translation.

Per chain, in this order (a chain that fails one is not asked the next):

vote
    ``votes`` teacher calls (``prompts/chain_vote.v1.jinja``: the tools in call order with
    their descriptions) answer ``{"sensible": bool, "reason": "…"}`` — is this a task a real
    user would want done? The chain is kept when the share of yes votes is at least
    ``vote_threshold`` (0.5). The default is one vote; with ``votes`` = k > 1 the k calls are
    sampled at the teacher's temperature (``--temperature``; at 0 they would be k copies) and
    the threshold makes it a majority (k = 3: two yes; an even k's tie is kept at 0.5);
back-translation
    the teacher writes a request for the chain with the ``tasks`` stage's own template
    (``tasks.v1``, mode ``diverse``); then a second call sees only that request and the tools
    of the chain's servers in the pool — the chain's and, as distractors, the others of those
    servers (at most ``max_offered`` tools in all, drawn and shuffled with
    ``Random(f"{seed}:{chain id}")``, named as ``synth interact`` names them) — and must name
    the tools to call in order (``prompts/back_translate.v1.jinja``). The chain is kept only
    if the predicted sequence *equals* the chain: the same tools, in the same order, none
    added or missing. A chain whose order the request cannot pin down is dropped.

Input: ``synth chains`` directories (or ``chains.jsonl`` files) and the ``synth pool`` the
chains' tools come from. Output (``OUT``): a chains directory that ``synth tasks --chains``
reads as it is — ``chains.jsonl``, the kept :class:`~training.synth.tools.chains.ToolChain`
records (their provenance this stage's: the votes, the request and the prediction in
``detail``, the sampler's provenance under ``detail.sampled``); ``rejections.jsonl``:
``vote_no`` (the votes and their reasons), ``back_translation_mismatch`` (predicted and
expected, the request; raw kept), ``chain_vote:<problem>`` / ``tasks:<problem>`` /
``back_translate:<problem>`` (no usable reply in ``max_attempts`` tries; raw kept),
``unknown_tool``, ``duplicate_chain``, ``not_json`` / ``bad_record``; ``stats.json``
(:class:`CheckStats`, ``stage: chains`` so that later stages take the directory for chains,
``check: check-chains``; kept share, votes, teacher tokens by prompt).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from training.synth.runner import (
    StageContext,
    TeacherStage,
    TeacherStageConfig,
    TeacherStageStats,
    gather,
    run_teacher_stage,
)
from training.synth.stage import (
    Progress,
    Rejection,
    StageRun,
    UnitOutcome,
    check_out,
    tally,
)
from training.synth.teacher import Answer, TeacherRejected
from training.synth.text import cut_text
from training.synth.tools.chains import CHAINS_FILE, ChainStats, Question, ToolChain, read_chains
from training.synth.tools.chains import STAGE as CHAINS_STAGE
from training.synth.tools.pool import PoolInputs, ToolRecord, not_in_pool, read_tools, tool_view

STAGE = "check-chains"
VOTE, BACK, GENERATE = "chain_vote", "back_translate", "tasks"  # the prompt templates
PROMPTS = (VOTE, GENERATE, BACK)


class ChainVote(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sensible: bool
    reason: str = Field("", max_length=2000)


class Predicted(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tools: list[str] = Field(max_length=64)
    reason: str = Field("", max_length=2000)


class CheckChainsConfig(TeacherStageConfig):
    """``astra-train synth check-chains``."""

    chains: list[Path] = Field(
        min_length=1, description="`synth chains` outputs or JSONL files (repeatable)"
    )
    pool: PoolInputs
    votes: int = Field(1, ge=1, le=15, description="teacher votes per chain")
    vote_threshold: float = Field(0.5, gt=0, le=1, description="share of yes votes to keep")
    back_translate: bool = Field(True, description="check that a request maps back to the chain")
    max_offered: int = Field(32, ge=2, le=256, description="tools offered to back-translate")
    seed: int = Field(0, description="seed of the distractors' draw")


class CheckStats(ChainStats, TeacherStageStats):
    """``stats.json``: a chains run's (over the kept chains) and the checks' counts."""

    check: str = STAGE
    checked: int = 0  # chains read (this shard's)
    kept: int = 0
    kept_share: float | None = None
    votes_yes: int = 0
    votes_no: int = 0
    voted_out: int = 0
    mismatched: int = 0

    def summary(self) -> list[tuple[str, Any]]:
        share = f"{self.kept_share:.0%}" if self.kept_share is not None else "-"
        return [
            ("chains checked", self.checked),
            ("  kept", f"{self.kept} ({share})"),
            ("  voted out", self.voted_out),
            ("  back-translation mismatch", self.mismatched),
            ("votes yes / no", f"{self.votes_yes} / {self.votes_no}"),
        ]

    def warning(self) -> str | None:
        return "no chain was kept" if self.checked and not self.kept else None


def _names(tools: Sequence[str]) -> str:
    return "[" + ", ".join(tools) + "]"


class CheckStage:
    def __init__(
        self, cfg: CheckChainsConfig, ctx: StageContext[ToolChain], tools: Mapping[str, ToolRecord]
    ) -> None:
        self.cfg, self.ctx, self.teacher, self.tools = cfg, ctx, ctx.teacher, tools
        self.prompts = ctx.refs(PROMPTS)
        self.by_server: dict[str, list[ToolRecord]] = {}
        for t in sorted(tools.values(), key=lambda t: t.id):
            self.by_server.setdefault(t.server, []).append(t)

    def _reject(self, chain: ToolChain, reason: str, detail: str, **kw: Any) -> Rejection:
        return Rejection(stage=STAGE, source=chain.id, id=chain.id, reason=reason, detail=detail,
                         **kw)  # fmt: skip

    async def process(self, key: str, chain: ToolChain) -> UnitOutcome[ToolChain]:
        if why := not_in_pool(chain.tools, self.tools):
            return UnitOutcome(rejections=[self._reject(chain, "unknown_tool", why)])
        tools = [self.tools[t] for t in chain.tools]
        view, view_json = tool_view(tools)
        asked = [self.teacher.ask(VOTE, ChainVote, tools=view, tools_json=view_json)
                 for _ in range(self.cfg.votes)]  # fmt: skip
        try:  # all asked to the end; an endpoint failure is raised before an unusable reply
            answers: list[Answer[ChainVote]] = await gather(asked)
        except TeacherRejected as exc:
            reject = self._reject(chain, exc.code, exc.detail, raw=exc.raw_text)
            return UnitOutcome(rejections=[reject])
        yes = [a for a in answers if a.value.sensible]
        ballot = [{"sensible": a.value.sensible, "reason": a.value.reason} for a in answers]
        share = len(yes) / len(answers)
        tally = {"yes": float(len(yes)), "votes": float(len(answers)), "yes_share": share}
        if share < self.cfg.vote_threshold:
            reasons = "; ".join(a.value.reason for a in answers if not a.value.sensible)
            why = f"{len(yes)} of {len(answers)} votes yes: {reasons}"
            raw = next(a.raw for a in answers if not a.value.sensible)
            reject = self._reject(chain, "vote_no", why, raw=raw, scores=tally)
            return UnitOutcome(rejections=[reject])
        detail: dict[str, Any] = {"votes": ballot}
        if self.cfg.back_translate:
            got = await self._back_translate(chain, tools, view, view_json)
            if isinstance(got, Rejection):  # with the votes, for the stats
                return UnitOutcome(rejections=[got.model_copy(update={"scores": tally})])
            detail |= got
        return UnitOutcome([self._record(chain, detail)])

    async def _back_translate(
        self,
        chain: ToolChain,
        tools: list[ToolRecord],
        view: list[dict[str, Any]],
        view_json: str,
    ) -> dict[str, Any] | Rejection:
        try:
            q = await self.teacher.ask(GENERATE, Question, mode="diverse", tools=view,
                                       tools_json=view_json)  # fmt: skip
        except TeacherRejected as exc:
            return self._reject(chain, exc.code, exc.detail, raw=exc.raw_text)
        question = q.value.question.strip()
        offered, ids = self.offer(chain, tools)
        listed = [{"name": t["name"], "description": t["description"]} for t in offered]
        try:
            p = await self.teacher.ask(
                BACK, Predicted, tools=offered, tools_json=json.dumps(listed, ensure_ascii=False),
                question_json=json.dumps(question, ensure_ascii=False),
            )  # fmt: skip
        except TeacherRejected as exc:
            return self._reject(chain, exc.code, f"{exc.detail}; request: {question!r}",
                                raw=exc.raw_text)  # fmt: skip
        predicted = [ids.get(name, f"?{name}") for name in p.value.tools]
        if predicted != chain.tools:
            unknown = [n for n in p.value.tools if n not in ids]
            extra = f" (not offered: {', '.join(unknown)})" if unknown else ""
            detail = (f"predicted {_names(predicted)}, expected {_names(chain.tools)}{extra}; "
                      f"request: {json.dumps(question, ensure_ascii=False)}")  # fmt: skip
            return self._reject(chain, "back_translation_mismatch", detail, raw=p.raw)
        return {"question": question, "predicted": p.value.tools, "offered": len(offered),
                "attempts": {GENERATE: q.attempts, BACK: p.attempts}}  # fmt: skip

    def offer(
        self, chain: ToolChain, tools: Sequence[ToolRecord]
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """The tools shown to back-translate (the chain's and distractors of its servers,
        shuffled) and their public names → pool ids."""
        from astra_agent.mcp_env import assign_names

        rng = random.Random(f"{self.cfg.seed}:{chain.id}")
        servers = dict.fromkeys(t.server for t in tools)
        others = [t for s in servers for t in self.by_server.get(s, []) if t.id not in chain.tools]
        rng.shuffle(others)
        shown = [*tools, *others[: max(0, self.cfg.max_offered - len(tools))]]
        rng.shuffle(shown)
        grouped = {s: [t for t in shown if t.server == s] for s in servers}
        public = {(r.server, r.tool): name for name, r in assign_names(grouped).items()}
        offered, ids = [], {}
        for t in shown:
            name = public[(t.server, t.name)]
            ids[name] = t.id
            offered.append({
                "name": name,
                "description": t.description,
                "parameters": cut_text(json.dumps(t.input_schema, ensure_ascii=False)),
            })  # fmt: skip
        return offered, ids

    def _record(self, chain: ToolChain, detail: dict[str, Any]) -> ToolChain:
        sampled = chain.provenance.model_dump(mode="json") if chain.provenance else None
        prompts = self.prompts if self.cfg.back_translate else {VOTE: self.prompts[VOTE]}
        detail = {**detail, "sampled": sampled}
        prov = self.ctx.provenance([chain.id], prompts=prompts, detail=detail)
        return chain.model_copy(update={"provenance": prov})


async def synth_check_chains(
    cfg: CheckChainsConfig, progress: Progress | None = None
) -> CheckStats:
    """Vote on and back-translate the chains of ``cfg.chains`` (this shard's) into ``cfg.out``."""
    check_out(cfg.out, [*cfg.chains, *cfg.pool], "--chains or --pool")
    chains = read_chains(cfg.chains, STAGE)
    tools, pool_files = read_tools(cfg.pool, STAGE)
    selected = [(c.id, c) for _, c in chains.records if cfg.holds(c.id)]
    spec = TeacherStage(
        name=STAGE, units=selected, inputs=[*chains.files, *pool_files],
        prompts=PROMPTS if cfg.back_translate else (VOTE,), output=CHAINS_FILE,
        record=ToolChain, stats=CheckStats, writes=CHAINS_STAGE, rejected=chains.rejected,
        start=lambda ctx: CheckStage(cfg, ctx, tools).process,
        count=lambda stats, run, order: _count(stats, run, order, [c for _, c in selected]),
        stats_fields={"checked": len(selected), "requested": len(selected)},
    )  # fmt: skip
    return await run_teacher_stage(cfg, spec, progress)


def _count(
    stats: CheckStats, run: StageRun[ToolChain], order: Sequence[str], chains: list[ToolChain]
) -> None:
    kept = [c for unit in order for c in run.records(unit)]
    rejections = [r for u in order for r in run.units[u].rejections]
    stats.chains = stats.kept = len(kept)
    stats.kept_share = round(len(kept) / len(order), 4) if order else None
    stats.lengths = tally((len(c.tools) for c in kept), int)
    for c in kept:
        for v in (c.provenance.detail.get("votes") or []) if c.provenance else []:
            stats.votes_yes += bool(v.get("sensible"))
            stats.votes_no += not v.get("sensible")
    for r in rejections:
        if "votes" in r.scores:
            stats.votes_yes += int(r.scores.get("yes", 0))
            stats.votes_no += int(r.scores.get("votes", 0) - r.scores.get("yes", 0))
    stats.voted_out = sum(r.reason == "vote_no" for r in rejections)
    stats.mismatched = sum(r.reason == "back_translation_mismatch" for r in rejections)
    used = {t for c in chains for t in c.tools}
    covered = {t for c in kept for t in c.tools}
    stats.tools, stats.covered = len(used), len(covered)
    stats.not_covered = sorted(used - covered)
