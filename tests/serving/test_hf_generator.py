"""The batched transformers generator: concurrent requests share forward passes and each row
comes out as it would alone (left padding, per-row lengths, stops and seeds)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from serving.hf_generator import HFGenerator, decode_batch
from serving.sampling import Sampling


@pytest.fixture(scope="module")
def model(random_fp32: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(random_fp32), dtype=torch.float32).eval()


PROMPTS = [[5, 9, 13], [7] * 11, [3, 4, 5, 6, 7, 8, 9], [21]]


def _greedy(n: int, stop: tuple[int, ...] = ()) -> Sampling:
    return Sampling(temperature=0.0, max_tokens=n, stop_token_ids=stop)


def test_a_batch_of_prompts_of_different_lengths_equals_each_alone(model: Any) -> None:
    rows = [(p, _greedy(12)) for p in PROMPTS]
    together = decode_batch(model, rows, "cpu")
    for (p, s), got in zip(rows, together, strict=True):
        alone = decode_batch(model, [(p, s)], "cpu")[0]
        assert got.token_ids == alone.token_ids
        assert max(abs(a - b) for a, b in zip(got.logprobs, alone.logprobs, strict=True)) < 1e-4


def test_greedy_equals_torch_argmax_step_by_step(model: Any) -> None:
    prompt = PROMPTS[2]
    got = decode_batch(model, [(prompt, _greedy(6))], "cpu")[0]
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    assert got.token_ids == ids[len(prompt) :]


def test_each_row_keeps_its_own_length_and_stop(model: Any) -> None:
    first = decode_batch(model, [(PROMPTS[0], _greedy(8))], "cpu")[0]
    stop_at = first.token_ids[3]
    rows = [
        (PROMPTS[0], _greedy(8, stop=(stop_at,))),
        (PROMPTS[1], _greedy(2)),
        (PROMPTS[3], _greedy(0)),
    ]
    stopped, short, empty = decode_batch(model, rows, "cpu")
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == stop_at
    assert stopped.token_ids == first.token_ids[: first.token_ids.index(stop_at) + 1]
    assert short.finish_reason == "length" and len(short.token_ids) == 2
    assert empty.token_ids == [] and empty.finish_reason == "length"


def test_unseeded_samples_differ_and_a_seed_repeats(model: Any) -> None:
    """Unseeded rows used to draw from torch's default-seeded generator: every rollout of a
    group came out the same, so GRPO saw no variance on the hf engine."""
    hot = Sampling(temperature=1.0, max_tokens=16)
    a, b = decode_batch(model, [(PROMPTS[1], hot), (PROMPTS[1], hot)], "cpu")
    c = decode_batch(model, [(PROMPTS[1], hot)], "cpu")[0]
    assert len({tuple(a.token_ids), tuple(b.token_ids), tuple(c.token_ids)}) > 1
    seeded = Sampling(temperature=1.0, max_tokens=16, seed=3)
    x, _ = decode_batch(model, [(PROMPTS[1], seeded), (PROMPTS[2], _greedy(3))], "cpu")
    z = decode_batch(model, [(PROMPTS[1], seeded)], "cpu")[0]
    assert x.token_ids == z.token_ids


async def test_concurrent_requests_share_passes(model: Any) -> None:
    gen = HFGenerator(model, max_batch=8)
    try:
        samples = await asyncio.gather(*(gen.generate(p, _greedy(10)) for p in PROMPTS * 4))
    finally:
        gen.close()
    assert gen.batches < len(samples) // 2, gen.batches
    alone = [decode_batch(model, [(p, _greedy(10))], "cpu")[0].token_ids for p in PROMPTS]
    assert [s.token_ids for s in samples] == alone * 4


def test_threads_get_results_and_a_failed_batch_fails_its_requests(model: Any) -> None:
    gen = HFGenerator(model)
    try:
        assert len(gen.submit(PROMPTS[0], _greedy(3)).result(timeout=60).token_ids) == 3
        with pytest.raises(ValueError, match="empty prompt"):
            gen.submit([], _greedy(3))
        bad = gen.submit([10**9], _greedy(3))  # an id past the vocabulary
        with pytest.raises((IndexError, RuntimeError)):
            bad.result(timeout=60)
        assert len(gen.submit(PROMPTS[3], _greedy(2)).result(timeout=60).token_ids) == 2
    finally:
        gen.close()
