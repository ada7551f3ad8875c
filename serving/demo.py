"""The README's first command: tiny checkpoint → bf16 → vLLM on CPU → `astra-agent run` with a
real MCP server (mcp-server-time); with ``real=True`` the same with a real model instead
(SmolLM2-135M-Instruct imported from the GGUF file set-up unpacked, served without a reasoning
parser: it does not think)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

from astra_agent.console import console
from astra_agent.errors import AstraError
from astra_agent.runio import file_sha256
from serving.convert import convert_checkpoint
from serving.gguf import SMOLLM2, bundled_gguf, import_gguf, import_record
from serving.server import ModelServer, load_serve_config
from serving.tiny import TinySpec, build_tiny_checkpoint

DEMO_TASK = "What time is it in UTC right now?"
DEMO_MCP = {"mcpServers": {"time": {"command": "mcp-server-time"}}}


def prepare_tiny(workdir: Path) -> Path:
    """Build the scripted tiny fp32 checkpoint and its bf16 conversion, unless a build of the
    same spec is already there (a stamp records the spec it was built from)."""
    fp32, bf16 = workdir / "tiny-fp32", workdir / "tiny-bf16"
    stamp = workdir / "tiny.spec.json"
    spec = TinySpec()
    wanted = json.dumps(dataclasses.asdict(spec), sort_keys=True, default=str)
    fresh = stamp.is_file() and stamp.read_text() == wanted
    if not fresh or not (fp32 / "config.json").is_file():
        build_tiny_checkpoint(fp32, spec, overwrite=True)
        fresh = False
    if not fresh or not (bf16 / "model.safetensors.index.json").is_file():
        convert_checkpoint(fp32, bf16, overwrite=True)
    stamp.write_text(wanted)
    return bf16


def prepare_smollm2(workdir: Path) -> Path:
    """SmolLM2-135M-Instruct imported from its GGUF file (bf16), unless an import of that same
    file is already there."""
    src, dst = bundled_gguf(SMOLLM2), workdir / "smollm2-bf16"
    record = import_record(dst)
    if record is None or record.get("source_sha256") != file_sha256(src):
        import_gguf(src, dst, overwrite=True)
    return dst


def run_demo(workdir: Path, port: int, real: bool = False) -> int:
    t0 = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    if real:
        model, profile = prepare_smollm2(workdir), "instruct-cpu"
        console.print(f"[bold]1.[/] SmolLM2-135M-Instruct imported from GGUF (bf16): {model}")
    else:
        model, profile = prepare_tiny(workdir), "tiny-cpu"
        console.print(f"[bold]1.[/] tiny checkpoint built (fp32) and converted to bf16: {model}")
    cfg = load_serve_config(profile, model=model, port=port)
    server = ModelServer(cfg)
    with console.status(f"[bold]2.[/] starting vLLM on CPU (log: {server.log_file})"):
        server.start()
    try:
        took = time.monotonic() - t0
        console.print(
            f"[bold]2.[/] vLLM serves {cfg.served_model_name} at {server.base_url} ({took:.0f} s)"
        )
        mcp = workdir / "mcp.json"
        mcp.write_text(json.dumps(DEMO_MCP, indent=2))
        cmd = [
            sys.executable,
            "-m",
            "astra_agent",
            "run",
            DEMO_TASK,
            "--config",
            str(mcp),
            "--base-url",
            server.base_url,
            "--show-reasoning",
            "--save",
            str(workdir / "trajectories.jsonl"),
        ]
        if "temperature" in cfg.generation:  # the profile's sampling, not Qwen3's thinking one
            cmd += ["--temperature", str(cfg.generation["temperature"])]
        shown = ["astra-agent", *cmd[3:]]
        console.print(f"[bold]3.[/] {' '.join(shown)}", highlight=False, soft_wrap=True)
        code = subprocess.run(cmd, check=False).returncode
        if code:
            raise AstraError(f"astra-agent run exited with {code}")
        console.print(f"trajectory appended to {workdir / 'trajectories.jsonl'}")
        return code
    finally:
        server.stop()
