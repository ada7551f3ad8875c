"""The launcher: profiles, the vLLM command, and failures before and during start-up."""

import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from astra_agent.errors import CheckpointError, ConfigError, ServerError
from astra_agent.procs import group_members
from serving.server import (
    LogFollower,
    ModelServer,
    ServeConfig,
    dtype_warning,
    hf_command,
    load_serve_config,
    profile_names,
    served_dtype,
    vllm_command,
    weights_dtype,
)
from tests.conftest import free_port, tiny_serve_config


@pytest.mark.parametrize("name", profile_names())
def test_every_shipped_profile_is_valid(name: str) -> None:
    cfg = load_serve_config(name, model=Path("/m"))
    assert isinstance(cfg, ServeConfig)
    thinks = cfg.reasoning_parser == "qwen3" and cfg.enable_thinking is not False
    if thinks:  # Qwen3's thinking-mode sampling
        assert cfg.generation == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
    else:
        assert cfg.generation and cfg.generation["temperature"] != 0.6
    if name.startswith("astra-"):
        assert cfg.tensor_parallel_size == "auto" and cfg.max_model_len >= 32768
        assert cfg.served_model_name.startswith("ASTRA-")


def test_profiles_exist() -> None:
    assert {"tiny-cpu", "instruct-cpu", "astra-14b", "astra-14b-nothink", "astra-32b"} <= set(
        profile_names()
    )


def test_profiles_decide_how_replies_parse() -> None:
    """A model that never thinks is served without a reasoning parser (its answer would land
    in `reasoning`); ASTRA with thinking off keeps the parser and sets the template's default."""
    plain = " ".join(vllm_command(load_serve_config("instruct-cpu", model=Path("/m")), "py"))
    assert "--reasoning-parser" not in plain and "--default-chat-template-kwargs" not in plain
    assert "--tool-call-parser hermes" in plain
    nothink = vllm_command(load_serve_config("astra-14b-nothink", model=Path("/m")), "py")
    assert nothink[nothink.index("--reasoning-parser") + 1] == "qwen3"
    kwargs = nothink[nothink.index("--default-chat-template-kwargs") + 1]
    assert kwargs == '{"enable_thinking": false}'
    thinking = vllm_command(load_serve_config("astra-14b", model=Path("/m")), "py")
    assert "--default-chat-template-kwargs" not in thinking


def test_unknown_profile_and_bad_values() -> None:
    with pytest.raises(ConfigError, match="unknown profile"):
        load_serve_config("nope")
    with pytest.raises(ConfigError, match="port"):
        load_serve_config("tiny-cpu", port=70000)


def test_command_enables_parsers_and_settings() -> None:
    cfg = load_serve_config("tiny-cpu", model=Path("/m"), api_key="k", port=9000)
    cmd = vllm_command(cfg, "py")
    joined = " ".join(cmd)
    for part in (
        "-m vllm.entrypoints.openai.api_server",
        "--enable-auto-tool-choice",
        "--tool-call-parser hermes",
        "--reasoning-parser qwen3",
        "--enable-prefix-caching",
        "--served-model-name astra-tiny",
        "--port 9000",
        "--max-model-len 16384",
        "--tensor-parallel-size 1",
        "--api-key k",
        "--enforce-eager",
    ):
        assert part in joined, part
    assert '"temperature": 0.6' in joined


def test_a_request_template_is_trusted_only_when_asked_by_either_engine() -> None:
    """``trust_request_chat_template`` (off by default) passes vLLM's flag of the same name to
    whichever engine serves."""
    plain = load_serve_config("tiny-cpu", model=Path("/m"))
    trusting = plain.model_copy(update={"trust_request_chat_template": True})
    for command in (lambda c: vllm_command(c, "py"), hf_command):
        assert "--trust-request-chat-template" not in command(plain)
        assert command(trusting).count("--trust-request-chat-template") == 1


def test_env_overrides_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASTRA_SERVE_PORT", "9123")
    assert load_serve_config("tiny-cpu").port == 9123


def test_model_dir_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        ModelServer(tiny_serve_config(tmp_path)).start()


def test_api_key_required_off_loopback(tiny_bf16: Path) -> None:
    with pytest.raises(ConfigError, match="api-key"):
        ModelServer(tiny_serve_config(tiny_bf16, host="0.0.0.0")).preflight()
    ModelServer(tiny_serve_config(tiny_bf16, host="0.0.0.0", api_key="k")).preflight()


def test_port_in_use(tiny_bf16: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = load_serve_config("tiny-cpu", model=tiny_bf16, port=port)
        with pytest.raises(ConfigError, match="already in use"):
            ModelServer(cfg).start()


def test_missing_serving_env(tiny_bf16: Path) -> None:
    cfg = tiny_serve_config(tiny_bf16, python="/nonexistent/python")
    with pytest.raises(ConfigError, match="serving environment"):
        ModelServer(cfg).start()


@pytest.mark.integration
def test_server_dying_during_startup_reports_log_tail(tiny_bf16: Path, tmp_path: Path) -> None:
    cfg = tiny_serve_config(tiny_bf16, extra_args=["--no-such-flag"], log_file=tmp_path / "v.log")
    server = ModelServer(cfg)
    with pytest.raises(ServerError, match="exited with code") as err:
        server.start()
    assert "no-such-flag" in str(err.value)  # vLLM's own complaint, from its log
    assert server.proc is None


@pytest.mark.integration
def test_startup_timeout_kills_the_whole_group(tiny_bf16: Path, tmp_path: Path) -> None:
    cfg = tiny_serve_config(tiny_bf16, startup_timeout_s=8, log_file=tmp_path / "v.log")
    server = ModelServer(cfg)
    pgids: list[int] = []
    orig = server.wait_ready

    def spy(on_log: Callable[[str], None] | None = None) -> None:
        assert server.proc is not None
        pgids.append(server.proc.pid)
        orig(on_log)

    server.wait_ready = spy  # type: ignore[method-assign]
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="did not answer within 8 s"):
        server.start()
    assert time.monotonic() - t0 < 60
    assert pgids and group_members(pgids[0]) == []  # no stray process left behind


def test_free_port_helper() -> None:
    assert 1024 < free_port() < 65536


def test_log_follower_returns_each_new_line_once(tmp_path: Path) -> None:
    log = tmp_path / "v.log"
    follow = LogFollower(log)
    assert follow.new_lines() == []  # no file yet
    log.write_bytes(b"INFO one\nINFO tw")
    assert follow.new_lines() == ["INFO one"]  # a partial line waits for its end
    with log.open("ab") as f:
        f.write(b"o\r\n\nLoading 50%\rLoading 100%\n\xff\n")
    assert follow.new_lines() == ["INFO two", "Loading 50%", "Loading 100%", "\ufffd"]
    assert follow.new_lines() == []


def test_fp32_weights_and_fp32_serving_get_warnings(tiny_fp32: Path, tiny_bf16: Path) -> None:
    from serving.checkpoint import open_hf_checkpoint

    assert weights_dtype(open_hf_checkpoint(tiny_fp32)) == "float32"
    assert weights_dtype(open_hf_checkpoint(tiny_bf16)) == "bfloat16"
    fp32 = tiny_serve_config(tiny_fp32)
    assert "astra-serve convert" in (dtype_warning(fp32, "float32") or "")
    assert dtype_warning(tiny_serve_config(tiny_bf16), "bfloat16") is None
    served = tiny_serve_config(tiny_bf16, dtype="float32")
    assert "doubles the memory" in (dtype_warning(served, "bfloat16") or "")


@pytest.mark.parametrize(
    ("asked", "bf16", "served", "said"),
    [
        ("auto", True, "bfloat16", None),
        ("auto", False, "float32", "dtype auto serves float32 on this CPU: no bf16 here"),
        ("bfloat16", False, "bfloat16", "runs emulated on this CPU"),
        ("bfloat16", True, "bfloat16", None),
        ("float32", False, "float32", None),
    ],
)
def test_auto_serves_bf16_only_where_the_cpu_computes_it(
    tiny_bf16: Path, monkeypatch: pytest.MonkeyPatch, asked, bf16, served, said
) -> None:
    """On a CPU without bf16 (an AVX2-only EPYC; an ISA-capped run) the CPU profiles' auto
    serves float32, saying why; the launch line carries the resolved dtype."""
    monkeypatch.setattr("serving.server.gpu_count", lambda: 0)
    monkeypatch.setattr("serving.server.bf16_missing", lambda: None if bf16 else "no bf16 here")
    cfg = tiny_serve_config(tiny_bf16, dtype=asked)
    dtype, note = served_dtype(cfg)
    assert dtype == served and (note == said if said is None else said in (note or ""))
    server = ModelServer(cfg)
    cmd = server.preflight()
    assert cmd[cmd.index("--dtype") + 1] == served
    assert (said is None) == (not any("CPU" in w for w in server.warnings)), server.warnings
    monkeypatch.setattr("serving.server.gpu_count", lambda: 1)  # on a GPU: the engine's auto
    assert served_dtype(cfg) == (asked, None)


def test_shell_command_round_trips_through_the_shell(
    tiny_bf16: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("serving.server.gpu_count", lambda: 0)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cfg = tiny_serve_config(tiny_bf16, python=sys.executable, served_model_name="a b'c")
    server = ModelServer(cfg)
    words = shlex.split(server.shell_command())
    assert words == ["VLLM_CPU_KVCACHE_SPACE=1", *server.preflight()]
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")  # the user's own setting is kept
    assert server.launch_env() == {}


@pytest.mark.integration
def test_stop_now_skips_the_grace_period(tmp_path: Path) -> None:
    server = ModelServer(tiny_serve_config(tmp_path))
    code = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"
    server.proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    pgid = server.proc.pid
    deadline = time.monotonic() + 10  # let it install its handler
    while time.monotonic() < deadline and not _ignores_sigint(pgid):
        time.sleep(0.05)
    server.stop_now.set()
    t0 = time.monotonic()
    server.stop(grace_s=30)
    assert time.monotonic() - t0 < 5 and group_members(pgid) == []


def _ignores_sigint(pid: int) -> bool:
    """Whether ``pid`` ignores SIGINT (its bit in SigIgn of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False
