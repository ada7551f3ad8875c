"""The sampling contract of token generators: what one model call asks for and what it returns.

Every token generator takes token ids and a :class:`Sampling` and returns a :class:`Sample`:
the transformers one here (:class:`serving.hf_generator.HFGenerator`) and the RL trainer's
over a vLLM server and over verl's server manager. The trainer's token-level policy is written
against these types, so the ids and log-probs it trains on are those that were sampled,
whichever generator sampled them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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
