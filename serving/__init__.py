"""Serving ASTRA: tiny checkpoints, fp32 → bf16 conversion, the vLLM launcher, endpoint checks.

Where to start: :mod:`serving.cli` (``astra-serve``: ``tiny``, ``convert``, ``up``, ``check``,
``profiles``, ``demo``) calls one module per job — :mod:`serving.tiny` (a tiny Qwen3
checkpoint built locally), :mod:`serving.convert` (verl's float32 → bf16, streamed through
:mod:`serving.safetensors_io`; :mod:`serving.checkpoint` finds and validates checkpoints),
:mod:`serving.server` (vLLM launched from its own virtualenv and supervised; the profiles in
``serving/profiles/``), :mod:`serving.endpoint_check` (tool calls and reasoning come back as
fields) and :mod:`serving.demo` (all of it end to end). It imports ``astra_agent`` only.
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
    "ServeConfig": "serving.server",
    "VLLMServer": "serving.server",
    "load_serve_config": "serving.server",
    "Script": "serving.tiny",
    "TinySpec": "serving.tiny",
    "build_tiny_checkpoint": "serving.tiny",
}

if TYPE_CHECKING:
    from serving.convert import ConvertResult, convert_checkpoint
    from serving.endpoint_check import CheckReport, check_endpoint
    from serving.server import ServeConfig, VLLMServer, load_serve_config
    from serving.tiny import Script, TinySpec, build_tiny_checkpoint


__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "CheckReport",
    "ConvertResult",
    "Script",
    "ServeConfig",
    "TinySpec",
    "VLLMServer",
    "build_tiny_checkpoint",
    "check_endpoint",
    "convert_checkpoint",
    "load_serve_config",
]
