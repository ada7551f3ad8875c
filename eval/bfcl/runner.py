"""``astra-eval bfcl``: BFCL-V3 multi-turn inference through ``run_episode``, scored with the
official semantics, one JSONL record per entry, resumable, concurrent.

Per entry: one BFCLEnvironment (the backend instances live for the whole entry); per turn, the
user message (or, at a miss_func held-out turn, the held-out functions with the official
message) and up to 20 model steps; a turn that needs more ends the entry (force-terminated).

The loop runs with the official harness's semantics (``OFFICIAL_CALLS``): every call goes to
the backends unchecked (an unknown name fails there with the official wording, and a held-out
function called before it is offered runs, as it does there); a step whose calls do not decode
ends the turn with none of them run; tool results reach the model whole (long_context).
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.episode import CallPolicy, EpisodeLimits, run_episode
from astra_agent.errors import ConfigError
from astra_agent.model import ChatModel, ModelConfig
from astra_agent.trajectory import Trajectory, append_jsonl
from eval.bfcl.backend import BFCLEnvironment, decode_step
from eval.bfcl.checker import check_entry
from eval.bfcl.official import CATEGORIES, Entry, held_out_tools, load_category
from eval.results import RESULTS, prepare_results_dir

STEP_LIMIT = 20  # the official MAXIMUM_STEP_LIMIT
OFFICIAL_CALLS = CallPolicy(check_names=False, check_arguments=False, end_on_undecodable=True)
HELD_OUT_MESSAGE = "I have updated some more functions you can choose from. What about now?"
PUBLISHED = {  # paper Table 1, function-calling mode through vLLM, temperature 0.6
    "ASTRA-14B": {
        "base": 67.0,
        "miss_func": 56.0,
        "miss_param": 48.5,
        "long_context": 61.0,
        "overall": 58.13,
    },
    "ASTRA-32B": {
        "base": 76.5,
        "miss_func": 65.5,
        "miss_param": 48.5,
        "long_context": 66.5,
        "overall": 64.25,
    },
    "Qwen3-14B": {"overall": 44.50},
    "Qwen3-32B": {"overall": 49.63},
}


class BFCLConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    out: Path
    model: ModelConfig = Field(default_factory=ModelConfig)
    categories: list[str] = Field(default_factory=lambda: list(CATEGORIES))
    ids: list[str] | None = None
    limit: int | None = Field(None, ge=1, description="first N entries per category")
    concurrency: int = Field(8, ge=1)
    resume: bool = False
    tool_timeout_s: float = Field(60.0, gt=0)

    def fingerprint(self) -> dict[str, Any]:
        return {
            **self.model.fingerprint(),
            "categories": sorted(self.categories),
            "ids": self.ids,
            "limit": self.limit,
        }


def select(cfg: BFCLConfig) -> list[Entry]:
    """The entries to run; an unknown category or id is an error before anything runs."""
    for c in cfg.categories:
        if c not in CATEGORIES:
            raise ConfigError(f"unknown category {c!r}: choose from {', '.join(CATEGORIES)}")
    entries = []
    for c in cfg.categories:
        cat = list(load_category(c))
        entries += cat[: cfg.limit] if cfg.limit else cat
    if cfg.ids:
        known = {e.id for c in CATEGORIES for e in load_category(c)}
        unknown = sorted(set(cfg.ids) - known)
        if unknown:
            raise ConfigError(f"unknown BFCL id(s): {', '.join(unknown[:5])}")
        entries = [e for e in entries if e.id in set(cfg.ids)]
    return entries


async def run_entry(entry: Entry, model: ChatModel, tool_timeout_s: float) -> dict[str, Any]:
    """Infer every turn of one entry; return its record (verdict included)."""
    env = BFCLEnvironment(entry)
    # The official harness quits once its step count exceeds the limit: 21 executing steps.
    limits = EpisodeLimits(
        max_steps=STEP_LIMIT + 1, tool_timeout_s=tool_timeout_s, max_tool_output_chars=None
    )
    traj: Trajectory | None = None
    decoded: list[list[list[str]]] = []
    responses: list[list[Any]] = []
    record: dict[str, Any] = {"id": entry.id, "category": entry.category}
    try:
        for t, question in enumerate(entry.question):
            if str(t) in entry.missed_function:
                env.add_tools(held_out_tools(entry, t))
            msgs = question or [{"role": "user", "content": HELD_OUT_MESSAGE}]
            start = len(traj.messages) if traj else 0
            traj = await run_episode(
                model,
                env,
                msgs,
                limits=limits,
                trajectory=traj,
                tools=await env.list_tools(),
                policy=OFFICIAL_CALLS,
            )
            raw, steps = _steps(traj.messages[start:])
            responses.append(raw)
            decoded.append(steps)
            if traj.termination == "model_error":
                record["error"] = f"inference error: {traj.termination_detail}"
                break
            if traj.termination == "max_steps":
                break  # the official harness stops the whole entry (force-terminated)
    except Exception as exc:  # one entry's failure is recorded with its cause
        record["error"] = f"{type(exc).__name__}: {exc}"
    verdict = check_entry(entry, decoded)
    verdict_type: str | None = verdict.error_type
    if record.get("error") and "inference error" in record["error"]:
        verdict_type = "multi_turn:inference_error"
    record.update(
        valid=verdict.valid and not record.get("error"),
        error_type=verdict_type,
        failed_turn=verdict.turn,
        details=verdict.details,
        decoded=decoded,
        responses=responses,
        trajectory=traj.model_dump(mode="json") if traj else None,
    )
    return record


def _steps(messages: list[dict[str, Any]]) -> tuple[list[Any], list[list[str]]]:
    """One turn's model steps: raw, in the official result format (a step's calls as
    ``[{name: arguments}]``, or its text), and decoded as the official evaluator decodes them
    (steps that do not decode, and the final answer, are dropped)."""
    raw: list[Any] = []
    decoded = []
    for m in messages:
        if m.get("role") != "assistant":
            continue
        if not m.get("tool_calls"):
            raw.append(m.get("content") or "")
            continue
        step = [{c["function"]["name"]: c["function"]["arguments"]} for c in m["tool_calls"]]
        raw.append(step)
        calls = decode_step(step)
        if calls:
            decoded.append(calls)
    return raw, decoded


def _prepare(cfg: BFCLConfig) -> dict[str, dict[str, Any]]:
    return prepare_results_dir(cfg.out, cfg.fingerprint(), cfg.resume, key="id")


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_cat.setdefault(r["category"], []).append(r)
    acc = {c: round(100 * sum(r["valid"] for r in rs) / len(rs), 2) for c, rs in by_cat.items()}
    overall = round(sum(acc.values()) / len(acc), 2) if acc else 0.0
    errors = Counter(r["error_type"] for r in records if not r["valid"] and r["error_type"])
    return {
        "entries": len(records),
        "accuracy": acc,
        "overall": overall,
        "counts": {c: len(rs) for c, rs in by_cat.items()},
        "errors": dict(errors),
        "inference_errors": sum(1 for r in records if r.get("error")),
    }


def write_reports(out: Path, summary: dict[str, Any], model: str) -> None:
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps({**summary, "published": PUBLISHED}, indent=2))
    os.replace(tmp, out / "summary.json")
    cols = ["Model", "Multi Turn Overall Acc", "Base", "Miss Func", "Miss Param", "Long Context"]
    acc = summary["accuracy"]
    with (out / "leaderboard.csv.tmp").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerow([model, summary["overall"], *(acc.get(c, "") for c in CATEGORIES)])
        for name, row in PUBLISHED.items():
            w.writerow(
                [f"{name} (published)", row["overall"], *(row.get(c, "") for c in CATEGORIES)]
            )
    os.replace(out / "leaderboard.csv.tmp", out / "leaderboard.csv")


Progress = Callable[[dict[str, Any], dict[str, Any]], None]


async def evaluate_bfcl(cfg: BFCLConfig, progress: Progress | None = None) -> dict[str, Any]:
    entries = select(cfg)
    # The official harness scores the server's tool_calls as returned: no recovery from text.
    model = ChatModel(cfg.model.model_copy(update={"recover_calls": False}))
    t0 = time.monotonic()
    try:
        await model.check_model()
        done = _prepare(cfg)
        records = [done[e.id] for e in entries if e.id in done]
        todo = [e for e in entries if e.id not in done]
        sem, lock = asyncio.Semaphore(cfg.concurrency), asyncio.Lock()

        async def one(entry: Entry) -> None:
            async with sem:
                rec = await run_entry(entry, model, cfg.tool_timeout_s)
            async with lock:
                append_jsonl(cfg.out / RESULTS, rec, fsync=False)
                records.append(rec)
                if progress:
                    progress(rec, summarize(records))

        await asyncio.gather(*(one(e) for e in todo))
    finally:
        await model.close()
    summary = {
        **summarize(records),
        "wall_s": round(time.monotonic() - t0, 2),
        "model": model.name,
        "bfcl_eval": "2026.3.23",
    }
    write_reports(cfg.out, summary, model.name)
    return summary
