from pathlib import Path

import pytest
from pydantic import BaseModel

from astra_agent.config import load_config
from astra_agent.errors import AstraError, ConfigError, ServerError


class Sampling(BaseModel):
    temperature: float = 0.6
    top_p: float = 0.95


class Cfg(BaseModel):
    name: str = "x"
    port: int = 8000
    sampling: Sampling = Sampling()


def test_precedence_defaults_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("name: from-file\nport: 1\nsampling:\n  top_p: 0.5\n")
    env = {"ASTRA_PORT": "2", "ASTRA_SAMPLING__TEMPERATURE": "0.1", "OTHER": "x"}
    cfg = load_config(Cfg, f, {"port": 3, "name": None}, environ=env)
    assert cfg.name == "from-file"  # a None flag does not override
    assert cfg.port == 3
    assert cfg.sampling.temperature == 0.1
    assert cfg.sampling.top_p == 0.5


def test_json_file_and_defaults(tmp_path: Path) -> None:
    f = tmp_path / "c.json"
    f.write_text('{"port": 9}')
    assert load_config(Cfg, f, environ={}).port == 9
    assert load_config(Cfg, environ={}).port == 8000


@pytest.mark.parametrize(
    "text,needle",
    [("port: [1", "not valid"), ("- 1\n- 2\n", "mapping"), ("port: notanint\n", "port")],
)
def test_bad_files_give_config_errors(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_config(Cfg, f, environ={})


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(Cfg, "/nonexistent/c.yaml", environ={})


def test_error_exit_codes() -> None:
    assert ConfigError("x").exit_code == 2
    assert ServerError("x").exit_code == 1
    assert isinstance(ServerError("x"), AstraError)
    assert "hint: do y" in str(ConfigError("x", hint="do y"))
