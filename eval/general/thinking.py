"""A thinking model's final answer: what the task's filters and metrics must see.

Qwen3-style models write ``<think>…</think>`` before the answer. Served by vLLM with a
reasoning parser (``--reasoning-parser qwen3``) the reasoning comes back in a field of its own
and ``content`` holds only the answer; served without one, ``content`` holds both. Either way
the answer is the text after the last ``</think>``; a reply whose think block never closed
(cut by ``max_tokens``) has no answer at all, rather than its half-finished reasoning being
scored as one.
"""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def answer_after_think(text: str | None) -> str:
    """The answer part of a reply's content (stripped): after the last ``</think>``; ``""``
    when a ``<think>`` is still open; the whole text when it has no think tags."""
    if not text:
        return ""
    if THINK_CLOSE in text:
        return text.rsplit(THINK_CLOSE, 1)[1].strip()
    if THINK_OPEN in text:
        return ""
    return text.strip()
