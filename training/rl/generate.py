"""What a token-level policy needs of an inference engine: token ids in, sampled ids out.

One protocol, three engines: a local Hugging Face model (:class:`serving.hf_engine.HFGenerator`,
concurrent requests batched), a vLLM server's token-in/token-out completions
(``training.rl.vllm_engine``, CPU and GPU), and verl's ``AsyncLLMServerManager``
(``training.rl.verl``, clusters).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from serving.hf_engine import FinishReason, HFGenerator, Sample, Sampling


@runtime_checkable
class TokenGenerator(Protocol):
    """An engine that continues a token context. Safe to call concurrently."""

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Sample: ...


__all__ = ["FinishReason", "HFGenerator", "Sample", "Sampling", "TokenGenerator"]
