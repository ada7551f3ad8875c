"""The launcher: profiles, the vLLM command, and failures before and during start-up."""

import socket
import time
from pathlib import Path

import pytest

from astra_agent.errors import CheckpointError, ConfigError, ServerError
from serving.server import (
    ServeConfig,
    VLLMServer,
    group_members,
    load_serve_config,
    profile_names,
    vllm_command,
)
from tests.conftest import free_port, tiny_serve_config


@pytest.mark.parametrize("name", profile_names())
def test_every_shipped_profile_is_valid(name: str) -> None:
    cfg = load_serve_config(name, model=Path("/m"))
    assert isinstance(cfg, ServeConfig)
    assert cfg.generation == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
    if name.startswith("astra-"):
        assert cfg.tensor_parallel_size == "auto" and cfg.max_model_len >= 32768
        assert cfg.served_model_name.startswith("ASTRA-")


def test_profiles_exist() -> None:
    assert {"tiny-cpu", "astra-14b", "astra-32b"} <= set(profile_names())


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


def test_env_overrides_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASTRA_SERVE_PORT", "9123")
    assert load_serve_config("tiny-cpu").port == 9123


def test_model_dir_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        VLLMServer(tiny_serve_config(tmp_path)).start()


def test_api_key_required_off_loopback(tiny_bf16: Path) -> None:
    with pytest.raises(ConfigError, match="api-key"):
        VLLMServer(tiny_serve_config(tiny_bf16, host="0.0.0.0")).preflight()
    VLLMServer(tiny_serve_config(tiny_bf16, host="0.0.0.0", api_key="k")).preflight()


def test_port_in_use(tiny_bf16: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = load_serve_config("tiny-cpu", model=tiny_bf16, port=port)
        with pytest.raises(ConfigError, match="already in use"):
            VLLMServer(cfg).start()


def test_missing_serving_env(tiny_bf16: Path) -> None:
    cfg = tiny_serve_config(tiny_bf16, python="/nonexistent/python")
    with pytest.raises(ConfigError, match="serving environment"):
        VLLMServer(cfg).start()


@pytest.mark.integration
def test_server_dying_during_startup_reports_log_tail(tiny_bf16: Path, tmp_path: Path) -> None:
    cfg = tiny_serve_config(tiny_bf16, extra_args=["--no-such-flag"], log_file=tmp_path / "v.log")
    server = VLLMServer(cfg)
    with pytest.raises(ServerError, match="exited with code") as err:
        server.start()
    assert "no-such-flag" in str(err.value)  # vLLM's own complaint, from its log
    assert server.proc is None


@pytest.mark.integration
def test_startup_timeout_kills_the_whole_group(tiny_bf16: Path, tmp_path: Path) -> None:
    cfg = tiny_serve_config(tiny_bf16, startup_timeout_s=8, log_file=tmp_path / "v.log")
    server = VLLMServer(cfg)
    pgids: list[int] = []
    orig = server.wait_ready

    def spy() -> None:
        assert server.proc is not None
        pgids.append(server.proc.pid)
        orig()

    server.wait_ready = spy  # type: ignore[method-assign]
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="did not answer within 8 s"):
        server.start()
    assert time.monotonic() - t0 < 60
    assert pgids and group_members(pgids[0]) == []  # no stray process left behind


def test_free_port_helper() -> None:
    assert 1024 < free_port() < 65536
