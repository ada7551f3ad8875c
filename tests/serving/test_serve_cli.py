"""`astra-serve` as a user runs it: `up` stopped by signals (in the background too), its start-up
log, `--dry-run`, fp32 warnings, `check` honouring ASTRA_BASE_URL, unwritable outputs."""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astra_agent.procs import descendants
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from serving.cli import app
from tests.conftest import free_port, from_a_terminal, signal_state

FAKE_VLLM = Path(__file__).with_name("fake_vllm.py")
runner = CliRunner()


def flat(text: str) -> str:
    """Rich wraps at the terminal's width: compare words, not line breaks."""
    return " ".join(text.split())


def _serve_env(tmp_path: Path, python: str) -> dict[str, str]:
    return {
        **os.environ,
        "ASTRA_SERVE_PYTHON": python,
        "ASTRA_HOME": str(tmp_path / "home"),
        "CUDA_VISIBLE_DEVICES": "",
        "COLUMNS": "200",
    }


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    """An executable that the launcher takes for the serving Python: it runs the fake vLLM."""
    shim = tmp_path / "fake-python"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {FAKE_VLLM} "$@"\n')
    shim.chmod(0o755)
    return str(shim)


def _lines(stream) -> queue.Queue[str | None]:
    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _wait_for(q: queue.Queue[str | None], needle: str, timeout_s: float) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"{needle!r} not seen within {timeout_s} s; got {seen}")


def _up(model: Path, env: dict[str, str], ignore_sigint: bool = False) -> subprocess.Popen[str]:
    def background() -> None:  # what `cmd &` does in a non-interactive shell
        from_a_terminal()
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    return subprocess.Popen(
        [sys.executable, "-m", "serving", "up", "--model", str(model), "--port", str(free_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=background if ignore_sigint else from_a_terminal,
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    "sig,background",
    [
        (signal.SIGTERM, False),
        (signal.SIGINT, False),
        (signal.SIGINT, True),
        (signal.SIGHUP, False),
    ],
    ids=["sigterm", "sigint", "sigint-background", "sighup"],
)
def test_up_stops_on_signals_with_exit_0_and_no_process_left(
    tiny_bf16: Path, tmp_path: Path, fake_python: str, sig: int, background: bool
) -> None:
    proc = _up(tiny_bf16, _serve_env(tmp_path, fake_python), ignore_sigint=background)
    try:
        out = _lines(proc.stdout)
        _wait_for(out, "ready", 60)
        assert len(descendants(proc.pid)) >= 2  # the server and its "engine core"
        proc.send_signal(sig)
        try:
            code = proc.wait(timeout=120)  # a bound on a hang, not a speed: machines get busy
        except subprocess.TimeoutExpired:
            raise AssertionError(f"no exit on {sig!r}: {signal_state(proc.pid)}") from None
        assert code == 0
        err = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "vLLM stopped" in err and "Traceback" not in err, err
    assert descendants(proc.pid) == []
    # start-up showed vLLM's own log lines, not just a spinner
    assert "vllm| fake: loading weights 2/2" in err


@pytest.mark.integration
def test_up_when_vllm_dies_after_start_is_a_failure(
    tiny_bf16: Path, tmp_path: Path, fake_python: str
) -> None:
    proc = _up(tiny_bf16, _serve_env(tmp_path, fake_python))
    try:
        out = _lines(proc.stdout)
        _wait_for(out, "ready", 60)
        (server_pid,) = [p for p in descendants(proc.pid) if _parent(p) == proc.pid]
        os.kill(server_pid, signal.SIGKILL)
        assert proc.wait(timeout=120) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "exited by itself" in (proc.stderr.read() if proc.stderr else "")


@pytest.mark.integration
def test_up_killed_with_sigkill_takes_vllm_with_it(
    tiny_bf16: Path, tmp_path: Path, fake_python: str
) -> None:
    """No handler runs on SIGKILL: the server learns of its parent's death from the kernel
    (PR_SET_PDEATHSIG) and shuts down, its engine core with it."""
    proc = _up(tiny_bf16, _serve_env(tmp_path, fake_python))
    tree: list[int] = []
    try:
        _wait_for(_lines(proc.stdout), "ready", 60)
        tree = descendants(proc.pid)
        assert len(tree) >= 2  # the server and its "engine core"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and [p for p in tree if _alive(p)]:
            time.sleep(0.2)
        assert [p for p in tree if _alive(p)] == []
    finally:
        proc.kill()
        for p in tree:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.integration
def test_up_real_vllm_stops_on_sigterm(tiny_bf16: Path, tmp_path: Path) -> None:
    python = Path(__file__).resolve().parents[2] / ".venv-serve" / "bin" / "python"
    if not python.is_file():
        pytest.skip("no .venv-serve")
    proc = _up(tiny_bf16, _serve_env(tmp_path, str(python)))
    try:
        _wait_for(_lines(proc.stdout), "ready", 300)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert descendants(proc.pid) == []


def test_dry_run_prints_a_copy_pasteable_command(
    tiny_bf16: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASTRA_SERVE_PYTHON", sys.executable)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr("serving.server.bf16_missing", lambda: None)  # auto: bfloat16
    name = "my model [v1]"  # a space and brackets: shell-quoted, and not eaten as rich markup
    args = ["up", "--model", str(tiny_bf16), "--served-model-name", name, "--dry-run"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    words = shlex.split(result.stdout)
    assert words[0] == "VLLM_CPU_KVCACHE_SPACE=1"  # what the tiny-cpu profile sets on CPU
    assert words[1:4] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert words[words.index("--served-model-name") + 1] == name
    generation = json.loads(words[words.index("--override-generation-config") + 1])
    assert generation["temperature"] == 0.6
    assert "float32" not in result.stderr  # a bf16 checkpoint: no warning
    assert words[words.index("--dtype") + 1] == "bfloat16"


def test_fp32_checkpoint_gets_a_warning(tiny_fp32: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASTRA_SERVE_PYTHON", sys.executable)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # serving on the CPU
    monkeypatch.setattr("serving.server.bf16_missing", lambda: None)  # auto casts to bfloat16
    result = runner.invoke(app, ["up", "--model", str(tiny_fp32), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "holds float32 weights" in flat(result.stderr)
    assert "astra-serve convert" in flat(result.stderr)
    result = runner.invoke(
        app, ["up", "--model", str(tiny_fp32), "--dtype", "float32", "--dry-run"]
    )
    assert "--dtype float32 doubles the memory" in flat(result.stderr)
    assert "--dtype float32" in result.stdout
    # a CPU without bf16 (an AVX2-only one): auto serves the float32 weights as they are
    monkeypatch.setattr("serving.server.bf16_missing", lambda: "no bf16 on this CPU")
    result = runner.invoke(app, ["up", "--model", str(tiny_fp32), "--dry-run"])
    assert "dtype auto serves float32 on this CPU: no bf16 on this CPU" in flat(result.stderr)
    assert "holds float32 weights" not in flat(result.stderr)
    assert "--dtype float32" in result.stdout


@pytest.mark.integration
def test_check_honours_astra_base_url_and_sends_the_agent_sampling() -> None:
    reply = Reply(reasoning="think", tool_calls=[("get_current_time", '{"timezone": "UTC"}')])
    with ScriptedServer(lambda _: reply) as srv:
        result = runner.invoke(app, ["check"], env={"ASTRA_BASE_URL": srv.base_url})
        assert result.exit_code == 0, result.output
        assert srv.base_url in result.stdout and "FAIL" not in result.stdout
        sent = srv.requests[0]
    assert sent["temperature"] == 0.6 and sent["top_p"] == 0.95 and sent["top_k"] == 20


@pytest.mark.integration
def test_check_fails_when_the_answer_lands_in_reasoning() -> None:
    """What vLLM's qwen3 parser returns for a model that does not think: the answer as
    reasoning, content empty. That is a failure, not "structured reasoning: pass"."""
    reply = Reply(reasoning="The time in UTC is noon.", content=None)
    with ScriptedServer(lambda _: reply) as srv:
        result = runner.invoke(app, ["check"], env={"ASTRA_BASE_URL": srv.base_url})
    assert result.exit_code == 1, result.output
    out = flat(result.stdout)
    assert "structured reasoning" in out and "FAIL" in out
    assert "the whole answer came back in `reasoning`" in out and "instruct-cpu" in out


def test_check_connection_refused_says_what_to_do() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    t0 = time.monotonic()
    result = runner.invoke(app, ["check"], env={"ASTRA_BASE_URL": url})
    assert result.exit_code == 1
    assert f"is a server running at {url}? start one with `astra-serve up`" in flat(result.stderr)
    assert time.monotonic() - t0 < 10  # one short retry, not a long back-off


def _read_only_run(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run astra-serve with ``path`` mounted read-only (bubblewrap: works as root too)."""
    if shutil.which("bwrap") is None:
        pytest.skip("no bubblewrap")
    cmd = ["bwrap", "--bind", "/", "/", "--ro-bind", str(path), str(path), "--dev", "/dev"]
    cmd += ["--proc", "/proc", sys.executable, "-m", "serving", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
@pytest.mark.parametrize("command", ["convert", "tiny"])
def test_unwritable_output_fails_before_the_work(
    tiny_fp32: Path, tmp_path: Path, command: str
) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    args = [command, str(tiny_fp32)] if command == "convert" else [command]
    out = _read_only_run(ro, *args, str(ro / "sub" / "out"))
    assert out.returncode == 2, out.stderr
    assert "is not writable (Read-only file system)" in flat(out.stderr)
    assert "Traceback" not in out.stderr and "converting" not in out.stderr
    assert list(ro.iterdir()) == []


def test_output_under_a_file_fails_before_the_work(tiny_fp32: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    for args in (["convert", str(tiny_fp32)], ["tiny"]):
        result = runner.invoke(app, [*args, str(tmp_path / "afile" / "out")])
        assert result.exit_code == 2, result.output
        assert "is not a directory" in flat(result.stderr)
