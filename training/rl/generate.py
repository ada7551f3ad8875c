"""What a token-level policy needs of an inference engine: token ids in, sampled ids out.

One protocol, three engines: a local Hugging Face model (:class:`HFGenerator`, tests and tiny
runs), a vLLM server's token-in/token-out completions (``training.rl.vllm_engine``, CPU and
GPU), and verl's ``AsyncLLMServerManager`` (``training.rl.verl``, clusters).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Sampling:
    """Sampling of one model call. ``max_tokens`` bounds the reply; ``stop_token_ids`` end it
    (the end-of-turn token, included in the reply: it is sampled and trained)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    max_tokens: int = 1024
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Sample:
    """One reply: the sampled ids (the stop token included when one ended it), each one's
    log-probability under the sampler, and why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class TokenGenerator(Protocol):
    """An engine that continues a token context. Safe to call concurrently."""

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Sample: ...


class HFGenerator:
    """A local ``transformers`` causal LM as a :class:`TokenGenerator` (one sequence at a time,
    under a lock; for tests and tiny runs, not throughput)."""

    def __init__(self, model: Any, *, device: str = "cpu") -> None:
        self.model = model
        self.device = device
        self._lock = asyncio.Lock()

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Sample:
        async with self._lock:
            return await asyncio.to_thread(self._generate, prompt_ids, sampling)

    def _generate(self, prompt_ids: list[int], sampling: Sampling) -> Sample:
        # in train mode with gradient checkpointing, transformers turns the KV cache off, and
        # each token would be sampled from a one-token context: sample in eval mode
        was_training = self.model.training
        self.model.eval()
        try:
            return self._decode(prompt_ids, sampling)
        finally:
            self.model.train(was_training)

    def _decode(self, prompt_ids: list[int], sampling: Sampling) -> Sample:
        import torch

        gen = torch.Generator(device="cpu")
        if sampling.seed is not None:
            gen.manual_seed(sampling.seed)
        ids = torch.tensor([prompt_ids], device=self.device)
        out: list[int] = []
        logprobs: list[float] = []
        past = None
        stop = set(sampling.stop_token_ids)
        finish: FinishReason = "length"
        with torch.no_grad():
            for _ in range(sampling.max_tokens):
                res = self.model(input_ids=ids, past_key_values=past, use_cache=True)
                past = res.past_key_values
                logits = res.logits[0, -1].float()
                token, logp = _sample(logits, sampling, gen)
                out.append(token)
                logprobs.append(logp)
                if token in stop:
                    finish = "stop"
                    break
                ids = torch.tensor([[token]], device=self.device)
        return Sample(out, logprobs, finish)


def _sample(logits: Any, sampling: Sampling, gen: Any) -> tuple[int, float]:
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
