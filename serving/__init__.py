"""Serving ASTRA: tiny checkpoints, fp32 → bf16 conversion, the vLLM launcher, endpoint checks."""

from serving.convert import ConvertResult, convert_checkpoint
from serving.endpoint_check import CheckReport, check_endpoint
from serving.server import ServeConfig, VLLMServer, load_serve_config
from serving.tiny import Script, TinySpec, build_tiny_checkpoint

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
