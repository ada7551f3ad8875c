"""``astra-train synth``'s options: generated from the stage configs (defaults and help from the
models, ``--set`` for every other key, ASTRA_SYNTH_<STAGE>_* variables), the commands in pipeline
order, each with an example, and a bad value refused in one line that names where it came from."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from training.cli import app as train_app
from training.synth.cli import synth_app
from training.synth.envs.build import ArenaConfig
from training.synth.envs.code import CheckLimits, EnvCodeConfig
from training.synth.tools.chains import ChainConfig
from training.synth.tools.judge import JudgeConfig
from training.synth.tools.tasks import TasksConfig

PIPELINE = ["pool", "graph", "chains", "confirm", "check-chains", "tasks", "interact", "judge",
            "decompose", "env-code", "arenas"]  # fmt: skip
runner = CliRunner()


def _commands() -> dict[str, Any]:
    return dict(get_command(synth_app).commands)  # type: ignore[attr-defined]


def _option(command: str, flag: str) -> Any:
    (param,) = [p for p in _commands()[command].params if flag in p.opts]
    return param


def test_commands_in_pipeline_order_each_with_an_example() -> None:
    assert list(_commands()) == PIPELINE
    listing = runner.invoke(train_app, ["synth", "--help"], env={"COLUMNS": "200"}).output
    at = [listing.index(f"│ {name} ") for name in PIPELINE]
    assert at == sorted(at), listing
    for name in PIPELINE:
        got = runner.invoke(train_app, ["synth", name, "--help"], env={"COLUMNS": "200"})
        assert got.exit_code == 0 and f"Example: astra-train synth {name} " in got.output


@pytest.mark.parametrize(
    ("command", "flag", "model", "field"),
    [
        ("tasks", "--dedup-threshold", TasksConfig, "dedup_threshold"),
        ("tasks", "--concurrency", TasksConfig, "concurrency"),
        ("judge", "--min-score", JudgeConfig, "min_score"),
        ("env-code", "--call-timeout", CheckLimits, "wall_seconds_per_call"),
        ("env-code", "--max-retries", EnvCodeConfig, "max_retries"),
        ("arenas", "--concurrency", ArenaConfig, "concurrency"),
        ("chains", "--count", ChainConfig, "count"),
    ],
)
def test_a_flags_default_and_help_are_its_models(
    command: str, flag: str, model: Any, field: str
) -> None:
    option = _option(command, flag)
    assert option.default is None  # unset: the config (or the model) decides
    assert option.help.endswith(f"(default {model.model_fields[field].default})"), option.help


def test_no_help_restates_a_bare_default() -> None:
    """A default is shown once, from the model ("(default 3)"), never restated as "(3)"."""
    for name, command in _commands().items():
        for param in command.params:
            text = getattr(param, "help", None) or ""
            assert not re.search(r"\(\d[\d.]*\)", text), (name, param.name, text)


def _graph(tmp_path: Path) -> Path:
    """A pool and graph of two tools, ``list_apples`` → ``get_apple``."""
    tools = [
        {"name": "list_apples", "description": "List apples.",
         "inputSchema": {"type": "object", "properties": {}}},
        {"name": "get_apple", "description": "Get one apple.",
         "inputSchema": {"type": "object", "properties": {"apple_id": {"type": "string"}},
                         "required": ["apple_id"]}},
    ]  # fmt: skip
    servers = tmp_path / "servers.jsonl"
    servers.write_text(json.dumps({"name": "shop", "domain": "shop", "tools": tools}) + "\n")
    pool = ["pool", "--servers", str(servers), "--out", str(tmp_path / "pool")]
    assert runner.invoke(synth_app, pool).exit_code == 0
    graph = ["graph", "--pool", str(tmp_path / "pool"), "--out", str(tmp_path / "graph")]
    assert runner.invoke(synth_app, graph).exit_code == 0
    return tmp_path / "graph"


def test_set_and_the_environment_reach_keys_without_a_flag(tmp_path: Path) -> None:
    graph = _graph(tmp_path)
    args = ["chains", "--graph", str(graph), "--count", "1", "--out", str(tmp_path / "c")]
    got = runner.invoke(synth_app, [*args, "--set", "max_attempts=7", "--set", "seed=4"])
    assert got.exit_code == 0, got.output
    params = json.loads((tmp_path / "c" / "stats.json").read_text())["params"]
    assert params["max_attempts"] == 7 and params["seed"] == 4 and params["count"] == 1
    # the flag wins over --set and over ASTRA_SYNTH_CHAINS_*; the variable over the default
    env = {"ASTRA_SYNTH_CHAINS_SEED": "9", "ASTRA_SYNTH_CHAINS_MAX_LENGTH": "3"}
    more = ["--overwrite", "--set", "count=5", "--seed", "2"]
    assert runner.invoke(synth_app, [*args, *more], env=env).exit_code == 0
    params = json.loads((tmp_path / "c" / "stats.json").read_text())["params"]
    assert (params["count"], params["seed"], params["max_length"]) == (1, 2, 3)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--set", "feedback_chars=10"], "--set feedback_chars=10: Input should be greater than"),
        (["--set", "model.top_p=5"], "--set model.top_p=5: Input should be less than or equal"),
        (["--set", "teacher.max_atempts=2"], "did you mean 'max_attempts'?"),
        (["--set", "sandboxes"], "--set 'sandboxes': expected KEY=VALUE"),
        (["--max-attempts", "0", "--set", "teacher.max_attempts=5"], "--max-attempts 0:"),
        (["--merge", "all"], "'all' is not one of"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_flag_or_set(
    tmp_path: Path, extra: list[str], says: str
) -> None:
    decompositions = tmp_path / "d.jsonl"
    decompositions.write_text("{}\n")
    args = ["env-code", "--decompositions", str(decompositions), "--out", str(tmp_path / "o")]
    got = runner.invoke(synth_app, [*args, *extra], env={"COLUMNS": "300"})
    assert got.exit_code == 2 and says in got.output, got.output
    assert not (tmp_path / "o").exists()


def test_a_check_across_flags_is_one_line(tmp_path: Path) -> None:
    graph = _graph(tmp_path)
    args = ["chains", "--graph", str(graph), "--out", str(tmp_path / "c"), "--min-length", "4",
            "--max-length", "3"]  # fmt: skip
    got = runner.invoke(synth_app, args)
    assert got.exit_code == 2, got.output
    assert got.output.strip() == "error: min_length is larger than max_length"


def test_every_example_parses_with_the_commands_own_options() -> None:
    """Each --help example names only options its command has, with values of their types."""
    for name, command in _commands().items():
        examples = re.findall(r"Example: astra-train synth (.+?)(?:\n\s*\n|&&|$)",
                              command.help, flags=re.S)  # fmt: skip
        assert examples, name
        for example in examples:
            head, *args = example.split()
            assert head == name, example
            ctx = command.make_context(name, args)  # a bad option or value raises here
            assert ctx.params["out"] is not None, example
