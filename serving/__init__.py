"""Serving ASTRA: tiny checkpoints, fp32 → bf16 conversion, GGUF import, the model server
(vLLM, or the harness's own on transformers), endpoint checks.

Where to start: :mod:`serving.cli` (``astra-serve``: ``tiny``, ``convert``, ``import-gguf``,
``up``, ``check``, ``profiles``, ``demo``) calls one module per job — :mod:`serving.tiny` (a
tiny Qwen3 checkpoint built locally), :mod:`serving.convert` (verl's float32 → bf16, streamed
through :mod:`serving.safetensors_io`; :mod:`serving.checkpoint` finds and validates
checkpoints), :mod:`serving.gguf` (a GGUF file as a checkpoint directory),
:mod:`serving.server` (the server of the chosen engine launched and supervised: vLLM from its
own virtualenv, or :mod:`serving.hf_server` where vLLM is not installed; the profiles in
``serving/profiles/``; :mod:`serving.cpu` says what dtype pays on this CPU),
:mod:`serving.endpoint_check` (tool calls and reasoning come back as fields) and
:mod:`serving.demo` (all of it end to end). :mod:`serving.hf_generator` samples token ids
with a model in memory (the hf server's and the RL trainer's), under the contract of
:mod:`serving.sampling`. It imports ``astra_agent`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from astra_agent.lazy import lazy_exports

# Loaded on first use: `serving.convert` and `serving.tiny` import torch (about 3 s), which
# `astra-serve up`, `check` and `--help` never need.
_EXPORTS = {
    "ConvertResult": "serving.convert",
    "convert_checkpoint": "serving.convert",
    "CheckReport": "serving.endpoint_check",
    "check_endpoint": "serving.endpoint_check",
    "Sample": "serving.sampling",
    "Sampling": "serving.sampling",
    "ModelServer": "serving.server",
    "ServeConfig": "serving.server",
    "load_serve_config": "serving.server",
    "Script": "serving.tiny",
    "TinySpec": "serving.tiny",
    "build_tiny_checkpoint": "serving.tiny",
}

if TYPE_CHECKING:
    from serving.convert import ConvertResult, convert_checkpoint
    from serving.endpoint_check import CheckReport, check_endpoint
    from serving.sampling import Sample, Sampling
    from serving.server import ModelServer, ServeConfig, load_serve_config
    from serving.tiny import Script, TinySpec, build_tiny_checkpoint


__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "CheckReport",
    "ConvertResult",
    "ModelServer",
    "Sample",
    "Sampling",
    "Script",
    "ServeConfig",
    "TinySpec",
    "build_tiny_checkpoint",
    "check_endpoint",
    "convert_checkpoint",
    "load_serve_config",
]
