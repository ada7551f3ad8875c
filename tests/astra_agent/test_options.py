"""One set of options for the four CLIs: the same flags, short flags, environment variables
and defaults everywhere, and `--version` on each."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
import typer
from pydantic import BaseModel, ConfigDict, Field
from typer.main import get_command
from typer.testing import CliRunner

from astra_agent.cli import app as agent_app
from astra_agent.config import load_config
from astra_agent.console import cli_errors
from astra_agent.model import ModelConfig
from astra_agent.options import (
    API_KEY_ENV,
    BASE_URL_ENV,
    MODEL_ENV,
    _flag_help,
    config_flags,
    model_overrides,
    parse_set,
    version,
)
from eval.cli import app as eval_app
from serving.cli import app as serve_app
from training.cli import app as train_app

APPS = {
    "astra-agent": agent_app,
    "astra-serve": serve_app,
    "astra-eval": eval_app,
    "astra-train": train_app,
}
SHARED = {  # flag: (short flag, environment variables)
    "--base-url": ("-u", BASE_URL_ENV),
    "--api-key": ("-k", API_KEY_ENV),
}
runner = CliRunner()


@pytest.mark.parametrize("name", APPS)
def test_every_cli_prints_its_version(name: str) -> None:
    result = runner.invoke(APPS[name], ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{name} {version()}"


def _commands(cmd: Any, path: str = "") -> list[tuple[str, Any]]:
    out = [(path, cmd)]
    for name, sub in getattr(cmd, "commands", {}).items():  # a group (typer vendors click)
        out += _commands(sub, f"{path} {name}".strip())
    return out


def _endpoint_commands() -> list[tuple[str, Any]]:
    found = []
    for name, app in APPS.items():
        for path, cmd in _commands(get_command(app)):
            if any("--base-url" in p.opts for p in cmd.params):
                found.append((f"{name} {path}".strip(), cmd))
    return found


def test_endpoint_options_are_the_same_everywhere() -> None:
    found = _endpoint_commands()
    names = {n for n, _ in found}
    assert {"astra-agent run", "astra-agent chat", "astra-serve check"} <= names, names
    for name, cmd in found:
        params = {opt: p for p in cmd.params for opt in p.opts}
        for flag, (short, env) in SHARED.items():
            p = params[flag]
            assert short in p.opts, (name, flag)
            assert p.envvar == env, (name, flag)
            assert p.default is None, (name, flag)  # the one default lives in ModelConfig
        model = params["--model"]
        assert "-m" in model.opts and model.envvar == MODEL_ENV, name


def test_model_overrides_leave_unset_flags_to_the_config() -> None:
    assert model_overrides(None, "m", None, 0.2, max_tokens=None) == {
        "model": "m",
        "temperature": 0.2,
    }
    cfg = ModelConfig(**model_overrides(base_url="http://h/v1"))
    assert (cfg.base_url, cfg.temperature, cfg.top_p, cfg.top_k) == ("http://h/v1", 0.6, 0.95, 20)


def test_common_callback_gives_verbose_and_version() -> None:
    from astra_agent.options import common_callback

    app = typer.Typer()
    common_callback(app, "astra-x")

    @app.command()
    def hello() -> None:
        typer.echo("hi")

    @app.command()
    def bye() -> None:
        typer.echo("bye")

    assert runner.invoke(app, ["--version"]).stdout.strip() == f"astra-x {version()}"
    assert runner.invoke(app, ["-v", "hello"]).stdout.strip() == "hi"


def test_errors_print_brackets_literally() -> None:
    from astra_agent.console import cli_errors
    from astra_agent.errors import ConfigError
    from astra_agent.options import common_callback

    app = typer.Typer()
    common_callback(app, "astra-x")

    @app.command()
    @cli_errors
    def boom() -> None:
        raise ConfigError("no checkpoint at /data/[v1]/ckpt", hint="see [bold]docs[/bold]")

    result = runner.invoke(app, ["boom"])
    assert result.exit_code == 2
    assert "error: no checkpoint at /data/[v1]/ckpt" in result.stderr  # not eaten as markup
    assert "hint: see [bold]docs[/bold]" in result.stderr


class _Section(BaseModel):
    device: Literal["cpu", "cuda"] = "cuda"
    threads: int | None = None


class _Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    output_dir: Path = Field(description="run directory")
    steps: int = Field(100, ge=1, description="optimizer steps")
    train_files: list[Path] = Field(default_factory=list, description="inputs (repeatable)")
    backend: Literal["trl", "verl"] = "trl"
    resume: bool = Field(True, description="continue where it stopped")
    section: _Section = Field(default_factory=_Section)


def _recipe_app(seen: list[_Recipe]) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @cli_errors
    @config_flags(
        _Recipe, ["output_dir", "steps", "train_files", "backend", "resume"],
        flags={"train_files": "train_file"},
    )  # fmt: skip
    def go(config: Annotated[Path | None, typer.Option()] = None, *, overrides: Any) -> None:
        seen.append(load_config(_Recipe, config, overrides, environ={}))

    return app


def test_config_flags_are_the_models_fields_and_set_reaches_the_rest(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("output_dir: out\nsteps: 7\nsection: {threads: 3}\n")
    seen: list[_Recipe] = []
    app = _recipe_app(seen)
    # the file alone; then a section key by --set (the file's other section key stays), a
    # flag over the file, a repeatable flag, a bool flag, and a flag over --set
    args = ["--config", str(recipe)]
    assert runner.invoke(app, args).exit_code == 0
    more = [
        "--set", "section.device=cpu", "--steps", "9", "--set", "steps=2",
        "--train-file", "a.parquet", "--train-file", "b ✓.parquet", "--no-resume",
    ]  # fmt: skip
    result = runner.invoke(app, args + more)
    assert result.exit_code == 0, result.output
    first, second = seen
    assert (first.steps, first.section, first.resume) == (7, _Section(threads=3), True)
    assert second.steps == 9 and second.section == _Section(device="cpu", threads=3)
    assert second.train_files == [Path("a.parquet"), Path("b ✓.parquet")]
    assert second.resume is False and second.output_dir == Path("out")
    helptext = runner.invoke(app, ["--help"], terminal_width=200).output
    assert "Optimizer steps (default 100)" in helptext and "--no-resume" in helptext
    assert "[trl|verl]" in helptext or "<trl|verl>" in helptext


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "steps"], "expected KEY=VALUE"),
        (["--set", "=3"], "expected KEY=VALUE"),
        (["--set", "section..device=cpu"], "expected KEY=VALUE"),
        (["--set", "steps=[1"], "the value is not YAML"),
        (["--set", "steps=" + "[" * 5000], "nested too deeply"),
        (["--set", "steps=3", "--set", "steps.x=1"], "steps is set to a value above"),
        (["--set", "stepz=3"], "stepz"),  # the model's own check: an unknown key
        (["--set", "section.device=tpu"], "section.device"),
        (["--set", "steps=0"], "steps"),
        (["--steps", "0"], "steps"),
    ],
)
def test_bad_set_values_are_one_error_and_exit_2(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("output_dir: out\n")
    seen: list[_Recipe] = []
    result = runner.invoke(_recipe_app(seen), ["--config", str(recipe), *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output and not seen
    assert "Traceback" not in result.output


def test_parse_set_reads_yaml_values() -> None:
    got = parse_set(["a.b=0.5", "a.c=true", "d=[x, y]", "e=", "f=ünï=code", "g={k: 1}"])
    assert got == {
        "a": {"b": 0.5, "c": True},
        "d": ["x", "y"],
        "e": "",
        "f": "ünï=code",
        "g": {"k": 1},
    }


class _Empties(BaseModel):
    domain: str = Field("", description="domain of the servers")
    tags: dict[str, int] = Field(default_factory=dict, description="tags by name")
    name: str = Field("x", description="a name")


def test_an_empty_default_is_not_shown_as_one() -> None:
    app = typer.Typer()

    @app.command()
    @config_flags(_Empties, ["domain", "name"])
    def go(overrides: Any) -> None:
        pass

    helptext = runner.invoke(app, ["--help"], terminal_width=200).output
    assert "Domain of the servers" in helptext and "(default )" not in helptext
    assert "A name (default x)" in helptext
    assert _flag_help(_Empties.model_fields["tags"], None) == "Tags by name"


def test_a_section_field_is_a_flag_and_set_reaches_any_section_key(tmp_path: Path) -> None:
    seen: list[_Recipe] = []
    app = typer.Typer()

    @app.command()
    @cli_errors
    @config_flags(_Recipe, ["output_dir", "section.threads"])
    def go(*, overrides: Any) -> None:
        seen.append(load_config(_Recipe, None, overrides, environ={}))

    # a flag of a section beside --set of the same section; a flag over a --set that made the
    # section a plain value
    args = ["--output-dir", "o", "--threads", "4", "--set", "section.device=cpu"]
    assert runner.invoke(app, args).exit_code == 0
    assert seen[-1].section == _Section(device="cpu", threads=4)
    result = runner.invoke(app, ["--output-dir", "o", "--set", "section=3", "--threads", "2"])
    assert result.exit_code == 0, result.output
    assert seen[-1].section == _Section(threads=2)
    helptext = runner.invoke(app, ["--help"], terminal_width=200).output
    assert "--threads" in helptext and "--section" not in helptext


def test_eval_flags_reach_their_config_sections(tmp_path: Path, monkeypatch: Any) -> None:
    """`astra-eval arenas` and `general`: a flag of a section (limits.max_steps,
    model.max_tokens) lands there beside the shared endpoint flags; --set reaches the rest."""
    import eval.arenas.runner as arenas_runner

    seen: list[Any] = []

    async def fake_evaluate(cfg: Any, hook: Any) -> Any:
        seen.append(cfg)
        raise typer.Exit(0)

    monkeypatch.setattr(arenas_runner, "evaluate_arenas", fake_evaluate)
    data = tmp_path / "tasks.jsonl"
    data.write_text("")
    args = [
        "arenas", "--data", str(data), "--out", str(tmp_path / "o"), "--max-steps", "7",
        "--temperature", "0", "--set", "model.top_p=0.5", "--set", "sandbox.processes=8",
    ]  # fmt: skip
    result = runner.invoke(eval_app, args)
    assert result.exit_code == 0, result.output
    (cfg,) = seen
    assert cfg.limits.max_steps == 7 and cfg.limits.tool_timeout_s == 120.0
    assert (cfg.model.temperature, cfg.model.top_p) == (0.0, 0.5)
    assert cfg.sandbox.processes == 8 and cfg.concurrency == 4
    result = runner.invoke(eval_app, ["arenas", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--data" in result.output


class _Open(BaseModel):
    """A config that keeps keys it does not know (as the agent's keeps `mcpServers`)."""

    model_config = ConfigDict(extra="allow")

    steps: int = 1
    section: _Section = Field(default_factory=_Section)
    extra: dict[str, Any] = Field(default_factory=dict)


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ("stepz=2", "the config has no key 'stepz' (did you mean 'steps'?)"),
        ("section.thread=2", "section has no key 'thread' (did you mean 'threads'?)"),
        ("section.threads.x=2", None),  # below a plain field: the model's own check
        ("extra.anything.goes=1", None),  # inside a mapping: any key
    ],
)
def test_set_refuses_a_key_the_model_lacks_even_where_it_keeps_unknown_keys(
    item: str, needle: str | None
) -> None:
    seen: list[_Open] = []
    app = typer.Typer()

    @app.command()
    @cli_errors
    @config_flags(_Open, ["steps"])
    def go(*, overrides: Any) -> None:
        seen.append(load_config(_Open, None, overrides, environ={}))

    result = runner.invoke(app, ["--set", item])
    if needle is None:
        assert f"--set {item.split('=')[0]}:" not in result.output
        return
    assert result.exit_code == 2 and not seen
    assert f"--set {item.split('=')[0]}: {needle}" in " ".join(result.output.split())


class _Aliased(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    tool_timeout_s: float = Field(120.0, alias="toolTimeout", description="seconds per call")


@pytest.mark.parametrize(
    "args", [["--tool-timeout", "10"], ["--set", "toolTimeout=10"], ["--set", "tool_timeout_s=10"]]
)
def test_a_flag_or_set_wins_over_the_files_aliased_key(tmp_path: Path, args: list[str]) -> None:
    """A file writes `toolTimeout`; the flag and --set (by either name) must land on that same
    key, or the file's value would win silently (pydantic takes the alias first)."""
    recipe = tmp_path / "c.yaml"
    recipe.write_text("toolTimeout: 30\n")
    seen: list[_Aliased] = []
    app = typer.Typer()

    @app.command()
    @cli_errors
    @config_flags(_Aliased, ["tool_timeout_s"], flags={"tool_timeout_s": "tool_timeout"})
    def go(*, overrides: Any) -> None:
        seen.append(load_config(_Aliased, recipe, overrides, environ={}))

    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen[0].tool_timeout_s == 10.0
