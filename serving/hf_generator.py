"""Sampling with a local ``transformers`` model, for machines without vLLM.

:class:`HFGenerator` is a token generator (token ids and a :class:`~serving.sampling.Sampling`
in, a :class:`~serving.sampling.Sample` out) over a causal LM already in memory: the RL
trainer's own model (``rollout.engine: hf``) or the model ``astra-serve up --engine hf`` serves
(:mod:`serving.hf_server`). Requests that arrive while the model is busy wait in a queue; the
next pass takes all of them (up to ``max_batch``, each new one waited for up to ``window_s``)
as one left-padded batch, so that concurrent
episodes share forward passes, as vLLM's batching does (not its paging: each batch runs until its
longest reply ends). Each row keeps its own sampling settings, stop tokens, length and seed.

Sampling runs on the CPU from each step's logits (one copy per step): the same draws on every
device for a seed, and no device-side generator to keep in step.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from serving.sampling import FinishReason, Sample, Sampling


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: Sampling
    future: Future[Sample]


class HFGenerator:
    """A local causal LM as a token generator: ``await generate(ids, sampling)`` from any
    number of coroutines, or ``submit(ids, sampling).result()`` from any number of threads;
    concurrent requests are decoded together. ``model`` may be swapped between calls (the RL
    trainer's weights after a step); a batch uses the model it started with."""

    def __init__(
        self, model: Any, *, device: str = "cpu", max_batch: int = 32, window_s: float = 0.01
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be ≥ 1, got {max_batch}")
        self.model = model
        self.device = device
        self.max_batch, self.window_s = max_batch, window_s
        self.batches = 0  # passes run (a test and the server's log read it)
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Sample:
        return await asyncio.wrap_future(self.submit(prompt_ids, sampling))

    def submit(self, prompt_ids: list[int], sampling: Sampling) -> Future[Sample]:
        """Queue one request; its :class:`Sample` (or the error of its batch) on the future."""
        if not prompt_ids:
            raise ValueError("an empty prompt: nothing to continue")
        fut: Future[Sample] = Future()
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._serve, daemon=True, name="hf-gen")
                self._worker.start()
        self._queue.put(_Request(list(prompt_ids), sampling, fut))
        return fut

    def close(self) -> None:
        """End the worker once the queued requests are served."""
        with self._lock:
            if self._worker is not None and self._worker.is_alive():
                self._queue.put(None)
                self._worker.join()
            self._worker = None

    # ------------------------------------------------------------------ the worker
    def _serve(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch:  # requests sent together arrive within ms
                try:
                    nxt = self._queue.get(timeout=self.window_s)
                except queue.Empty:
                    break
                if nxt is None:  # close(): serve this batch, then end
                    self._queue.put(None)
                    break
                batch.append(nxt)
            live = [r for r in batch if r.future.set_running_or_notify_cancel()]
            if not live:
                continue
            try:
                samples = self._run(live)
            except BaseException as exc:  # the batch's error is each of its requests' error
                for r in live:
                    r.future.set_exception(exc)
                continue
            for r, s in zip(live, samples, strict=True):
                r.future.set_result(s)

    def _run(self, batch: list[_Request]) -> list[Sample]:
        # in train mode with gradient checkpointing, transformers turns the KV cache off, and
        # each token would be sampled from a one-token context: sample in eval mode
        model = self.model
        was_training = model.training
        model.eval()
        try:
            self.batches += 1
            return decode_batch(model, [(r.prompt_ids, r.sampling) for r in batch], self.device)
        finally:
            model.train(was_training)


def decode_batch(model: Any, rows: list[tuple[list[int], Sampling]], device: str) -> list[Sample]:
    """Continue each ``(prompt_ids, sampling)`` row: prompts left-padded into one batch, one
    forward pass per step for all rows until every row has stopped or reached its length."""
    import torch

    n = len(rows)
    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in rows], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in rows], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    gens = [_generator(s.seed) for _, s in rows]
    out: list[list[int]] = [[] for _ in rows]
    logps: list[list[float]] = [[] for _ in rows]
    finish: list[FinishReason] = ["length"] * n
    live = [s.max_tokens > 0 for _, s in rows]
    past = None
    with torch.no_grad():
        while any(live):
            res = model(
                input_ids=ids, attention_mask=mask, position_ids=positions,
                past_key_values=past, use_cache=True,
            )  # fmt: skip
            past = res.past_key_values
            logits = res.logits[:, -1].float().cpu()
            step = [0] * n
            for i, (_, s) in enumerate(rows):
                if not live[i]:
                    continue
                token, logp = sample_token(logits[i], s, gens[i])
                out[i].append(token)
                logps[i].append(logp)
                step[i] = token
                if token in s.stop_token_ids:
                    finish[i], live[i] = "stop", False
                elif len(out[i]) >= s.max_tokens:
                    live[i] = False
            ids = torch.tensor(step, device=device).unsqueeze(1)
            mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], 1)
            positions = positions[:, -1:] + 1
    return [Sample(o, lp, f) for o, lp, f in zip(out, logps, finish, strict=True)]


def _generator(seed: int | None) -> Any:
    import torch

    gen = torch.Generator(device="cpu")
    if seed is not None:
        gen.manual_seed(seed)
    else:
        gen.seed()
    return gen


def sample_token(logits: Any, sampling: Sampling, gen: Any) -> tuple[int, float]:
    """One token from ``logits`` (temperature, top-k, top-p; greedy at temperature 0) and its
    log-probability under the distribution it was drawn from."""
    import torch

    if sampling.temperature <= 0:
        logp = torch.log_softmax(logits, -1)
        token = int(torch.argmax(logits))
        return token, float(logp[token])
    scaled = logits / sampling.temperature
    if sampling.top_k > 0:
        kth = torch.topk(scaled, min(sampling.top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampling.top_p < 1.0:
        probs = torch.softmax(scaled, -1)
        sorted_p, order = torch.sort(probs, descending=True)
        cut = torch.cumsum(sorted_p, -1) - sorted_p > sampling.top_p
        scaled[order[cut]] = float("-inf")
    logp = torch.log_softmax(scaled, -1)
    token = int(torch.multinomial(logp.exp(), 1, generator=gen))
    return token, float(logp[token])
