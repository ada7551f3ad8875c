from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from astra_agent.config import check_writable, load_config, read_mapping, unknown_keys
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


# --------------------------------------------------------------------------- bad input files


@pytest.mark.parametrize(
    "name,data,needle",
    [
        ("c.json", b'{"name": "caf\xe9"}', r"not UTF-8 text \(byte 13, line 1"),
        ("c.yaml", b"name: x\nport: \xff\xfe\n", r"not UTF-8 text \(byte 14, line 2"),
        ("c.json", b"[" * 100_000, "not valid json"),  # RecursionError inside json
        ("c.json", b'{"port": ' + b"9" * 5000 + b"}", "not valid json"),  # int over 4300 digits
    ],
)
def test_undecodable_files_are_config_errors(
    tmp_path: Path, name: str, data: bytes, needle: str
) -> None:
    f = tmp_path / name
    f.write_bytes(data)
    with pytest.raises(ConfigError, match=needle):
        load_config(Cfg, f, environ={})


def test_a_directory_is_not_a_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        read_mapping(tmp_path)


def test_unknown_keys_named_with_did_you_mean() -> None:
    class Agent(BaseModel):
        model_config = ConfigDict(extra="allow", populate_by_name=True)
        model: Sampling = Sampling()
        tool_timeout_s: float = Field(1.0, alias="toolTimeout")

    data = {"modle": {}, "tooltimeout": 1, "toolTimeout": 2, "model": {}, "zzz": 1, "inputs": []}
    assert unknown_keys(data, Agent, allowed={"mcpServers", "inputs"}) == [
        "unknown key 'modle' (did you mean 'model'?)",
        "unknown key 'tooltimeout' (did you mean 'toolTimeout'?)",
        "unknown key 'zzz'",
    ]
    assert unknown_keys({"mcpServer": {}}, Agent, allowed={"mcpServers"}) == [
        "unknown key 'mcpServer' (did you mean 'mcpServers'?)"
    ]


def test_check_writable(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    assert check_writable(tmp_path / "new" / "deeper" / "runs.jsonl", "--save")
    assert check_writable(tmp_path / "afile", "--save")  # an existing file, appendable
    with pytest.raises(ConfigError, match=r"--save .* is a directory"):
        check_writable(tmp_path, "--save")
    with pytest.raises(ConfigError, match="afile is not a directory"):
        check_writable(tmp_path / "afile" / "runs.jsonl", "--save")
    with pytest.raises(ConfigError, match="afile is not a directory"):
        check_writable(tmp_path / "afile" / "out", "DST", kind="dir")
    assert list(tmp_path.iterdir()) == [tmp_path / "afile"]  # nothing created by checking


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("model: 5\nlr: [1,2\n", "line 3, column 1: expected ',' or ']'"),
        ("a: 1\n\tb: 2\n", "line 2, column 1: found character '\\t'"),
        ("a: 1\n  b: 2\n", "line 2, column 4: mapping values are not allowed here"),
        ("a: 'unclosed\n", "line 2, column 1: found unexpected end of stream"),
    ],
)
def test_a_yaml_error_is_one_line_with_its_position(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_mapping(p)
    message = str(err.value)
    assert "\n" not in message and "<unicode string>" not in message, message
    assert message.startswith(f"{p} is not valid yaml: ") and needle in message, message


def test_an_invalid_override_is_named_as_from_the_command_line(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("port: 9000\n")
    with pytest.raises(ConfigError) as err:
        load_config(Cfg, f, {"port": "x"}, environ={})
    assert "port: Input should be a valid integer" in str(err.value)
    assert "(from the command line)" in str(err.value)
    f.write_text("port: x\n")
    with pytest.raises(ConfigError) as err:
        load_config(Cfg, f, {"name": "n"}, environ={})
    assert "port:" in str(err.value) and "command line" not in str(err.value)
