"""What a token-level policy needs of a model: token ids in, sampled ids out.

One protocol, three generators, all under :mod:`serving.sampling`'s contract: a model in
memory (:class:`serving.hf_generator.HFGenerator`, concurrent requests batched), a vLLM
server's token-in/token-out completions (:class:`training.rollout_server.VLLMGenerator`, CPU
and GPU) and verl's server manager
(:class:`training.rl.verl_agent_loop.ServerManagerGenerator`, clusters).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from serving.sampling import Sample, Sampling


@runtime_checkable
class TokenGenerator(Protocol):
    """Continues a token context. Safe to call concurrently."""

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Sample: ...
