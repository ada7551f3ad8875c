"""The one eval runner: items → ``async one(item)`` → typed record, for BFCL, the arenas, τ²
and training's evaluations.

It owns what every eval needs and none should copy: bounded concurrency (a pool of workers),
whole-record appends to ``results.jsonl``, progress with a known total, ``--resume`` (entries
already recorded are skipped; ``--retry-errors`` re-runs those recorded as errors, the newer
record replacing the older), an atomic ``summary.json``, and a watch on the endpoint: after N
consecutive connection failures the run stops (:class:`EndpointDied`, exit 1) instead of
recording every remaining entry as an error (a record says whether its entry failed because the
endpoint could not be reached: ``EvalRecord.unreachable``); what was recorded stays, entries
that failed only because the endpoint was gone are not recorded.

:func:`run_eval` is the whole of a model-backed eval: ``--out`` and the endpoint checked, the
run's fingerprint, the results continued, the summary. An eval may name more endpoints than the
model's (τ²'s user simulator: :attr:`EvalSpec.endpoints`), each checked and recorded as the
model's is, and may play its items in a loop of its own instead of one ``one(item, model)`` call
each (τ²'s inspect_evals loop: :attr:`EvalSpec.player`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.errors import ServerError
from astra_agent.model import ChatModel, ModelConfig
from astra_agent.runio import append_jsonl, write_json_atomic
from astra_agent.watch import EndpointWatch
from eval.results import (
    RESULTS,
    SUMMARY,
    EvalRecord,
    R,
    RunMeta,
    ensure_writable_dir,
    model_fingerprint,
    prepare_results_dir,
    read_results,
)
from eval.summaries import EvalSummary

log = logging.getLogger(__name__)
T = TypeVar("T")
S = TypeVar("S", bound=EvalSummary)


class RunConfig(BaseModel):
    """What every model-backed eval takes besides its own inputs."""

    model_config = ConfigDict(extra="forbid")

    out: Path = Field(description="results directory (checked writable first)")
    model: ModelConfig = Field(default_factory=ModelConfig)
    concurrency: int = Field(4, ge=1, description="entries at once")
    resume: bool = Field(False, description="continue the results in --out")
    retry_errors: bool = Field(
        False,
        description="re-run the entries recorded as inference or run errors (implies --resume); "
        "the newer record replaces the older",
    )
    max_connection_failures: int = Field(
        5,
        ge=1,
        description="stop (exit 1; --resume continues) after this many entries in a row could "
        "not reach the endpoint",
    )


class EndpointDied(ServerError):
    """The endpoint stopped answering in the middle of a run."""


# ------------------------------------------------------------------ progress and results


@dataclass(frozen=True)
class ProgressEvent(Generic[R]):
    """Sent once before the first item runs (``record`` None) and after each record."""

    done: int
    total: int
    records: Sequence[R]
    record: R | None = None


ProgressHook = Callable[[ProgressEvent[R]], None]


@dataclass
class RunResult(Generic[R]):
    records: list[R]  # one per selected item that has a record, in item order
    total: int
    ran: int = 0  # records written by this run
    wall_s: float = 0.0

    @property
    def complete(self) -> bool:
        return len(self.records) == self.total


@dataclass
class _Run(Generic[T, R]):
    """The state of one :func:`run_items` call (inside the process: a plain dataclass)."""

    out: Path
    key: Callable[[T], str]
    one: Callable[[T], Awaitable[R]]
    total: int
    done: dict[str, R]
    watch: EndpointWatch  # entries in a row that could not reach the endpoint
    progress: ProgressHook[R] | None
    ran: int = 0
    pending: list[R] = field(default_factory=list)  # connection failures, not yet recorded

    def write(self, rec: R) -> None:
        append_jsonl(self.out / RESULTS, rec, fsync=False)
        self.done[rec.id] = rec
        self.ran += 1
        if self.progress:
            records = list(self.done.values())
            self.progress(ProgressEvent(len(records), self.total, records, rec))

    def settle(self, rec: R) -> None:
        """Record ``rec``, unless it failed only because the endpoint was unreachable: that
        one waits until the endpoint answers again (then it is a real error) or has failed
        ``max_connection_failures`` entries in a row (then the run stops; the waiting ones are
        not recorded, ``--resume`` runs them)."""
        if not rec.unreachable:
            self.watch.answered()
            self.write(rec)
            self.flush()
            return
        if not self.watch.failed():
            self.pending.append(rec)
            return
        raise EndpointDied(
            f"the endpoint stopped answering after {self.ran} entries of this run "
            f"({self.watch.in_a_row} in a row could not reach it: {rec.error}); "
            f"{len(self.done)} of {self.total} entries are recorded",
            hint="rerun with --resume once the endpoint is back",
        )

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        for rec in pending:
            self.write(rec)

    async def run(self, item: T) -> None:
        rec = await self.one(item)
        if rec.id != self.key(item):
            raise ValueError(f"record id {rec.id!r} is not the item's {self.key(item)!r}")
        self.settle(rec)


async def run_workers(
    items: Sequence[T], work: Callable[[T], Awaitable[None]], concurrency: int
) -> None:
    """``work(item)`` over ``items``, ``concurrency`` at a time: each worker takes the next
    item when it is done with one. The first exception cancels the other workers and is
    raised (the eval runner's and the synthesis stages' pool)."""
    queue = iter(items)

    async def worker() -> None:
        for item in queue:
            await work(item)

    workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(items)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


def to_run(
    items: Sequence[T], key: Callable[[T], str], done: dict[str, R], retry_errors: bool
) -> list[T]:
    """The items :func:`run_items` runs: those without a record, and with ``retry_errors``
    those recorded as errors."""
    return [
        i
        for i in items
        if (k := key(i)) not in done or (retry_errors and done[k].error_kind is not None)
    ]


async def run_items(
    items: Sequence[T],
    key: Callable[[T], str],
    one: Callable[[T], Awaitable[R]],
    *,
    out: Path,
    done: dict[str, R],
    concurrency: int,
    retry_errors: bool = False,
    max_connection_failures: int = 5,
    progress: ProgressHook[R] | None = None,
) -> RunResult[R]:
    """Run ``one`` over the items that ``done`` (the records already in ``out``) lacks — and,
    with ``retry_errors``, over those recorded as errors — ``concurrency`` at a time; append
    each record whole as it comes. Raises :class:`EndpointDied` after
    ``max_connection_failures`` records in a row that could not reach the endpoint."""
    ids = [key(i) for i in items]
    if len(set(ids)) != len(ids):
        raise ValueError("item ids are not unique")
    wanted = set(ids)
    kept = {k: v for k, v in done.items() if k in wanted}
    watch = EndpointWatch(max_connection_failures)
    run = _Run(out, key, one, len(items), kept, watch, progress)
    todo = to_run(items, key, run.done, retry_errors)
    if progress:
        progress(ProgressEvent(len(run.done), run.total, list(run.done.values())))
    t0 = time.monotonic()
    await run_workers(todo, run.run, concurrency)
    run.flush()  # the endpoint failed at the very end, fewer times than the limit
    records = [run.done[k] for k in ids if k in run.done]
    return RunResult(records, run.total, run.ran, time.monotonic() - t0)


# ------------------------------------------------------------------ a model-backed eval


@dataclass(frozen=True)
class Clients:
    """A run's endpoints, each checked (its model's name known): the model's (``--base-url``)
    and the eval's other ones by name (:attr:`EvalSpec.endpoints`)."""

    model: ChatModel
    others: Mapping[str, ChatModel] = field(default_factory=dict)

    async def close(self) -> None:
        await self.model.close()
        for other in self.others.values():
            await other.close()


PlayOne = Callable[[T], Awaitable[R]]
# An eval's own loop: given the items still to run and the clients, it plays them (its own
# concurrency) while the context is open, and hands each item's record to the call waiting
# for it; leaving the context with an exception stops it, without one waits for it to end.
Player = Callable[[Sequence[T], Clients], AbstractAsyncContextManager[PlayOne[T, R]]]


@dataclass(frozen=True, kw_only=True)
class EvalSpec(Generic[T, R, S]):
    """One model-backed eval, for :func:`run_eval`: each item played by ``one(item, model)``
    (``--concurrency`` at once) or by a ``player`` (exactly one of the two).

    ``endpoints``: endpoints besides the model's, by name, each checked as the model's is and
    recorded under its name (its model and sampling) in config.json's fingerprint and in
    summary.json (the summary type declares the field)."""

    items: Sequence[T]
    key: Callable[[T], str]
    record: type[R]
    fingerprint: dict[str, Any]  # what the results depend on besides the model and sampling
    summarize: Callable[[list[R]], S]  # the eval's figures of summary.json
    one: Callable[[T, ChatModel], Awaitable[R]] | None = None
    player: Player[T, R] | None = None
    endpoints: Mapping[str, ModelConfig] = field(default_factory=dict)
    kind: str | None = None  # the eval kind (eval/kinds.py), recorded in config.json

    def __post_init__(self) -> None:
        if (self.one is None) == (self.player is None):
            raise ValueError("an EvalSpec plays its items by `one` or by `player`: one of them")


async def run_eval(
    cfg: RunConfig, spec: EvalSpec[T, R, S], progress: ProgressHook[R] | None = None
) -> tuple[S, RunResult[R]]:
    """Check ``--out``, check the endpoints, continue the results there, run, and write
    ``summary.json`` (also when the endpoint dies: what is recorded is summarized); return
    the summary as its readers take it."""
    ensure_writable_dir(cfg.out)
    others = {name: ChatModel(config) for name, config in spec.endpoints.items()}
    clients = Clients(ChatModel(cfg.model), others)
    t0 = time.monotonic()
    try:
        served, meta = await _check(cfg, spec, clients)
        resume = cfg.resume or cfg.retry_errors
        done = prepare_results_dir(cfg.out, meta, resume, spec.record)
        try:
            result = await _run(cfg, spec, clients, done, progress)
        except EndpointDied:
            records = read_selected(cfg.out, spec)
            _write_summary(cfg.out, spec, meta, records, len(spec.items), served, t0)
            raise
    finally:
        await clients.close()
    summary = _write_summary(cfg.out, spec, meta, result.records, result.total, served, t0)
    refuse_all_failed(result.records, cfg.out)
    return summary, result


async def _check(cfg: RunConfig, spec: EvalSpec[T, R, S], clients: Clients) -> tuple[str, RunMeta]:
    """Check each endpoint (the model's first); return the model's name and the run's meta:
    the model's fingerprint, each other endpoint's under its name, then the eval's."""
    served = await clients.model.check_model()
    fingerprint = model_fingerprint(cfg.model, served)
    for name, client in clients.others.items():
        fingerprint[name] = model_fingerprint(spec.endpoints[name], await client.check_model())
    meta = RunMeta(
        kind=spec.kind,
        fingerprint={**fingerprint, **spec.fingerprint},
        base_url=cfg.model.base_url,
    )
    return served, meta


async def _run(
    cfg: RunConfig,
    spec: EvalSpec[T, R, S],
    clients: Clients,
    done: dict[str, R],
    progress: ProgressHook[R] | None,
) -> RunResult[R]:
    """:func:`run_items` over ``spec``'s items: each by ``one`` (``--concurrency`` at once), or
    each waiting for its record from the ``player`` (which bounds its own concurrency)."""
    play: AbstractAsyncContextManager[PlayOne[T, R]]
    if spec.player is None:
        assert spec.one is not None
        one, model = spec.one, clients.model
        play, concurrency = nullcontext(lambda item: one(item, model)), cfg.concurrency
    else:
        todo = to_run(spec.items, spec.key, done, cfg.retry_errors)  # what run_items runs
        play, concurrency = spec.player(todo, clients), max(1, len(todo))
    async with play as play_one:
        return await run_items(
            spec.items, spec.key, play_one, out=cfg.out, done=done, concurrency=concurrency,
            retry_errors=cfg.retry_errors, max_connection_failures=cfg.max_connection_failures,
            progress=progress,
        )  # fmt: skip


def refuse_all_failed(records: Sequence[EvalRecord], out: Path) -> None:
    """One rule for every eval: a run whose every entry failed on an endpoint (an inference
    error: no usable reply, whatever the endpoint answered) ends in a ServerError, exit 1,
    once its records and summary are written (``--retry-errors`` re-runs them)."""
    if not records or any(r.error_kind != "inference" for r in records):
        return
    first = next((r.error for r in records if r.error), "no reply")
    raise ServerError(
        f"no entry of this run could be played: all {len(records)} failed on the endpoint "
        f"(the first: {first})",
        hint=f"is --base-url an OpenAI-compatible chat endpoint? the errors are in "
        f"{out / RESULTS}; --retry-errors re-runs them",
    )


def read_selected(out: Path, spec: EvalSpec[T, R, S]) -> list[R]:
    """The records in ``out`` of the items ``spec`` selects, each id once."""
    done = read_results(out / RESULTS, spec.record)
    return [done[k] for k in map(spec.key, spec.items) if k in done]


def _write_summary(
    out: Path,
    spec: EvalSpec[T, R, S],
    meta: RunMeta,
    records: list[R],
    total: int,
    model: str,
    t0: float,
) -> S:
    figures = spec.summarize(records)
    if spec.endpoints:  # each other endpoint's model and sampling, as config.json has them
        figures = figures.model_copy(update={n: meta.fingerprint[n] for n in spec.endpoints})
    return write_summary(out, figures, len(records), total, model, t0)


def write_summary(out: Path, figures: S, recorded: int, total: int, model: str, t0: float) -> S:
    """``summary.json``: an eval's figures, then the run's total, completeness (``recorded``
    of ``total``), time (since ``t0``) and model; returned as its readers take it."""
    summary = {
        **figures.written(),
        "total": total,
        "complete": recorded == total,
        "wall_s": round(time.monotonic() - t0, 2),
        "model": model,
    }
    write_json_atomic(out / SUMMARY, summary)
    return type(figures).model_validate(summary)
